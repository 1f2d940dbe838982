"""Where a test run spends its CPU (issue 63, the suite within budget): a pytest plugin that records,
for every test's setup, call and teardown and for every fixture's own setup over a second, the wall
seconds and the CPU seconds (user + system) of pytest and every live process under it, the JVM
included, with the load average beside; then the session's totals. JSON lines, appended to
$PYTEST_CPU_OUT:

    PYTEST_CPU_OUT=var/cpu.jsonl .venv/bin/python -m pytest -q -p no:cacheprovider -p bench.pytest_cpu tests/test_identity.py

CPU is read from /proc (utime + stime + cutime + cstime of each process in pytest's tree), so a
process that left the tree (a daemon that double-forked) is not counted, nor the part of a child
that exited without being waited for. A fixture's setup does not include the fixtures it asks
for (pytest sets those up first). The CPU figure, not the wall, is what compares across loads."""
from __future__ import annotations

import json
import os
import time

import pytest

TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int | None = None) -> float:
    """CPU seconds of `root` (this process) and its live descendants, their waited children included."""
    kids: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()      # after the command's name, which may hold spaces
        kids.setdefault(int(fields[1]), []).append(int(p))
        ticks[int(p)] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    total, todo = 0, [root or os.getpid()]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(kids.get(pid, []))
    return total / TICK


def _write(record: dict) -> None:
    path = os.environ.get("PYTEST_CPU_OUT")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({**record, "loadavg": [round(x, 2) for x in os.getloadavg()]}) + "\n")


_START: dict[str, float] = {}


def pytest_sessionstart(session):
    _START.update(wall=time.monotonic(), cpu=tree_cpu())
    _write({"event": "start"})


def pytest_sessionfinish(session):
    _write({"event": "total", "wall": round(time.monotonic() - _START["wall"], 1),
            "cpu": round(tree_cpu() - _START["cpu"], 1)})


def _phase(item, phase: str):
    wall, cpu = time.monotonic(), tree_cpu()
    yield
    _write({"test": item.nodeid, "phase": phase, "wall": round(time.monotonic() - wall, 1),
            "cpu": round(tree_cpu() - cpu, 1)})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _phase(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _phase(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _phase(item, "teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    wall, cpu = time.monotonic(), tree_cpu()
    yield
    if time.monotonic() - wall > 1:
        _write({"fixture": fixturedef.argname, "scope": fixturedef.scope, "wall": round(time.monotonic() - wall, 1),
                "cpu": round(tree_cpu() - cpu, 1)})
