"""The drivers' class archive (ccselect/spark_cds.py): a new driver maps the archive `make warm`
wrote; a file that does not fit is ignored without a word and the session works; no archive, or
CCS_SPARK_CDS=0, no option."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ccselect import spark_cds

CHILD = r"""
import json, os, sys, tempfile, psutil
from ccselect.config import load_config
from ccselect.spark import get_spark
spark = get_spark(load_config(), app_name="cds-check")
d = tempfile.mkdtemp()
spark.range(50).selectExpr("id % 3 as k").write.format("delta").save(d + "/t")
rows = spark.read.format("delta").load(d + "/t").groupBy("k").count().count()
java = [c for c in psutil.Process().children(recursive=True) if c.name() == "java"][0]
maps = sorted({m.path for m in java.memory_maps() if m.path.endswith(".jsa")})
sys.stderr.write("CDS " + json.dumps({"rows": rows, "maps": maps}) + "\n")
spark.stop()
"""


def _driver(env_value: str) -> tuple[dict, str]:
    env = {**os.environ, spark_cds.ENV: env_value}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stderr.splitlines() if x.startswith("CDS "))
    return json.loads(line[4:]), done.stdout


def test_options_follow_the_file_and_the_switch(tmp_path, monkeypatch):
    monkeypatch.setattr(spark_cds, "archive_path", lambda: str(tmp_path / "none.jsa"))
    monkeypatch.delenv(spark_cds.ENV, raising=False)
    assert spark_cds.use_options() == "", "no archive: no option (a missing file turns the JDK's own off)"
    (tmp_path / "none.jsa").write_bytes(b"x")
    assert f"-XX:SharedArchiveFile={tmp_path / 'none.jsa'}" in spark_cds.use_options()
    monkeypatch.setenv(spark_cds.ENV, "0")
    assert spark_cds.use_options() == "" and spark_cds.dump_target() is None
    assert spark_cds.executors_here("spark://127.0.0.1:17077") and spark_cds.executors_here("local-cluster[1,1,1024]")
    assert not spark_cds.executors_here("spark://10.0.0.5:7077") and not spark_cds.executors_here("local[*]")


def test_a_new_driver_maps_the_archive_and_a_file_that_does_not_fit_is_silent(tmp_path):
    path = spark_cds.archive_path()
    deadline = time.time() + 300        # make warm writes it as its JVM exits, beside what follows
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(2)
    assert os.path.exists(path), f"make warm left no class archive at {path}"
    got, out = _driver("1")
    assert got["rows"] == 3 and path in got["maps"], got     # (beside the JDK's own base archive)
    bad = tmp_path / "stale.jsa"
    bad.write_bytes(b"not an archive" * 1000)
    got, out = _driver(str(bad))
    assert got["rows"] == 3 and str(bad) not in got["maps"] and path not in got["maps"], got
    assert out == "", f"the JVM said something about the archive: {out[:500]}"


def test_the_archive_is_put_in_place_only_once_its_jvm_has_exited(tmp_path):
    part, final = tmp_path / "a.jsa.1.part", tmp_path / "a.jsa"
    part.write_bytes(b"archive")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    t0 = time.time()
    spark_cds.place_when_gone(proc.pid, str(part), str(final))
    assert time.time() - t0 >= 1.0 and final.read_bytes() == b"archive" and not part.exists()
    proc.wait()
    # still running at the deadline: no archive (a half-written one would only be refused later)
    part.write_bytes(b"half")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        spark_cds.place_when_gone(proc.pid, str(part), str(tmp_path / "b.jsa"), timeout=0.5)
    finally:
        proc.kill()
        proc.wait()
    assert not part.exists() and not (tmp_path / "b.jsa").exists()
