"""Python wrapper around the `ccs-edge` agent binary (export/edge/ccs.c and the files beside it).

Used by the rollout code and by tests/kernel. Every method runs one agent command; failures raise
`EdgeAgentError` carrying the agent's stderr (for a refused table, the reason it was refused).

    agent = EdgeAgent(config=EdgeConfig(pin_dir="/sys/fs/bpf/ccs", public_key="pub.pem",
                                        services=[Service(443, "video", caps=True)]))
    agent.attach("/sys/fs/cgroup/unified/edge")
    agent.load("tables/table-42.manifest.json")
    agent.status()["counters"]["hit_bbr"]
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import weakref
from dataclasses import dataclass, field

import yaml

from ccselect.config import project_root
from ccselect.contract import ROTATE_MINUTES

DEFAULT_BINARY = str(project_root() / "export" / "build" / "ccs-edge")


class EdgeAgentError(RuntimeError):
    def __init__(self, cmd, returncode, stdout, stderr):
        super().__init__(f"{' '.join(cmd)} -> {returncode}: {stderr.strip() or stdout.strip()}")
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


@dataclass
class Service:
    port: int
    name: str = ""
    ab: bool = False
    caps: bool = False
    # when the table's flow tree decides (export/edge/README.md; table_format.FLOW_MODES)
    flow_mode: str = "off"


FLOW_MODES = ("off", "fill", "combine", "flow", "prior")
ROUTE_CCS = ("auto", "on", "off")
_STR_KEYS = ("node_id", "cgroup", "pin_dir", "public_key", "default_cc", "log_dir", "route_ccs", "route_table",
             "route_spec", "route_within", "metrics_file", "state_dir")
# the agent's bound on one table's step past the floor's version, within an epoch (ccs.h)
VERSION_MAX_STEP = 100000
# the agent's compiled caps on one table (ccs.h CCS_MAX_ENTRIES, ccs_table.h CCS_TREE_MAX_NODES,
# agent.h CCS_MAX_TABLE_BYTES: the header, that many entries and a full tree): a configured cap
# (CAP_KEYS) may only lower them
MAX_ENTRIES = 4_000_000
TREE_MAX_NODES = 511
MAX_TABLE_BYTES = 64 + MAX_ENTRIES * 40 + TREE_MAX_NODES * 16
#: the config keys of the caps (issue 58), written from export.guards by the deployment
#: (rollout.load_fleet); None: not written, the agent's compiled bound
CAP_KEYS = ("max_entries", "max_tree_nodes", "max_artifact_bytes", "max_growth", "growth_floor_entries")
_CAP_RANGES = {"max_entries": (1, MAX_ENTRIES), "max_tree_nodes": (2, TREE_MAX_NODES + 1),
               "max_artifact_bytes": (1, MAX_TABLE_BYTES), "growth_floor_entries": (0, MAX_ENTRIES)}
_SERVICE_KEYS = {"port", "name", "ab", "caps", "flow_mode"}


def _yaml_str(v: str) -> str:
    """A string as a YAML double-quoted scalar both readers take the same way (the agent's
    config.c handles the \\" and \\\\ escapes; a control character is refused by both)."""
    return json.dumps(str(v), ensure_ascii=False)


@dataclass
class EdgeConfig:
    """The agent config (infra/edge/edge.yaml). Written in the YAML subset the agent reads
    (export/edge/config.c: strict, unknown keys and malformed values are errors)."""

    node_id: str = "edge"
    cgroup: str = ""
    pin_dir: str = "/sys/fs/bpf/ccs"
    public_key: str = ""
    default_cc: str = ""
    sample_rate: float = 0.01
    log_dir: str = ""
    # transport log segments every N minutes (a divisor of the hour); 0: hourly files, appended to
    rotate_minutes: int = 1
    # route CCs (export/edge/routes.c, issue 29): the live table's CCs also as routes (congctl),
    # in this routing table, each route saying route_spec, for entries inside route_within.
    # route_ccs: auto (on where the namespace can carry them: policy routing and a nexthop, the
    # default route's unless route_spec says one; issue 56), on (an error where it cannot), off.
    # route_table "": the agent's own (from pin_dir); route_within "": every prefix.
    # The agent's default, and a config file's without the key (from_yaml), is auto. A config
    # built in code says off unless it asks: the tests, benches and the local fleet run agents in
    # a shared machine's root network namespace, whose routes they must not write.
    route_ccs: str = "off"
    route_table: str = ""
    route_spec: str = ""
    route_within: str = ""
    # Prometheus text format for node_exporter's textfile collector, rewritten by `run`
    # (export/edge/metrics.c); "" = off
    metrics_file: str = ""
    # the version rule's floor, on disk (export/edge/floor.c): "" = /var/lib/ccs-edge/<pin dir name>
    state_dir: str = ""
    # the most one table's version may pass the floor's within an epoch (1..2^32)
    version_max_step: int = VERSION_MAX_STEP
    # caps on one table (issue 58, export/edge/README.md "Caps"): over one, a load is refused
    # naming it and the live table stays. max_tree_nodes: a tree of that many nodes or more
    # (export.guards.max_tree_nodes' rule); max_growth: entries or bytes over that many times the
    # live table's, once it has growth_floor_entries (0: not judged). None: not in the file
    max_entries: int | None = None
    max_tree_nodes: int | None = None
    max_artifact_bytes: int | None = None
    max_growth: float | None = None
    growth_floor_entries: int | None = None
    services: list[Service] = field(default_factory=list)

    def check_caps(self, where: str = "config") -> None:
        """The caps within the agent's ranges (config.c parse_cap), ValueError naming the key."""
        for k, (lo, hi) in _CAP_RANGES.items():
            v = getattr(self, k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi):
                raise ValueError(f"{where}: {k} {v!r} is not an integer in {lo}..{hi} (the agent's bound)")
        g = self.max_growth
        if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or not (g == 0 or 1 <= g <= 1000)):
            raise ValueError(f"{where}: max_growth {g!r} is not 0 (off) or a number in 1..1000")

    def to_yaml(self) -> str:
        # route_ccs only when not the default (auto), as version_max_step: a config without it
        # is read the same by an agent from before the key
        lines = [f"{k}: {_yaml_str(getattr(self, k))}" for k in _STR_KEYS
                 if getattr(self, k) not in ("", "auto" if k == "route_ccs" else "")]
        lines.append(f"sample_rate: {float(self.sample_rate)!r}")
        lines.append(f"rotate_minutes: {int(self.rotate_minutes)}")
        if int(self.version_max_step) != VERSION_MAX_STEP:
            lines.append(f"version_max_step: {int(self.version_max_step)}")
        self.check_caps()
        for k in CAP_KEYS:
            v = getattr(self, k)
            if v is not None:
                lines.append(f"{k}: {float(v)!r}" if k == "max_growth" else f"{k}: {int(v)}")
        lines.append("services:")
        for s in self.services:
            lines.append(f"  - {{port: {int(s.port)}, name: {_yaml_str(s.name or 'svc' + str(s.port))}, "
                         f"ab: {str(bool(s.ab)).lower()}, caps: {str(bool(s.caps)).lower()}"
                         + (f", flow_mode: {s.flow_mode}" if s.flow_mode != "off" else "") + "}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_yaml(cls, path: str) -> "EdgeConfig":
        """Read a config the way the agent does: unknown keys, non-boolean booleans, ports and
        rates that are not numbers in range are errors (ValueError naming the key)."""
        with open(path) as f:
            d = yaml.safe_load(f) or {}
        if not isinstance(d, dict):
            raise ValueError(f"{path}: not a mapping")
        unknown = set(d) - set(_STR_KEYS) - {"sample_rate", "rotate_minutes", "version_max_step", "services", *CAP_KEYS}
        if unknown:
            raise ValueError(f"{path}: unknown keys {sorted(unknown)}")
        svcs = []
        for s in d.pop("services", None) or []:
            if not isinstance(s, dict) or set(s) - _SERVICE_KEYS or "port" not in s:
                raise ValueError(f"{path}: service {s!r}: keys are port (required), name, ab, caps, flow_mode")
            port = s["port"]
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise ValueError(f"{path}: service port {port!r} is not an integer in 1..65535")
            for k in ("ab", "caps"):
                if not isinstance(s.get(k, False), bool):
                    raise ValueError(f"{path}: service {port}: {k}: {s[k]!r} is not a boolean")
            mode = s.get("flow_mode", "off")
            if mode not in FLOW_MODES:
                raise ValueError(f"{path}: service {port}: flow_mode {mode!r} is not one of {', '.join(FLOW_MODES)}")
            svcs.append(Service(port, str(s.get("name", "")), s.get("ab", False), s.get("caps", False), mode))
        if len({s.port for s in svcs}) != len(svcs):
            raise ValueError(f"{path}: two services on one port")
        if len(svcs) > 256:
            raise ValueError(f"{path}: more than 256 services")
        rate = d.get("sample_rate", 0.01)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            raise ValueError(f"{path}: sample_rate {rate!r} is not a number in 0..1")
        rotate = d.get("rotate_minutes", 1)
        if isinstance(rotate, bool) or not isinstance(rotate, int) or rotate not in (0, *ROTATE_MINUTES):
            raise ValueError(f"{path}: rotate_minutes {rotate!r} does not divide the hour "
                             f"(one of {', '.join(map(str, ROTATE_MINUTES))}; or 0 for hourly files)")
        step = d.get("version_max_step", VERSION_MAX_STEP)
        if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= 2**32:
            raise ValueError(f"{path}: version_max_step {step!r} is not an integer in 1..2^32")
        known = {k: ("" if d[k] is None else str(d[k])) for k in _STR_KEYS if k in d}
        if known.get("state_dir") and not known["state_dir"].startswith("/"):
            raise ValueError(f"{path}: state_dir {known['state_dir']!r} is not an absolute path")
        if known.get("route_ccs", "auto") not in ROUTE_CCS:
            raise ValueError(f"{path}: route_ccs {known['route_ccs']!r} is not one of {', '.join(ROUTE_CCS)}")
        known.setdefault("route_ccs", "auto")   # the agent's default for a file without it
        out = cls(services=svcs, sample_rate=float(rate), rotate_minutes=rotate,
                  version_max_step=step, **known, **{k: d[k] for k in CAP_KEYS if k in d})
        out.check_caps(path)
        return out


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class EdgeAgent:
    def __init__(self, config: EdgeConfig | None = None, config_path: str | None = None,
                 binary: str = DEFAULT_BINARY, timeout: float = 60.0):
        if config is None and config_path is None:
            raise ValueError("EdgeAgent needs a config or a config_path")
        self.binary = binary
        self.timeout = timeout
        self._tmp = None
        if config is not None:
            self._tmp = tempfile.NamedTemporaryFile("w", prefix="ccs-edge-", suffix=".yaml",
                                                    delete=False)
            self._tmp.write(config.to_yaml())
            self._tmp.close()
            config_path = self._tmp.name
            # the file goes with the agent object even when nobody calls close()
            self._cleanup = weakref.finalize(self, _unlink, config_path)
            self.config = config
        else:
            self.config = EdgeConfig.from_yaml(config_path)
        self.config_path = config_path

    def write_config(self, config: EdgeConfig) -> None:
        """Replace the config (e.g. new services), then call policy() or attach() to apply it."""
        self.config = config
        with open(self.config_path, "w") as f:
            f.write(config.to_yaml())

    def close(self) -> None:
        if self._tmp is not None:
            self._cleanup()

    # -- commands -----------------------------------------------------------------------------
    def _argv(self, *args: str) -> list[str]:
        return [self.binary, "--config", self.config_path, *args]

    def _run(self, *args: str) -> str:
        cmd = self._argv(*args)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout)
        if r.returncode != 0:
            raise EdgeAgentError(cmd, r.returncode, r.stdout, r.stderr)
        return r.stdout

    def attach(self, cgroup: str | None = None, sample_rate: float | None = None) -> str:
        args = ["attach"]
        if cgroup:
            args += ["--cgroup", cgroup]
        if sample_rate is not None:
            args += ["--sample-rate", repr(float(sample_rate))]
        return self._run(*args)

    def detach(self, purge: bool = False) -> str:
        return self._run("detach", *(["--purge"] if purge else []))

    def policy(self) -> str:
        return self._run("policy")

    def load(self, manifest: str, allow_downgrade: bool | int | str = False) -> dict:
        """Verify and swap in a table; returns the agent's timings. Raises on refusal.

        (epoch, version) only goes forward: a table older than one loaded before is refused
        (replay) unless `allow_downgrade` -- True (the manifest's own epoch and version), that
        version (of the floor's epoch) or "EPOCH:VERSION" -- names it: the explicit override the
        agent logs and counts (status()["overrides"])."""
        args = ["load", manifest, "--json"]
        if allow_downgrade is not False and allow_downgrade is not None:
            if allow_downgrade is True:
                with open(manifest, "rb") as f:
                    m = json.loads(f.read())
                allow_downgrade = f"{int(m.get('epoch', 0))}:{int(m['version'])}"
            args += ["--allow-downgrade", str(allow_downgrade)]
        return json.loads(self._run(*args))

    def floor(self) -> dict:
        """The version rule's floor as the agent keeps it on disk (`ccs-edge floor --json`)."""
        return json.loads(self._run("floor", "--json"))

    def rollback(self) -> str:
        """The previous slot's table made live again (to an older version: the agent's own
        logged override of the version rule)."""
        return self._run("rollback")

    def status(self) -> dict:
        return json.loads(self._run("status", "--json"))

    def log(self, out_dir: str) -> int:
        """Drain the ring buffer once into <out_dir>/transport/<node>/ (segments, closed at the end
        of the drain, or hourly files: `rotate_minutes`); -> records."""
        out = self._run("log", "--out", out_dir, "--drain")
        return int(out.split()[0])

    def run(self, out_dir: str | None = None) -> subprocess.Popen:
        """Start the long-running agent (transport log + TTL watchdog); stop() it when done."""
        args = ["run"] + (["--out", out_dir] if out_dir else [])
        return subprocess.Popen(self._argv(*args), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    @staticmethod
    def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 10.0):
        if proc.poll() is None:
            proc.send_signal(sig)
        try:
            return proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.communicate()
