"""The alerting rules shipped in infra/prometheus/ (issue 59): `promtool check rules` and the rules'
unit tests (`promtool test rules infra/prometheus/rules_test.yml`) green; every alert has a unit
test and a runbook section in docs/operations-alerts.md; and the unit tests catch a broken rule.
promtool is Debian's prometheus package (make sysdeps installs it): skipped without it, except
under CI=true."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import yaml

from ccs_testing import REPO

PROM = REPO / "infra" / "prometheus"


def _promtool() -> str:
    p = shutil.which("promtool")
    if p is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is not installed under CI (make sysdeps)", pytrace=False)
        pytest.skip("promtool is not installed (Debian's prometheus: make sysdeps)")
    return p


def _alerts(path) -> list[dict]:
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_checks_the_rules():
    r = subprocess.run([_promtool(), "check", "rules", str(PROM / "rules.yml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_rule_unit_tests_pass():
    r = subprocess.run([_promtool(), "test", "rules", "rules_test.yml"], cwd=PROM, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_is_tested_and_has_a_runbook():
    names = [a["alert"] for a in _alerts(PROM / "rules.yml")]
    assert len(names) == len(set(names)), "alert names are unique"
    tested = {t["alertname"] for case in yaml.safe_load((PROM / "rules_test.yml").read_text())["tests"]
              for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
    assert set(names) - tested == set(), f"alerts without a firing unit test: {set(names) - tested}"
    doc = (REPO / "docs" / "operations-alerts.md").read_text()
    sections = set(re.findall(r"^### (\w+)$", doc, re.M))
    assert set(names) - sections == set(), f"alerts without a runbook section: {set(names) - sections}"
    for a in _alerts(PROM / "rules.yml"):
        assert a["annotations"]["runbook_url"] == f"docs/operations-alerts.md#{a['alert'].lower()}", a["alert"]
        # docs/operations-alerts.md: page wakes someone, warn waits for working hours, info is only shown
        assert a["labels"]["severity"] in ("page", "warn", "info"), a["alert"]


def test_unit_tests_catch_a_broken_rule(tmp_path):
    """The same unit tests against rules whose expiry check looks at the previous table: red."""
    text = (PROM / "rules.yml").read_text()
    broken = text.replace('ccs_edge_table_expired{slot="live"} == 1', 'ccs_edge_table_expired{slot="previous"} == 1')
    assert broken != text
    (tmp_path / "rules.yml").write_text(broken)
    shutil.copy(PROM / "rules_test.yml", tmp_path / "rules_test.yml")
    r = subprocess.run([_promtool(), "test", "rules", "rules_test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode != 0 and "CcsTableExpired" in r.stdout + r.stderr, r.stdout + r.stderr
