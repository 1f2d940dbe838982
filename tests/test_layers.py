"""The layer order of docs/architecture.md ("Layers"), enforced: import-linter's contracts in
pyproject.toml for the packages, and the same rule for the scripts beside them (the DAG files
wire `flows` only). A copy of the tree with one upward import added proves the check can fail."""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ccs_testing import REPO

#: the folders that hold the packages: the core (ccselect/) and the ten it serves as ccselect.<folder>
#: through its links (one import namespace, issue 63)
PACKAGES = ("ccselect", "features", "jobs", "models", "distill", "export", "sim", "evaluation", "flows", "app", "topology")
SUBPACKAGES = PACKAGES[1:]
LINT = str(Path(sys.executable).parent / "lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([LINT, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def _package(module: str) -> str:
    """Which of our packages (or "ccselect", the core) an absolute import names; else its top name."""
    parts = module.split(".")
    if parts[0] == "ccselect":
        return parts[1] if len(parts) > 1 and parts[1] in SUBPACKAGES else "ccselect"
    return parts[0]


def _imported(node: ast.AST) -> list[str]:
    """The absolute module names an import statement names (`from ccselect import jobs` names ccselect.jobs)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        if node.module == "ccselect":
            return [f"ccselect.{a.name}" for a in node.names]
        return [node.module]
    return []


def _own_imports(path: Path) -> set[str]:
    """Which of our packages a file imports, anywhere in it."""
    return {_package(n) for node in ast.walk(ast.parse(path.read_text())) for n in _imported(node)
            if _package(n) in PACKAGES}


def test_the_packages_keep_the_layer_contracts():
    r = _lint(REPO)
    assert r.returncode == 0, f"lint-imports found a broken contract:\n{r.stdout}\n{r.stderr}"
    assert "0 broken" in r.stdout, r.stdout


def test_dag_files_import_only_the_flows_and_the_core():
    for dag in sorted((REPO / "dags").glob("*.py")):
        assert _own_imports(dag) <= {"flows", "ccselect"}, f"{dag.name} imports {_own_imports(dag)}"


def test_every_import_of_ours_goes_through_the_ccselect_namespace():
    """Nothing imports `jobs` or `app` at the top level (an analyst's own `models` would shadow it):
    the packages, the DAGs, the benches, the tests and the notebooks all say `ccselect.<package>`."""
    bad = []
    paths = [p for top in (*PACKAGES, "dags", "bench", "tests") for p in sorted((REPO / top).rglob("*.py"))]
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            bad += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in _imported(node)
                    if n.split(".")[0] in SUBPACKAGES]
    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] == "code":
                # IPython's magics (`%matplotlib`, `!cmd`) commented out; a `%` inside code stays
                src = "".join("#" + line if line.lstrip().startswith(("%", "!")) else line for line in cell["source"])
                bad += [f"{nb.name}: {n}" for node in ast.walk(ast.parse(src)) for n in _imported(node)
                        if n.split(".")[0] in SUBPACKAGES]
    assert not bad, "imports outside the ccselect namespace:\n" + "\n".join(bad)
    links = {p.name: os.readlink(p) for p in (REPO / "ccselect").iterdir() if p.is_symlink()}
    assert links == {pkg: f"../{pkg}" for pkg in SUBPACKAGES}, links


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory):
    """The core and the packages its links serve, and pyproject.toml, copied (Python files only,
    the links followed) so the copy can be broken."""
    root = tmp_path_factory.mktemp("layers")
    shutil.copytree(REPO / "ccselect", root / "ccselect", ignore=lambda d, names: [
        n for n in names if not (n.endswith(".py") or (Path(d) / n).is_dir()) or n == "__pycache__"])
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


@pytest.mark.parametrize("module, upward", [
    ("ccselect/hours.py", "from ccselect.app import run"),                  # the core reaching the roof
    ("ccselect/flows/pipeline.py", "from ccselect.app import results"),     # the flows reaching the front door
    ("ccselect/export/delivery/rollout.py", "from ccselect.topology import edges"),  # the product reaching the launcher
    ("ccselect/topology/spark.py", "from ccselect.app import results"),     # the launcher reaching the front door
    ("ccselect/jobs/parse.py", "from ccselect.models import registry"),     # ETL reaching the model
    ("ccselect/sim/physics.py", "from ccselect.features import labels"),    # the simulator reaching the product
    ("ccselect/export/artifact/signing.py", "from ccselect.export.delivery import store"),  # inside export
    ("ccselect/models/infer_core.py", "from ccselect.models import infer_arrow"),  # the engines' shared computation
    ("ccselect/jobs/autoplex_arrow.py", "from ccselect.jobs import autoplex"),  # an engine reaching the other
    ("ccselect/jobs/autoplex_core.py", "from ccselect.jobs.autoplex_arrow import Groups"),  # AutoPlex's shared computation
    ("ccselect/models/train.py", "def _late():\n    from ccselect.evaluation import emulate"),  # inside a function too
    ("ccselect/newcore.py", "from ccselect import config"),                 # a core module not given its layer
])
def test_an_upward_import_breaks_the_contract(tree_copy, module, upward):
    path = tree_copy / module
    original = path.read_text() if path.exists() else None
    assert _lint(tree_copy).returncode == 0, "the unbroken copy must pass first"
    try:
        path.write_text((original or "") + "\n\n" + upward + "\n")
        r = _lint(tree_copy)
    finally:
        path.write_text(original) if original is not None else path.unlink()
    assert r.returncode != 0, f"adding {upward!r} to {module} was not caught:\n{r.stdout}"
    assert "BROKEN" in r.stdout


#: libraries heavy enough to import only where used (docs/architecture.md, "Layers")
HEAVY = {"torch", "pyspark", "shap", "mlflow", "airflow", "pendulum", "sklearn", "matplotlib", "duckdb",
         "polars", "delta", "deltalake", "skops", "fsspec", "nbclient", "nbformat", "boto3", "botocore",
         "psycopg2"}
NOTE = "# Imported inside the functions that use them"


def _function_level_imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    out = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                out += [(node.lineno, _package(n)) for n in _imported(node)]
    return out


def test_imports_sit_at_the_top_except_heavy_libraries_said_once_per_module():
    """Inside a function only a heavy library is imported (and, in the entry points — app/, flows/,
    topology/, dags/, bench/ — our modules, which load them); a module that does so says it once."""
    bad = []
    for top in (*PACKAGES, "dags", "bench"):
        for path in sorted((REPO / top).rglob("*.py")):
            inner = _function_level_imports(path)
            allowed = HEAVY | (set(PACKAGES) | {"bench"} if top in ("app", "flows", "topology", "dags", "bench") else set())
            bad += [f"{path.relative_to(REPO)}:{line} imports {mod} inside a function"
                    for line, mod in inner if mod not in allowed]
            if inner and NOTE not in path.read_text():
                bad.append(f"{path.relative_to(REPO)}: function-level imports without the module's note")
    assert not bad, "\n".join(bad)


def test_a_configuration_parameter_says_its_type():
    """Every function of the packages that takes the project's configuration (`cfg`, `config`)
    annotates it (`cfg: Config`, not `Any`; issue 63), so a reader and a type checker know what arrives."""
    bad = []
    for top in PACKAGES:
        for path in sorted((REPO / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = node.args
                    bad += [f"{path.relative_to(REPO)}:{node.lineno} {node.name}({p.arg})"
                            for p in a.posonlyargs + a.args + a.kwonlyargs
                            if p.arg in ("cfg", "config") and (p.annotation is None or (
                                isinstance(p.annotation, ast.Name) and p.annotation.id == "Any"))]
    assert not bad, "untyped configuration parameters:\n" + "\n".join(bad)


def test_table_names_are_spelled_once_in_the_lake_module():
    """A table's name (`silver.connections`, `bronze.<stream>`) is written once, as a constant of
    ccselect/lake.py (issue 63); the packages, the DAGs and the benches use the constant."""
    from ccselect import lake
    names = {v for k, v in vars(lake).items() if k.isupper() and isinstance(v, str) and "." in v}
    assert {"silver.connections", "gold.predictions", "bronze.quarantine"} <= names
    bad = []
    for top in (*PACKAGES, "dags", "bench"):
        for path in sorted((REPO / top).rglob("*.py")):
            if path == REPO / "ccselect" / "lake.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in names:
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value!r}")
                elif (isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant)
                      and str(node.values[0].value) in ("bronze.", "silver.", "gold.")):
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno} f{node.values[0].value!r}...")
    assert not bad, "table names spelled outside ccselect/lake.py:\n" + "\n".join(bad)


#: parameter pairs that carry a time range: a job takes a `ccselect.hours.Window` instead (issue 63)
TIME_PAIRS = (("lo", "hi"), ("start_ms", "periods"), ("start_ms", "end_ms"), ("start_hour", "end_hour"),
              ("hour_lo", "hour_hi"), ("start", "periods"))
#: a time range as one parameter holding two hour keys (`hours: tuple[str, str]`) is a pair too
HOUR_PAIR = "tuple[str, str]"
HOUR_PAIR_NAMES = ("hours", "window", "hour_range")
#: where the pairs are the point: Window's own constructors and the hour helpers it is built on
TIME_PAIR_HOME = ("ccselect/hours.py",)
#: functions not yet converted (path, name): this list only shrinks (the test fails on a stale entry)
TIME_PAIRS_LEFT: set[tuple[str, str]] = set()


def _time_pair_functions(root: Path, tops) -> list[tuple[str, int, str, tuple[str, str]]]:
    out = []
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            rel = str(path.relative_to(root))
            if rel in TIME_PAIR_HOME:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = node.args
                    names = {p.arg for p in a.posonlyargs + a.args + a.kwonlyargs}
                    pairs = [pair for pair in TIME_PAIRS if set(pair) <= names]
                    pairs += [(p.arg,) for p in a.posonlyargs + a.args + a.kwonlyargs
                              if p.arg in HOUR_PAIR_NAMES and p.annotation is not None
                              and ast.unparse(p.annotation).startswith(HOUR_PAIR)]
                    out += [(rel, node.lineno, node.name, pairs[0])] if pairs else []   # a function once
    return out


def test_a_time_range_arrives_as_one_window():
    """No function of the packages takes a time range as two parameters (`lo, hi`, `start_ms,
    periods`, ...): every job takes one `ccselect.hours.Window` (issue 63)."""
    found = _time_pair_functions(REPO, PACKAGES)
    bad = [f"{rel}:{line} {name}({', '.join(pair)})" for rel, line, name, pair in found
           if (rel, name) not in TIME_PAIRS_LEFT]
    stale = TIME_PAIRS_LEFT - {(rel, name) for rel, _, name, _ in found}
    assert not bad, "time ranges as parameter pairs (take a ccselect.hours.Window):\n" + "\n".join(bad)
    assert not stale, f"converted, drop from TIME_PAIRS_LEFT: {sorted(stale)}"


@pytest.mark.parametrize("planted", [
    "def run(spark, cfg, lo: str, hi: str):\n    pass\n",
    "def later(cfg, *, start_ms: int, periods: int = 1):\n    pass\n",
    "class Job:\n    def extract(self, start_hour, end_hour):\n        pass\n",
    "def run(spark, cfg, input_dir, hours: tuple[str, str] | None = None):\n    pass\n",
])
def test_the_window_guard_finds_a_planted_pair(tmp_path, planted):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "clean.py").write_text("def run(spark, cfg, window):\n    pass\n")
    assert _time_pair_functions(tmp_path, ["jobs"]) == []
    (tmp_path / "jobs" / "planted.py").write_text(planted)
    found = _time_pair_functions(tmp_path, ["jobs"])
    assert [rel for rel, *_ in found] == ["jobs/planted.py"]
