"""One configuration for every entry point: `infra/conf/<env>.yaml`, chosen by `--config` or
`CCS_CONFIG`, defaulting to the embedded `infra/conf/local.yaml`.

Values may refer to other top-level scalars as `${name}` (e.g. `${data_root}`); relative local
paths are resolved against the project root so that Airflow tasks, notebooks and the CLI agree
whatever their working directory.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from ccselect.settings import Settings, from_raw

_VAR = re.compile(r"\$\{([a-zA-Z_][a-zA-Z0-9_]*)\}")
_PATH_KEYS = {"data_root", "root", "artifact_root", "home", "out", "raw_dir", "fleet", "metrics_dir"}


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load that refuses a key given twice in one mapping (PyYAML keeps the last one
    silently, so a duplicated section would hide an edit to the first)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ValueError(f"duplicate key {key!r} in the configuration (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def project_root() -> Path:
    """CCS_HOME if set, else the checkout this module lives in."""
    env = os.environ.get("CCS_HOME")
    if env:
        return Path(env).resolve()
    return Path(__file__).resolve().parents[1]


def default_config_path() -> Path:
    return Path(os.environ.get("CCS_CONFIG") or project_root() / "infra" / "conf" / "local.yaml")


def _is_remote(value: str) -> bool:
    return "://" in value


def _interpolate(node: Any, scalars: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        return {k: _interpolate(v, scalars) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, scalars) for v in node]
    if isinstance(node, str):
        def sub(m: re.Match[str]) -> str:
            if m.group(1) not in scalars:
                raise KeyError(f"config refers to unknown ${{{m.group(1)}}}")
            return str(scalars[m.group(1)])
        return _VAR.sub(sub, node)
    return node


def _resolve_paths(node: Any, root: Path, key: str = "") -> Any:
    if isinstance(node, dict):
        return {k: _resolve_paths(v, root, k) for k, v in node.items()}
    if isinstance(node, str) and key in _PATH_KEYS and not _is_remote(node):
        return str((root / node).resolve()) if not os.path.isabs(node) else node
    if isinstance(node, str) and node.startswith("sqlite:///") and not node.startswith("sqlite:////"):
        return "sqlite:///" + str((root / node[len("sqlite:///"):]).resolve())
    return node


@dataclass(frozen=True)
class Config:
    """The parsed file (`raw`, interpolated and with paths resolved) and its typed settings:
    code reads `cfg.settings.<section>` (ccselect/settings.py), never raw keys."""

    path: Path
    raw: dict[str, Any] = field(repr=False)

    @property
    def env(self) -> str:
        return self.raw.get("env", "local")

    @property
    def data_root(self) -> str:
        return self.raw["data_root"]

    @cached_property
    def settings(self) -> Settings:
        return from_raw(self.raw, self.path)


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    p = Path(path) if path else default_config_path()
    if not p.exists():
        raise FileNotFoundError(f"configuration file not found: {p}")
    raw = yaml.load(p.read_text(), Loader=_UniqueKeyLoader) or {}
    if "data_root" not in raw:
        raise ValueError(f"{p}: 'data_root' is required")
    if os.environ.get("CCS_DATA_ROOT"):
        raw["data_root"] = os.environ["CCS_DATA_ROOT"]
    root = project_root()
    raw["data_root"] = _resolve_paths({"data_root": raw["data_root"]}, root)["data_root"]
    scalars = {k: v for k, v in raw.items() if isinstance(v, (str, int, float))}
    resolved = _resolve_paths(_interpolate(raw, scalars), root)
    cfg = Config(path=p.resolve(), raw=resolved)
    cfg.settings  # noqa: B018 - an unknown key, a missing one or a wrong type fails here, at load
    return cfg
