"""docs/results/ pages are rendered from JSON only: bench/report.py on a data root with one result
and nothing else shows that result's figures, copies its JSON beside the page, and says the other
pages are not measured."""
from __future__ import annotations

import json
import subprocess
import sys

from ccs_testing import REPO


def test_pages_show_the_json_they_name_and_nothing_for_missing_sources(tmp_path):
    data_root, out = tmp_path / "var", tmp_path / "pages"
    (data_root / "results").mkdir(parents=True)
    doc = {"measured_at": "2026-11-25T03:00:00+00:00", "load_avg": [1.5, 1.2, 0.9], "ok": True,
           "summary": "ccselect main job: done\n  mean 0.848, worst 0.685",
           "train": {"state": "success", "mean": 0.8481}}
    (data_root / "results" / "main_job.json").write_text(json.dumps(doc))
    r = subprocess.run([sys.executable, str(REPO / "bench" / "report.py"), "--data-root", str(data_root),
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    page = (out / "main-job.md").read_text()
    assert "| `train.mean` | 0.8481 |" in page, page
    assert "| `load_avg` | [1.5, 1.2, 0.9] |" in page, page
    assert "mean 0.848, worst 0.685" in page, "a multi-line text result is shown as a block"
    assert json.loads((out / "data" / "main-job.json").read_text()) == doc
    assert "Not measured yet" in (out / "emulate.md").read_text()
    assert not (out / "data" / "emulate.json").exists()
    index = (out / "index.md").read_text()
    assert "[The main job (`make run`)](main-job.md) | `make run` | measured |" in index, index
    assert "emulate.md) | `ccs emulate --hours FROM..TO --json` | not measured yet |" in index, index


def test_only_renders_the_pages_named_and_keeps_the_others(tmp_path):
    """`--only emulate` after a full render: the emulate page shows its new JSON; the main job's
    page and JSON stay as rendered, although its source is gone from the data root."""
    data_root, out = tmp_path / "var", tmp_path / "pages"
    (data_root / "results").mkdir(parents=True)
    main_json = data_root / "results" / "main_job.json"
    main_json.write_text(json.dumps({"train": {"mean": 0.8481}}))

    def report(*extra):
        r = subprocess.run([sys.executable, str(REPO / "bench" / "report.py"), "--data-root", str(data_root),
                            "--out", str(out), *extra], capture_output=True, text=True, timeout=120)
        return r
    assert report().returncode == 0
    main_page = (out / "main-job.md").read_text()
    main_json.unlink()
    (data_root / "results" / "emulate.json").write_text(json.dumps({"policies": {"alics": 0.125}}))
    r = report("--only", "emulate")
    assert r.returncode == 0, r.stderr
    assert "| `policies.alics` | 0.125 |" in (out / "emulate.md").read_text()
    assert (out / "main-job.md").read_text() == main_page
    assert json.loads((out / "data" / "main-job.json").read_text()) == {"train": {"mean": 0.8481}}
    index = (out / "index.md").read_text()
    assert "(main-job.md) | `make run` | measured |" in index, index
    assert "emulate.md) | `ccs emulate --hours FROM..TO --json` | measured |" in index, index
    assert "(evaluate.md) | `ccs evaluate --hours FROM..TO --json` | not measured yet |" in index, index
    bad = report("--only", "nonsense")
    assert bad.returncode != 0 and "unknown page" in bad.stderr
