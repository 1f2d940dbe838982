"""Monitoring of the one-machine topology (issue 59): Debian's Prometheus and Alertmanager on this
machine, and node_exporter inside each edge host's network namespace.

  node_exporter   one per namespaced node (topology/edges.py), started in the node's namespace
                  on its own address (`cluster.node_exporter_port`), with only the textfile
                  collector on the folder the node's agent rewrites its metrics file in
                  (export/edge/metrics.c): what an edge of a real fleet runs
  platform        node_exporter on this machine at `cluster.platform_exporter` (when set), its
                  textfile collector on `<cluster.home>/monitoring/textfile/`, where `ccs stream
                  --metrics-file` keeps the data path's metrics (flows/stream_metrics.py): job
                  `ccs-platform`
  alertmanager    `cluster.alertmanager`'s address; alerts kept, none sent anywhere (a receiver
                  without integrations: the operator points it at their pager)
  prometheus      `cluster.prometheus`'s address; scrapes every node's node_exporter over its veth
                  (job `ccs-edge`, each target labelled `node`), evaluates infra/prometheus/rules.yml
                  every `cluster.scrape_interval_s`, sends alerts to the Alertmanager

Configurations are generated into `<cluster.home>/monitoring/` at `up`; data there too. The part
exists only when `cluster.prometheus` is set. docs/operations-metrics.md says how to point an
existing Prometheus at a fleet instead.
"""
from __future__ import annotations

import ipaddress
import os
import shutil
from pathlib import Path

import yaml

from ccselect.config import Config, project_root
from ccselect.export.delivery.rollout import Node, host_dir, netns_argv

from ccselect.topology import address, edges, home
from ccselect.topology.proc import ClusterError, Server, free_port, http_ok

RULES = project_root() / "infra" / "prometheus" / "rules.yml"
#: the Debian packages' binaries (make sysdeps installs them)
BINARIES = {"prometheus": "prometheus", "alertmanager": "prometheus-alertmanager",
            "node_exporter": "prometheus-node-exporter"}


def _dir(cfg: Config) -> Path:
    return Path(home(cfg)) / "monitoring"


def _node_ip(node: Node) -> str:
    return str(ipaddress.ip_interface(node.address).ip)


def _exporters(cfg: Config) -> list[tuple[Node, Server]]:
    port = cfg.settings.cluster.node_exporter_port
    return [(n, Server(f"node-exporter-{n.node_id}", Path(host_dir(cfg, n.node_id)) / "node-exporter",
                       port, _node_ip(n))) for n in edges.nodes(cfg)]


def platform_textfile_dir(cfg: Config) -> Path:
    """Where the data path's textfiles go (`ccs stream --metrics-file <this>/ccs-stream.prom`)."""
    return _dir(cfg) / "textfile"


def _platform(cfg: Config) -> list[Server]:
    url = cfg.settings.cluster.platform_exporter
    if not url:
        return []
    host, port = address(url, 9100)
    return [Server("node-exporter-platform", _dir(cfg) / "node-exporter", port, host)]


def servers(cfg: Config) -> list[Server]:
    c = cfg.settings.cluster
    if not c.prometheus:
        return []
    am_host, am_port = address(c.alertmanager, 9093)
    p_host, p_port = address(c.prometheus, 9090)
    return ([s for _, s in _exporters(cfg)] + _platform(cfg)
            + [Server("alertmanager", _dir(cfg) / "alertmanager", am_port, am_host),
               Server("prometheus", _dir(cfg) / "prometheus", p_port, p_host)])


def prometheus_config(cfg: Config) -> dict:
    """prometheus.yml: the edge hosts' node_exporters (job ccs-edge, label node), the rules, the
    Alertmanager."""
    c = cfg.settings.cluster
    every = f"{c.scrape_interval_s:g}s"
    am_host, am_port = address(c.alertmanager, 9093)
    return {
        "global": {"scrape_interval": every, "evaluation_interval": every, "scrape_timeout": every},
        "rule_files": [str(RULES)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"{am_host}:{am_port}"]}]}]},
        "scrape_configs": [{
            "job_name": "ccs-edge",
            "static_configs": [{"targets": [f"{s.host}:{s.port}"], "labels": {"node": n.node_id}}
                               for n, s in _exporters(cfg)],
        }] + [{"job_name": "ccs-platform", "static_configs": [{"targets": [f"{s.host}:{s.port}"]}]}
              for s in _platform(cfg)],
    }


def alertmanager_config(cfg: Config) -> dict:
    """alertmanager.yml: one receiver without integrations (the alerts are kept and served by the
    API; an operator adds their pager here), grouped per alert and node."""
    every = f"{cfg.settings.cluster.scrape_interval_s:g}s"
    return {"route": {"receiver": "operators", "group_by": ["alertname", "node"],
                      "group_wait": every, "group_interval": every, "repeat_interval": "4h"},
            "receivers": [{"name": "operators"}]}


def _binary(name: str) -> str:
    path = shutil.which(BINARIES[name])
    if path is None:
        raise ClusterError(f"{BINARIES[name]} is not installed (Debian's package of that name: make sysdeps)")
    return path


def up(cfg: Config, env: dict[str, str]) -> None:
    """node_exporter in every edge host and the platform's, then Alertmanager, then Prometheus
    (each left alone when it runs already); Prometheus is up when /-/ready answers."""
    c = cfg.settings.cluster
    if not c.prometheus:
        return
    # without root there are no edge hosts (topology/__init__.py skips them): Prometheus then
    # finds their targets down, and says so (CcsEdgeScrapeDown)
    for node, srv in _exporters(cfg) if os.geteuid() == 0 else []:
        if node.netns not in edges.namespaces():
            raise ClusterError(f"{node.node_id}: netns {node.netns} is missing (`ccs cluster up` makes "
                               "the edge hosts before their node_exporters)")
        tdir = edges.textfile_dir(cfg, node)
        tdir.mkdir(parents=True, exist_ok=True)
        srv.start(netns_argv(node.netns) + [
            _binary("node_exporter"), f"--web.listen-address={srv.host}:{srv.port}",
            "--collector.disable-defaults", "--collector.textfile",
            f"--collector.textfile.directory={tdir}"], env=env, timeout=30)
    for srv in _platform(cfg):
        if srv.running():
            continue
        free_port(srv.host, srv.port)
        platform_textfile_dir(cfg).mkdir(parents=True, exist_ok=True)
        srv.start([_binary("node_exporter"), f"--web.listen-address={srv.host}:{srv.port}",
                   "--collector.disable-defaults", "--collector.textfile",
                   f"--collector.textfile.directory={platform_textfile_dir(cfg)}"], env=env, timeout=30)
    am, prom = servers(cfg)[-2:]
    for srv, conf, argv in (
            (am, alertmanager_config(cfg), lambda f: [
                _binary("alertmanager"), f"--config.file={f}", f"--storage.path={am.home / 'data'}",
                f"--web.listen-address={am.host}:{am.port}", "--cluster.listen-address="]),
            (prom, prometheus_config(cfg), lambda f: [
                _binary("prometheus"), f"--config.file={f}", f"--storage.tsdb.path={prom.home / 'data'}",
                f"--web.listen-address={prom.host}:{prom.port}"])):
        if srv.running():
            continue
        free_port(srv.host, srv.port)
        srv.home.mkdir(parents=True, exist_ok=True)
        path = srv.home / f"{srv.name}.yml"
        path.write_text(yaml.safe_dump(conf, sort_keys=False))
        srv.start(argv(path), env=env, timeout=60,
                  ready=lambda s=srv: http_ok(f"http://{s.host}:{s.port}/-/ready"))
