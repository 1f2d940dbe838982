"""A bench's result file: indented JSON under bench/results/ (bench/report.py renders it into
docs/results/), written the same way by every bench that ends with one."""
from __future__ import annotations

import json
import shutil
from pathlib import Path


def write(path: str | Path, result: dict, show: str | None = None) -> None:
    """`result` as indented JSON at `path`, its folder made; prints `show`, or the JSON itself."""
    text = json.dumps(result, indent=2)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text + "\n")
    print(text if show is None else show)


def finish(path: str | Path, result: dict, work: Path, keep: bool) -> int:
    """`write`, then the bench's work folder removed unless `keep`; the bench's exit status (0)."""
    write(path, result)
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0
