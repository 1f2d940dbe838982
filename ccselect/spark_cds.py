"""Class data sharing for our Spark drivers: the JDK's dynamic AppCDS archive (JEP 350, JDK 13+).

Every Spark driver JVM starts by loading, verifying and linking the same ~15 k classes of Spark,
Delta and Hadoop. A dynamic archive keeps them mapped from one file: `make warm` (`python -m
ccselect.spark --warm`) writes it once from its warm-up session (`-XX:ArchiveClassesAtExit`), and
`get_spark` gives every later driver `-XX:SharedArchiveFile` while the file is there, and the
executors too when a standalone master on this machine starts them (`executors_here`). Measured on
this 2-core machine (a session, a Delta write and a read with a group-by; two runs each,
interleaved, load 3.5–4.7): the driver's CPU 32.1 and 33.6 s without, 25.0 and 22.7 s with; the
session's start 11.2 and 8.6 s without, 5.9 and 5.6 s with; an executor of Spark's local-cluster
mode running a group-by, 9.7 s of CPU without, 6.8 s with.

The JVM checks the archive itself (its JDK, its base archive, the class path; a class a custom
loader defines is used only when its bytes match): a file that does not fit is ignored, and
`-Xlog:cds=off` keeps that silent, so a stale archive costs the speed-up, never a wrong class.
`CCS_SPARK_CDS=0` turns it off; `CCS_SPARK_CDS=<file>.jsa` maps that file instead. The file is
named by the JDK and pyspark, and lives in the virtual environment (a new one starts without it
until its `make warm`)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
# Imported inside the functions that use them (heavy, not needed to import this module): pyspark.

ENV = "CCS_SPARK_CDS"
#: the JVM's own messages about the archive (a mismatch, the thousands of classes a dump skips) off
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _java() -> list:
    """The JDK spark-submit starts (JAVA_HOME's, else the PATH's), with its binary's mtime: a JDK
    updated in place gets a new archive."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java:
        return []
    real = os.path.realpath(java)
    return [real, int(os.stat(real).st_mtime)] if os.path.exists(real) else [real]


def archive_path() -> str:
    """Where this environment's archive is (whether or not it exists)."""
    import pyspark
    key = json.dumps([_java(), pyspark.__version__])
    return os.path.join(sys.prefix, "share", "ccselect", f"spark-{hashlib.sha1(key.encode()).hexdigest()[:12]}.jsa")


def enabled() -> bool:
    return os.environ.get(ENV, "1") not in ("", "0")


def use_options() -> str:
    """The driver's JVM options to map the archive (`CCS_SPARK_CDS` may name another file): none
    when there is none (a missing file would also turn off the JDK's own base archive)."""
    named = os.environ.get(ENV, "")
    path = (named if named.endswith(".jsa") else archive_path()) if enabled() else None
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path and os.path.exists(path) else ""


def executors_here(master: str) -> bool:
    """Whether `master`'s executors start on this machine, where the archive is: a standalone
    master on the loopback (the local topology) or Spark's local-cluster mode. Elsewhere a path
    the worker's host lacks would also turn off the JDK's own base archive there."""
    host = master.removeprefix("spark://").split(":")[0]
    return master.startswith("local-cluster[") or (master.startswith("spark://") and host in ("127.0.0.1", "localhost"))


def dump_target() -> str | None:
    """A temporary file for a warm-up session to archive into, or None when there is an archive
    already (or CDS is off)."""
    if not enabled():
        return None
    path = archive_path()
    if os.path.exists(path):
        return None
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return f"{path}.{os.getpid()}.part"


def dump_options(target: str) -> str:
    return f"-XX:ArchiveClassesAtExit={target} {QUIET}"


def finish(proc: subprocess.Popen, target: str) -> None:
    """End the warm-up driver `proc` (pyspark's gateway exits when its stdin closes; the JVM writes
    the archive as it exits) and put the archive in place once written (`place_when_gone`), in a
    detached process, so the rest of the set-up goes on meanwhile; a driver started before that
    runs without it."""
    final = target.rsplit(".", 2)[0]
    subprocess.Popen([sys.executable, "-m", "ccselect.spark_cds", str(proc.pid), target, final], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if proc.stdin:
        proc.stdin.close()


def _running(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (not a zombie: the warm-up that started it
    may not have reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def place_when_gone(pid: int, part: str, final: str, timeout: float = 600) -> None:
    """Once the JVM `pid` has exited, `part` (the archive it wrote) becomes `final`; a JVM still
    running at `timeout` leaves no archive."""
    deadline = time.time() + timeout
    while _running(pid) and time.time() < deadline:
        time.sleep(0.2)
    if os.path.exists(part):
        if _running(pid):
            os.unlink(part)
        else:
            os.replace(part, final)


if __name__ == "__main__":
    place_when_gone(int(sys.argv[1]), sys.argv[2], sys.argv[3])
