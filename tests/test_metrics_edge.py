"""The edge agent's metrics (export/edge/metrics.c, issue 59): the Prometheus text format that
`ccs-edge metrics` prints and `run` rewrites for node_exporter's textfile collector.

Real traffic in a throwaway cgroup (as tests/kernel does): a hit and a miss on one service, A/B
controls on another, a connection on a port of no service; then the exposition must pass
`promtool check metrics`, carry every kernel counter per service (ccs_svc_counters), each summed
over its series to the node total `status --json` gives, and describe the live and previous
table, the attach state and the log's ledger. A policy that moves the services to other slots
starts their counters from zero (the node totals stay). Needs root, BPF and cgroup v2 (skipped with the reason, except under CI=true) and
promtool (Debian's prometheus: make sysdeps installs it)."""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from ccselect.export.artifact import signing, table_format as tf
from ccselect.export.edge.agent import EdgeAgent, EdgeConfig, Service
from ccselect.export.edge.probe import CGROUP_ROOT, in_cgroup, kernel_ready, listener, system_cc
from kernel._edge_helpers import cc_of, edge_binary

pytestmark = pytest.mark.kernel


def parse_exposition(text: str) -> dict:
    """{(name, sorted label pairs): value} of a text exposition (prometheus_client's parser;
    a counter's samples keep their _total name)."""
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, tuple(s.labels.items()))
            assert key not in out, f"series {key} twice"
            out[key] = s.value
    return out


def per_service(m: dict, name: str, **fixed: str) -> dict:
    """{service label (None: the series without one): value} of metric `name`'s series that carry
    the `fixed` labels and no other label but service."""
    out = {}
    for (n, labels), v in m.items():
        d = dict(labels)
        if n != name or any(d.get(k) != x for k, x in fixed.items()) or set(d) - set(fixed) - {"service"}:
            continue
        assert d.get("service") not in out, f"{name}{d}: twice"
        out[d.get("service")] = v
    return out


def _unavailable(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"the edge metrics test cannot run under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _promtool() -> str:
    p = shutil.which("promtool")
    if p is None:
        _unavailable("promtool is not installed (Debian's prometheus: make sysdeps)")
    return p


@pytest.fixture
def edge_agent(tmp_path):
    """An agent on a throwaway cgroup and pin dir, cleaned up whatever happens."""
    if os.geteuid() != 0:
        _unavailable("needs root (BPF, cgroups)")
    if why := kernel_ready():
        _unavailable(why)
    binary = edge_binary()
    name = f"ccs-metrics-{os.getpid()}"
    key = signing.generate_key()
    signing.save_keypair(key, str(tmp_path / "priv.pem"), str(tmp_path / "pub.pem"))
    cgroup = os.path.join(CGROUP_ROOT, name)
    os.makedirs(cgroup)
    conf = EdgeConfig(node_id="metrics-node", cgroup=cgroup, pin_dir=f"/sys/fs/bpf/{name}",
                      public_key=str(tmp_path / "pub.pem"), sample_rate=1.0,
                      metrics_file=str(tmp_path / "textfile" / "ccs.prom"), state_dir=str(tmp_path / "state"))
    agent = EdgeAgent(config=conf, binary=binary)
    agent.key = key
    try:
        yield agent
    finally:
        try:
            agent.detach(purge=True)
        finally:
            subprocess.run(["rm", "-rf", conf.pin_dir])
            for _ in range(50):
                try:
                    os.rmdir(cgroup)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
            agent.close()


def _metrics(agent: EdgeAgent, *args: str) -> str:
    r = subprocess.run([agent.binary, "--config", agent.config_path, "metrics", *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"ccs-edge metrics -> {r.returncode}: {r.stderr}"
    return r.stdout


def _check(text: str, tmp_path) -> None:
    path = tmp_path / "check.prom"
    path.write_text(text)
    r = subprocess.run([_promtool(), "check", "metrics"], stdin=open(path), capture_output=True, text=True)
    assert r.returncode == 0, f"promtool check metrics: {r.stdout}{r.stderr}\n{text}"


def test_metrics_of_a_node_with_traffic(edge_agent, tmp_path):
    _promtool()
    agent = edge_agent
    default = system_cc()
    other = next(c for c in ("cubic", "reno", "bbr") if c != default)
    with in_cgroup(agent.config.cgroup):
        plain, ab, unserved = listener(), listener(), listener()
    try:
        agent.config.services = [Service(plain.getsockname()[1], "video"),
                                 Service(ab.getsockname()[1], "web", ab=True)]
        agent.write_config(agent.config)

        # before attach: no maps, a valid exposition that says so
        before = parse_exposition(_metrics(agent))
        _check(_metrics(agent), tmp_path)
        assert before[("ccs_edge_maps_present", ())] == 0, "no pin dir yet: maps_present 0"
        assert before[("ccs_edge_attached", ())] == 0, "not attached yet"

        agent.attach(agent.config.cgroup)
        now = int(time.time())
        old = signing.write_table([tf.Entry("127.50.0.0/16", other)], 3, "m-3", now + 600,
                                  str(tmp_path / "t"), agent.key, created=now - 100, epoch=2)
        new = signing.write_table([tf.Entry("127.50.0.0/16", other), tf.Entry("10.9.0.0/16", other)],
                                  4, "m-4", now + 900, str(tmp_path / "t"), agent.key, created=now - 40, epoch=2)
        agent.load(old.manifest)
        agent.load(new.manifest)
        assert cc_of(plain, "127.50.0.9") == other, "setup: a hit gets the table's CC"
        assert cc_of(plain, "127.51.0.9") == default, "setup: a miss keeps the default"
        evens = [s for s in (f"127.50.1.{i}" for i in range(1, 40)) if not tf.ab_bucket_odd(s)][:3]
        for s in evens:
            assert cc_of(ab, s) == default, f"setup: A/B control {s} keeps the default"
        assert cc_of(unserved, "127.50.0.9") == default, "setup: a port of no service is left alone"

        text = _metrics(agent)
        _check(text, tmp_path)
        m = parse_exposition(text)
        status = agent.status()
        cnt = status["counters"]
        # every kernel counter, under its metric, with status's value
        # the agent's ledger: one unlabelled series each
        ledger = {
            "log_written": "ccs_edge_log_records_written_total",
            "log_lost": "ccs_edge_log_records_lost_total",
            "log_errors": "ccs_edge_log_write_errors_total",
        }
        # the kernel's counters: one series per service; those with events of no service (an
        # unserved port, a listener) also one without the label
        kernel = {
            "established": ("ccs_edge_connections_established_total", {}),
            "no_table": ("ccs_edge_connections_no_table_total", {}),
            "expired": ("ccs_edge_connections_expired_table_total", {}),
            "ab_control": ("ccs_edge_ab_control_total", {}),
            "lookups": ("ccs_edge_lookups_total", {}),
            "miss": ("ccs_edge_lookup_misses_total", {}),
            "setsockopt_err": ("ccs_edge_setsockopt_errors_total", {}),
            "caps_err": ("ccs_edge_caps_errors_total", {}),
            "log_sampled": ("ccs_edge_log_sampled_total", {}),
            "log_emitted": ("ccs_edge_log_emitted_total", {}),
            "log_dropped": ("ccs_edge_log_ring_dropped_total", {}),
            "storage_err": ("ccs_edge_socket_storage_errors_total", {}),
            "not_served": ("ccs_edge_connections_not_served_total", {}),
            "cc_preset": ("ccs_edge_route_cc_preset_total", {}),
            "cc_reset": ("ccs_edge_route_cc_reset_total", {}),
            "pacing_set": ("ccs_edge_caps_set_total", {"cap": "pacing"}),
            "clamp_set": ("ccs_edge_caps_set_total", {"cap": "cwnd_clamp"}),
            "tree_evals": ("ccs_edge_flow_tree_evals_total", {}),
            "tree_no_leaf": ("ccs_edge_flow_tree_no_leaf_total", {}),
        }
        kernel.update({f"hit_{e}": ("ccs_edge_lookup_hits_total", {"entry": e})
                       for e in ("keep", "lowconf", "cubic", "bbr", "reno")})
        kernel.update({f"src_{s}": ("ccs_edge_decision_source_total", {"source": s})
                       for s in ("table", "flow", "table_flow", "fallback", "default")})
        assert set(cnt) <= set(kernel) | set(ledger), \
            f"status counters without a metric here: {set(cnt) - set(kernel) - set(ledger)}"
        no_service = {"not_served", "setsockopt_err", "cc_reset"}
        for name, (metric, fixed) in kernel.items():
            if name not in cnt:
                continue
            series = per_service(m, metric, **fixed)
            services = set() if name == "not_served" else {"video", "web"}
            assert set(series) == services | ({None} if name in no_service else set()), f"{name}: {series}"
            assert sum(series.values()) == cnt[name], \
                f"{name}: {metric}{fixed} sums to {sum(series.values())} over {series}, status {cnt[name]}"
        for name, metric in ledger.items():
            if name in cnt:
                assert m.get((metric, ())) == cnt[name], f"{name}: metric {m.get((metric, ()))}, status {cnt[name]}"
        # per service, as the connections were made: video a hit and a miss, web the A/B controls
        n = len(evens)
        assert per_service(m, "ccs_edge_connections_established_total") == {"video": 2, "web": n}
        assert per_service(m, "ccs_edge_lookups_total") == {"video": 2, "web": 0}
        assert per_service(m, "ccs_edge_lookup_hits_total", entry=other) == {"video": 1, "web": 0}, "the hit"
        assert per_service(m, "ccs_edge_lookup_misses_total") == {"video": 1, "web": 0}, "the miss"
        assert per_service(m, "ccs_edge_ab_control_total") == {"video": 0, "web": n}, "the A/B controls"
        assert per_service(m, "ccs_edge_decision_source_total", source="default") == {"video": 1, "web": 0}
        assert per_service(m, "ccs_edge_log_sampled_total") == {"video": 2, "web": n}
        assert per_service(m, "ccs_edge_connections_not_served_total") == {None: 1}, "the port of no service"

        # the tables: live 4, previous 3, their times as the manifests say
        live, prev = (("slot", "live"),), (("slot", "previous"),)
        assert m[("ccs_edge_table_version", live)] == 4 and m[("ccs_edge_table_version", prev)] == 3
        assert m[("ccs_edge_table_expiry_timestamp_seconds", live)] == now + 900
        assert m[("ccs_edge_table_created_timestamp_seconds", prev)] == now - 100
        assert 40 <= m[("ccs_edge_table_age_seconds", live)] <= 40 + 60
        assert 900 - 60 <= m[("ccs_edge_table_expires_in_seconds", live)] <= 900
        assert m[("ccs_edge_table_expired", live)] == 0 and m[("ccs_edge_table_enforced", ())] == 1
        assert m[("ccs_edge_table_entries", live + (("family", "v4"),))] == 2
        assert m[("ccs_edge_table_info", live + (("version", "4"), ("model_version", "m-4"),
                                                 ("sha256", status["table"]["sha256"])))] == 1
        assert m[("ccs_edge_attached", ())] == 1 and m[("ccs_edge_link_state", (("state", "ok"),))] == 1
        assert m[("ccs_edge_route_ccs_enabled", ())] == 0
        assert m[("ccs_edge_version_floor", ())] == 4 == status["version_floor"]
        assert m[("ccs_edge_epoch_floor", ())] == 2 == status["epoch_floor"], "the deployment epoch"
        assert m[("ccs_edge_version_floor_readable", ())] == 1
        assert m[("ccs_edge_agent_info", (("node_id", "metrics-node"), ("default_cc", "")))] == 1
        assert m[("ccs_edge_service_info", (("port", str(ab.getsockname()[1])), ("service", "web"),
                                            ("ab", "true"), ("caps", "false"), ("flow_mode", "off")))] == 1
        assert not any("127.50" in str(labels) for _, labels in m), "no client address in any label"

        # `run` keeps metrics_file current: the records drained show up as written
        proc = subprocess.Popen([agent.binary, "--config", agent.config_path, "run", "--out",
                                 str(tmp_path / "log")], stderr=subprocess.PIPE, text=True)
        try:
            path = tmp_path / "textfile" / "ccs.prom"
            os.makedirs(path.parent, exist_ok=True)
            deadline = time.time() + 20
            seen = {}
            while time.time() < deadline:
                if path.exists():
                    seen = parse_exposition(path.read_text())
                    if seen.get(("ccs_edge_log_records_written_total", ())) == 2 + len(evens):
                        break
                time.sleep(0.3)
            assert seen.get(("ccs_edge_log_records_written_total", ())) == 2 + len(evens), \
                f"run's metrics_file: records written {seen.get(('ccs_edge_log_records_written_total', ()))}"
            _check(path.read_text(), tmp_path)
            assert [p for p in os.listdir(path.parent)] == ["ccs.prom"], "no temporary file left"
            assert per_service(seen, "ccs_edge_log_emitted_total") == {"video": 2, "web": n}, \
                "records emitted on close, counted for their connection's service"
        finally:
            proc.terminate()
            proc.wait(timeout=10)

        # one-shot to a file: atomically replaced, the same series
        out = tmp_path / "once.prom"
        _metrics(agent, str(out))
        assert set(parse_exposition(out.read_text())) == set(parse_exposition(_metrics(agent)))

        # the services moved to other slots (their order swapped): each slot counted another port,
        # so both start from zero; the node totals stay
        agent.config.services = agent.config.services[::-1]
        agent.write_config(agent.config)
        agent.policy()
        m = parse_exposition(_metrics(agent))
        assert per_service(m, "ccs_edge_connections_established_total") == {"video": 0, "web": 0}, \
            "a slot whose port changed starts from zero"
        assert agent.status()["counters"]["established"] == 2 + n, "the node total stays"
        assert cc_of(plain, "127.51.0.9") == default and cc_of(ab, evens[0]) == default
        m = parse_exposition(_metrics(agent))
        assert per_service(m, "ccs_edge_connections_established_total") == {"video": 1, "web": 1}
        assert per_service(m, "ccs_edge_ab_control_total") == {"video": 0, "web": 1}, "web's A/B control, in its new slot"

        # detached: the exposition says so and the table is no longer enforced
        agent.detach()
        m = parse_exposition(_metrics(agent))
        assert m[("ccs_edge_attached", ())] == 0 and m[("ccs_edge_table_enforced", ())] == 0
    finally:
        plain.close()
        ab.close()
        unserved.close()


def test_metrics_file_is_a_config_key(tmp_path):
    """metrics_file round-trips through the config the agent reads (both readers)."""
    c = EdgeConfig(node_id="n", metrics_file="/var/lib/prometheus/node-exporter/ccs.prom")
    p = tmp_path / "edge.yaml"
    p.write_text(c.to_yaml())
    assert EdgeConfig.from_yaml(str(p)).metrics_file == c.metrics_file
