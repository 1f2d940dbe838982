"""The typed settings (ccselect/settings.py): the shipped files load, a key no field reads or a value
of the wrong kind fails at load naming the key and the file, and every default lives in one place."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from ccs_testing import REPO, raw_section, write_config
from ccselect import settings as st
from ccselect.config import load_config
from ccselect.settings import ConfigError

SHIPPED = [REPO / "infra" / "conf" / "local.yaml", REPO / "infra" / "conf" / "cluster.yaml"]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_files_load(path):
    s = load_config(path).settings
    assert isinstance(s, st.Settings)
    assert s.export.ladder == {4: (16, 24, 32), 6: (32, 48, 64, 128)}
    assert s.export.purity[4][24] == ((0, 0.90), (1000, 0.95))
    assert [p.name for p in s.autoplex.policies] == ["low_retrans", "high_goodput_per_srtt"]
    assert s.export.caps_policy in {p.name for p in s.autoplex.policies}
    assert s.pipeline.deploy is True and s.pipeline.auto_promote is False


def test_environments_differ_where_they_should():
    local, cluster = (load_config(p).settings for p in SHIPPED)
    assert (local.model.gate.min_mean_accuracy, local.model.gate.min_worst_accuracy) == (0.75, 0.55)
    assert (cluster.model.gate.min_mean_accuracy, cluster.model.gate.min_worst_accuracy) == (0.9, 0.8)
    assert cluster.spark.extra_packages == ("org.apache.hadoop:hadoop-aws:3.5.0",) and local.spark.extra_packages == ()
    assert cluster.export.rollout.store == "s3://ccselect-artifacts/cc-tables"
    assert (local.simulate.nodes, cluster.simulate.nodes) == (12, 200)


def test_defaults_are_what_the_code_used_before():
    """The values the jobs fell back on (and the shipped local.yaml gave) before the settings."""
    infer = st.InferSettings()
    assert (infer.wifi_threshold, infer.cell_threshold) == (0.8, 0.6)
    assert (infer.default_cc, infer.wifi_cc, infer.cell_cc, infer.precision, infer.batch_rows) == \
        ("cubic", "cubic", "bbr", "fp32", 65536)
    assert dataclasses.asdict(st.AbtestSettings()) == {"confidence": 0.95, "min_clusters": 30}
    assert st.RolloutSettings(store="x").health == st.Health(wait_s=2.0, min_rate_ratio=0.5)
    assert dataclasses.asdict(st.GuardsSettings()) == {"require_gate": True, "max_flip_share": 0.30,
                                                        "min_coverage": 0.50, "max_entries": 1_000_000,
                                                        "max_tree_nodes": 255, "max_artifact_bytes": 64 << 20,
                                                        "max_growth": 1.5, "growth_floor_entries": 100,
                                                        "max_revert_share": 0.10}
    assert st.MlflowSettings(tracking_uri="u", artifact_root="a").model_name == "ccs-nettype"
    s = load_config(SHIPPED[0]).settings
    assert (s.autoplex.period_minutes, s.autoplex.group_by) == (30, ("ug_id",))
    assert (s.pipeline.train_window_hours, s.pipeline.export_window_hours, s.pipeline.epochs) == (24, 1, None)
    assert s.export.expiry_hours == 6.0


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_files_do_not_repeat_a_default(path):
    """A default lives in its class only: a shipped file gives a key that has a default only to
    change it."""
    raw = yaml.safe_load(path.read_text())

    def walk(obj, data, where):
        fields = {f.name: f for f in dataclasses.fields(obj)}
        for key, value in (data or {}).items():
            given, f, name = getattr(obj, key), fields[key], f"{where}.{key}".lstrip(".")
            if dataclasses.is_dataclass(given) and isinstance(value, dict):
                walk(given, value, name)
            elif f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
                try:
                    back = getattr(dataclasses.replace(obj, **{key: default}), key)
                except ValueError:      # keys that go together: the default alone is not a setting, so no repeat
                    continue
                assert given != back, f"{path.name}: {name} repeats its default"

    walk(load_config(path).settings, {k: v for k, v in raw.items() if k not in st.SCALARS}, "")


def _load(tmp_path, **sections):
    return load_config(write_config(tmp_path, **sections))


@pytest.mark.parametrize("section, value, key", [
    ("export", {**raw_section("export"), "expiry_hour": 6}, "export.expiry_hour"),
    ("export", {**raw_section("export"), "guards": {"max_flip": 0.2}}, "export.guards.max_flip"),
    ("infer", {"wifi_treshold": 0.9}, "infer.wifi_treshold"),
    ("autoplex", {**raw_section("autoplex"), "policies": [
        {"name": "p", "metric": "retrans_ratio", "band": [5, 20], "min_session": 3}]}, "autoplex.policies[0].min_session"),
    ("lakes", {"root": "/x"}, "lakes"),
])
def test_an_unknown_key_fails_naming_it_and_the_file(tmp_path, section, value, key):
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, **{section: value})
    assert f"unknown key '{key}'" in str(exc.value) and str(tmp_path / "ccs.yaml") in str(exc.value), exc.value


@pytest.mark.parametrize("section, value, key", [
    ("simulate", {**raw_section("simulate"), "nodes": "12"}, "simulate.nodes"),
    ("simulate", {**raw_section("simulate"), "hours": 8.5}, "simulate.hours"),
    ("infer", {"wifi_threshold": "high"}, "infer.wifi_threshold"),
    ("infer", {"cell_threshold": True}, "infer.cell_threshold"),
    ("pipeline", {**raw_section("pipeline"), "deploy": "yes"}, "pipeline.deploy"),
    ("export", {**raw_section("export"), "ladder": {"v4": "16,24,32", "v6": [32, 128]}}, "export.ladder.v4"),
    ("model", {**raw_section("model"), "groups": {"k_range": [2, 4, 8]}}, "model.groups.k_range"),
])
def test_a_wrong_type_fails_naming_the_key(tmp_path, section, value, key):
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, **{section: value})
    assert f"{key} must be" in str(exc.value) and str(tmp_path / "ccs.yaml") in str(exc.value), exc.value


def test_a_missing_required_key_and_a_bad_range_fail(tmp_path):
    export = raw_section("export")
    del export["keys_dir"]
    with pytest.raises(ConfigError, match=r"'export\.keys_dir' is required"):
        _load(tmp_path, export=export)
    with pytest.raises(ConfigError, match=r"'model\.gate\.min_worst_accuracy' is required"):
        _load(tmp_path, model={"gate": {"min_mean_accuracy": 0.5, "max_drop_vs_champion": 0.01}})
    with pytest.raises(ConfigError, match=r"abtest\.confidence must lie in \(0, 1\), got 1\.5"):
        _load(tmp_path, abtest={"confidence": 1.5})
    with pytest.raises(ConfigError, match="period_minutes must divide an hour"):
        _load(tmp_path, autoplex={**raw_section("autoplex"), "period_minutes": 7})
    with pytest.raises(ConfigError, match="infer.precision must be one of"):
        _load(tmp_path, infer={"precision": "fp8"})
    with pytest.raises(ConfigError, match="multiples of 4 ending at /32"):
        _load(tmp_path, export={**raw_section("export"), "ladder": {"v4": [16, 24], "v6": [32, 128]}})
    with pytest.raises(ConfigError, match=r"pipeline\.cellular_share must be in \(0, 1\) or null"):
        _load(tmp_path, pipeline={**raw_section("pipeline"), "cellular_share": 1.0})
    with pytest.raises(ConfigError, match="pipeline.min_steps must be 0 or more"):
        _load(tmp_path, pipeline={**raw_section("pipeline"), "min_steps": -1})
    natural = _load(tmp_path, pipeline={**raw_section("pipeline"), "cellular_share": None}).settings.pipeline
    assert natural.cellular_share is None
    export = raw_section("export")
    with pytest.raises(ConfigError, match="export.rollout.gate must be one of"):
        _load(tmp_path, export={**export, "rollout": {**export["rollout"], "gate": "rates"}})
    with pytest.raises(ConfigError, match="stream.rollout_clock records reads the segments' clock: the file source only"):
        _load(tmp_path, stream={"source": "kafka", "rollout_clock": "records"})
    # without the shipped file's `gate: health` (a fleet without clients), the outcome gate
    del export["rollout"]["gate"]
    assert _load(tmp_path, export=export).settings.export.rollout.gate == "canary"


def test_a_file_overrides_a_default_and_numbers_are_typed(tmp_path):
    s = _load(tmp_path, infer={"precision": "bf16", "wifi_threshold": 1},
              export={**raw_section("export"), "purity": {"v4": {"24": [[0, 1]]}}}).settings
    assert (s.infer.precision, s.infer.wifi_threshold, s.infer.cell_threshold) == ("bf16", 1.0, 0.6)
    assert isinstance(s.infer.wifi_threshold, float)
    assert s.export.purity == {4: {24: ((0, 1.0),)}, 6: {}}
    assert s.export.threshold(4, 24, 10) == 1.0 and s.export.threshold(4, 16, 10) == 0.0


def test_replace_keeps_the_checks(cfg):
    assert dataclasses.replace(cfg.settings.infer, precision="bf16").precision == "bf16"
    with pytest.raises(ValueError, match="infer.precision"):
        dataclasses.replace(cfg.settings.infer, precision="fp8")
    ladder = dataclasses.replace(cfg.settings.export, expiry_hours=1.0)
    assert (ladder.ladder, ladder.purity) == (cfg.settings.export.ladder, cfg.settings.export.purity)
