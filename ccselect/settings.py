"""The configuration as typed settings: one frozen dataclass per section of `infra/conf/<env>.yaml`,
read as `cfg.settings.<section>` (`Config.settings`, built and checked when the file is loaded).

Where the defaults live: here, and only here. A field with a default holds the value every
environment runs unless its file says otherwise; the shipped files do not repeat those values
(tests/test_settings.py checks it), so a default is changed in one place. A field without a
default is one that differs per environment or is an operator's decision (paths and URIs, the
Spark master, the simulated fleet's size, the model gate, whether to deploy and auto-promote,
which services get AutoPlex caps): every environment's file must give it, and a file that forgets
one fails at load. Why the classes and not the YAML: the jobs, tests and benchmarks build these
objects without a file (`InferSettings(precision="bf16")`, `DistillSettings(fidelity=0.99)`), so
the classes need defaults anyway; keeping a second copy in the YAML is what let the two drift.

Loading is strict: a key that no field reads (`expiry_hour:` for `expiry_hours:`) is an error
naming the key and the file, and so is a value of the wrong kind (a string for a number, a number
for a flag); each class checks its own ranges in `__post_init__`. `data_root` and `env` stay
top-level scalars (`Config.data_root`, `Config.env`), as `${data_root}` interpolation needs them.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ccselect.contract import FEATURES, HANDSHAKE_FEATURES


class ConfigError(ValueError):
    """A configuration file that does not fit the settings (unknown key, wrong type, bad range)."""


class _Section:
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- platform -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SparkSettings(_Section):
    """`spark:` the master, extra Maven packages and session conf (ccselect/spark.py)."""
    master: str                                         # local[*], spark://..., yarn, k8s://...
    extra_packages: tuple[str, ...]                     # besides Delta's jars
    conf: dict[str, str | int | float | bool]           # spark.* keys, passed as strings
    app_name: str = "ccselect"


@dataclass(frozen=True)
class LakeSettings(_Section):
    """`lake:` Delta tables live at <root>/<layer>/<table>. `ccs maintain` (jobs/maintain.py)
    compacts a table's closed hours (all but the newest `open_hours`, which the stream still
    appends to) and keeps time travel for `retention_days` (VACUUM's retention, and the Delta
    log's and deleted files' retention as table properties)."""
    root: str
    retention_days: float = 7.0       # Delta's own default for deleted files (delta.deletedFileRetentionDuration)
    open_hours: int = 2

    def __post_init__(self):
        if self.retention_days < 0 or self.open_hours < 0:
            raise ValueError("lake: retention_days and open_hours must be >= 0")


@dataclass(frozen=True)
class MlflowSettings(_Section):
    """`mlflow:` tracking and registry store, artifact root, and the registered model's name.

    With a tracking server (`tracking_uri: http://...`), `backend_store_uri` is the server's own
    database and `artifact_root` where the server keeps artifacts (it serves them to clients);
    `ccs cluster up` starts that server from these keys."""
    tracking_uri: str
    artifact_root: str
    model_name: str = "ccs-nettype"
    backend_store_uri: str | None = None                # the tracking server's database (postgresql://...)


@dataclass(frozen=True)
class AirflowSettings(_Section):
    """`airflow:` AIRFLOW_HOME of the project's Airflow (flows/airflow_env.py); its metadata database
    (None: SQLite under the home, for `dag.test()`), executor, and the API server the scheduler's
    task runners report to (None: no scheduler; the DAGs run through `dag.test()`)."""
    home: str
    sql_alchemy_conn: str | None = None                 # postgresql+psycopg2://user@host:port/airflow
    executor: str = "LocalExecutor"
    api_url: str | None = None                          # http://host:port (Airflow 3's API server)


@dataclass(frozen=True)
class ObjectStoreSettings(_Section):
    """`object_store:` the S3-compatible store the lake, MLflow's artifacts and the signed tables
    live on when their paths are s3:// or s3a:// (None endpoint: AWS's own). Credentials never go
    here: they come from the environment or the SDK's standard chain (AWS_ACCESS_KEY_ID...,
    AWS_SHARED_CREDENTIALS_FILE and AWS_PROFILE)."""
    endpoint: str | None = None                         # http://host:port of an S3-compatible server
    region: str = "us-east-1"
    path_style: bool = True                             # bucket in the path, not in the host name


@dataclass(frozen=True)
class ClusterSettings(_Section):
    """`cluster:` what `ccs cluster up` starts on one machine besides the addresses the other
    sections give (topology/): the Spark standalone workers and the object store's server."""
    home: str | None = None                             # the servers' data, logs and pid files
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "3g"
    s3proxy_version: str = "4.1.0"                      # org.gaul:s3proxy from Maven Central
    buckets: tuple[str, ...] = ()                       # created on the store at `up`
    # monitoring (topology/monitoring.py, issue 59): Debian's Prometheus and Alertmanager at
    # these URLs (None: not part of the topology), node_exporter in each edge host on its address
    prometheus: str | None = None                       # e.g. http://127.0.0.1:19090
    alertmanager: str | None = None                     # e.g. http://127.0.0.1:19093
    node_exporter_port: int = 9100
    # node_exporter on this machine for the data path's textfiles (`ccs stream --metrics-file
    # <cluster.home>/monitoring/textfile/ccs-stream.prom`): job ccs-platform; None: not started
    platform_exporter: str | None = None                # e.g. http://127.0.0.1:19100
    scrape_interval_s: float = 15.0                     # scrape and rule evaluation interval

    def __post_init__(self):
        if self.workers < 1 or self.worker_cores < 1:
            raise ValueError("cluster.workers and cluster.worker_cores must be at least 1")
        if bool(self.prometheus) != bool(self.alertmanager):
            raise ValueError("cluster.prometheus and cluster.alertmanager go together (both, or neither)")
        if self.scrape_interval_s <= 0:
            raise ValueError(f"cluster.scrape_interval_s must be positive, got {self.scrape_interval_s}")


#: `ingest.imputable_features`' default: the send window, which `tcp_info` gives only from Linux
#: 6.2 on (`tcpi_snd_wnd`, docs/contract.md); every other Table 4 feature is in `tcp_info` or
#: `ss -ti` on any kernel the agent runs on, so a record without one is broken, not old.
SEND_WINDOW_FEATURES = ("init_snd_wnd_bytes", "max_snd_wnd_bytes", "min_snd_wnd_bytes")


@dataclass(frozen=True)
class IngestSettings(_Section):
    """`ingest:` what ingest accepts (jobs/parse.py). `missing_features`: a transport record
    missing some of the Table 4 features (older kernels do not report the send window) is
    `quarantine`d naming every missing field, or, with `impute`, accepted with the missing ones
    that `imputable_features` names null and listed in silver's `imputed` (training leaves such
    rows out; inference uses the training mean); a record missing any other field is quarantined
    naming exactly those (issue 57: a record with none of the twelve features, or without
    `mss_bytes`, was accepted and scored at the training mean). The default list is the send
    window (SEND_WINDOW_FEATURES), as many as `infer.ood_max_imputed` (3) still scores."""
    missing_features: str = "quarantine"
    imputable_features: tuple[str, ...] = SEND_WINDOW_FEATURES

    def __post_init__(self):
        if self.missing_features not in ("quarantine", "impute"):
            raise ValueError(f"ingest.missing_features must be quarantine or impute, not {self.missing_features!r}")
        unknown = [f for f in self.imputable_features if f not in FEATURES]
        if unknown:
            raise ValueError(f"ingest.imputable_features: {unknown} are not Table 4 features "
                             f"(contract.FEATURES: {', '.join(FEATURES)})")


@dataclass(frozen=True)
class SimulateSettings(_Section):
    """`simulate:` the fleet `make run` simulates (sim/params.py SimParams holds every other
    simulator knob)."""
    out: str
    nodes: int
    hours: int
    start: str                                          # ISO time of the first hour, UTC
    seed: int
    conns_per_node_hour: int
    # the streams as the agent's rotated segments every N minutes (issue 26); 0: hourly files
    rotate_minutes: int = 0
    # the simulator's stress knob SimParams.client_window: "stacks" (the grounded window) or
    # "per_type_tables" (the pre-2026-11-28 window, kept only for docs/results/window-before-after.md)
    client_window: str = "stacks"

    def __post_init__(self):
        for name in ("nodes", "hours", "conns_per_node_hour"):
            if getattr(self, name) < 1:
                raise ValueError(f"simulate.{name} must be at least 1, got {getattr(self, name)}")
        if self.client_window not in ("stacks", "per_type_tables"):
            raise ValueError(f"simulate.client_window must be stacks or per_type_tables, not {self.client_window!r}")
        if not 0 <= self.rotate_minutes <= 30 or (self.rotate_minutes and 60 % self.rotate_minutes):
            raise ValueError(f"simulate.rotate_minutes must be 0 or divide the hour, not {self.rotate_minutes}")


# ---- AutoPlex and the emulation ---------------------------------------------------------------------

@dataclass(frozen=True)
class PolicySettings(_Section):
    """A user-defined policy P_usr of AutoPlex Algorithm 1 (jobs/autoplex.py Policy checks the
    metric's name): sort by `metric` (`asc` or `desc`), keep the [lo, hi) percentile band."""
    name: str
    metric: str
    band: tuple[float, float]
    direction: str = "asc"
    min_sessions: int = 20                              # groups with fewer sessions get no parameters


#: where `ccs infer` and `ccs autoplex` run: see InferSettings.engine, AutoplexSettings.engine
ENGINES = INFER_ENGINES = ("auto", "arrow", "spark")


@dataclass(frozen=True)
class AutoplexSettings(_Section):
    """`autoplex:` AutoPlex (autoplex-nai22.txt): period T, the user-group rule (ug_id = region +
    ASN, §3.3), the policies, §3.4's similarity bands, and where caps go into exported entries."""
    caps_services: dict[str, bool]                      # service -> caps switched on
    period_minutes: int = 30
    group_by: tuple[str, ...] = ("ug_id",)
    policies: tuple[PolicySettings, ...] = (
        PolicySettings("low_retrans", "retrans_ratio", (5.0, 20.0), "asc", 20),
        PolicySettings("high_goodput_per_srtt", "goodput_per_srtt", (80.0, 95.0), "desc", 20),
    )
    similarity_better_band: tuple[float, float] = (5.0, 20.0)   # retransmission-ratio percentiles
    similarity_worse_band: tuple[float, float] = (75.0, 90.0)
    # auto: the driver-side Arrow engine (jobs/autoplex_arrow.py: Delta files → NumPy → Delta, no
    # Spark) where it can run (a local lake, plain Delta tables), else the Spark job
    # (jobs/autoplex.py); arrow: that engine or an error; spark: always the Spark job
    engine: str = "auto"

    def __post_init__(self):
        p = self.period_minutes
        if p < 1 or (60 % p != 0 and p % 60 != 0):
            raise ValueError(f"autoplex.period_minutes must divide an hour or be whole hours, got {p}")
        if self.engine not in ENGINES:
            raise ValueError(f"autoplex.engine must be one of {ENGINES}, not {self.engine!r}")


@dataclass(frozen=True)
class EmulateSettings(_Section):
    """`emulate:` trace-driven QoE emulation (`ccs emulate`, ALICCS §5.4) and its baselines."""
    window_minutes: int = 60              # estimation windows
    alpha: float = 0.8                    # §5.4: QoE = 1 − α·rebuffer − (1 − α)·retransmission
    train_hours: int = 6                  # hours before the range the learned baselines train on
    table_lag_hours: int = 1              # the aliccs table is built from this many hours before
    default_cc: str = "cubic"             # what a policy without a decision keeps
    min_cell_sessions: int = 5            # cells (node, window, /24, type) in the distributions
    epsilon: float = 0.1                  # Configanator's ε-bandit
    tree_depth: int = 8                   # Configanator's and Disco's decision trees
    tree_min_leaf: int = 50
    ucb_c: float = 1.0                    # Pytheas: exploration weight (× the reward's std)
    ucb_discount: float = 0.995           # Pytheas: discounted UCB for non-stationary groups
    bootstrap_reps: int = 400             # resamples of nodes for the tail contrasts
    seed: int = 7
    # the streaming table (issue 26; ALICCS §3.3 / Observation IV: a prefix's type drifts, so the
    # table is rebuilt often): Algorithm 1 over the last stream_window_minutes of predictions,
    # rebuilt every stream_trigger_minutes; the table built at boundary b is live from b + delay
    stream_trigger_minutes: int = 5
    stream_window_minutes: int = 60
    stream_delay_minutes: int = 1         # processing and rotation
    stream_lags_minutes: tuple[int, ...] = (0, 5, 15, 30, 60)   # the lag curve (`--stream-lags`)


# ---- the model ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class GroupsSettings(_Section):
    """`model.groups:` prefix groups, the discriminators' targets (ALICCS §3.1): K per network
    type; None → the K in k_range with the best silhouette (models/groups.py)."""
    k: int | None = None
    k_range: tuple[int, int] = (2, 12)
    seed: int = 7


@dataclass(frozen=True)
class ConfiganatorSettings(_Section):
    """`model.configanator:` the Configanator-style baseline (Configanator §3.2): network classes by
    K-means over per-/24 means; k None → the smallest K in k_range whose per-class spread (RMS
    distance of member /24s to their centroid, standardized units) is at most nc_spread; then one
    decision tree with leaves of min_samples_leaf."""
    k: int | None = None
    k_range: tuple[int, int] = (2, 16)
    nc_spread: float = 1.0
    min_samples_leaf: int = 20
    seed: int = 7


@dataclass(frozen=True)
class EvaluateSettings(_Section):
    """`model.evaluate:` cross-node evaluation (ALICCS §5.1): train on `share` of the window's
    labelled nodes, test on the others; nodes with < min_class_share of either type stay out of
    the summary; train_seeds > 1 averages each node's accuracy over that many trainings."""
    share: float = 0.3
    seed: int = 0
    min_class_share: float = 0.05
    train_seeds: int = 1


@dataclass(frozen=True)
class SelectSettings(_Section):
    """`model.select:` the variant `pipeline.variant: select` trains, chosen on leave-node-out folds
    of the training nodes among `candidates` by ALICCS Appendix D's rule (models/select.py): least
    per-node spread among the candidates within `tolerance` of the best mean."""
    candidates: tuple[str, ...] = ("mlp", "aliccs", "aliccs_nodes")
    # leave-node-out folds of the training nodes; 0 (the default): one fold per training node
    # (leave-one-node-out), as the held-out nodes are scored, one at a time. On make run's window
    # (4 training nodes) 2 folds picked aliccs or mlp by how the nodes fell into the folds, and
    # leave-one-node-out (one way to split) took 1.8x their time (docs/results/select-folds.md)
    folds: int = 0
    tolerance: float = 0.005

    def __post_init__(self):
        if not self.candidates:
            raise ValueError("model.select.candidates must name at least one variant")
        if self.folds != 0 and self.folds < 2:
            raise ValueError(f"model.select.folds must be 0 (one per training node) or at least 2, got {self.folds}")


@dataclass(frozen=True)
class NodeStatsSettings(_Section):
    """`model.node_stats:` per-node standardization of a `*_nodestd` variant (features/node_stats.py):
    a (node, hour) is standardized over the node's connections of the `hours` hours ending with
    it (the scored hour included); a node with fewer than `min_conns` there gets the fleet's
    statistics the model was trained with. A trained model records both; inference uses its own."""
    hours: int = 24
    min_conns: int = 200

    def __post_init__(self):
        if self.hours < 1:
            raise ValueError(f"model.node_stats.hours must be at least 1, got {self.hours}")
        if self.min_conns < 1:
            raise ValueError(f"model.node_stats.min_conns must be at least 1, got {self.min_conns}")


@dataclass(frozen=True)
class GateSettings(_Section):
    """`model.gate:` validation gate of a newly registered version (models/registry.py): held-out
    per-node accuracy, and at most max_drop_vs_champion below @champion's mean and worst node."""
    min_mean_accuracy: float
    min_worst_accuracy: float
    max_drop_vs_champion: float


@dataclass(frozen=True)
class ModelSettings(_Section):
    """`model:` prefix groups, the Configanator baseline, the cross-node evaluation and the gate."""
    gate: GateSettings
    groups: GroupsSettings = field(default_factory=GroupsSettings)
    configanator: ConfiganatorSettings = field(default_factory=ConfiganatorSettings)
    evaluate: EvaluateSettings = field(default_factory=EvaluateSettings)
    select: SelectSettings = field(default_factory=SelectSettings)
    node_stats: NodeStatsSettings = field(default_factory=NodeStatsSettings)


PRECISIONS = ("fp32", "bf16")
OOD_METHODS = ("mahalanobis", "maxabs")


@dataclass(frozen=True)
class InferSettings(_Section):
    """`infer:` ALICCS §4.2's fallback: trust Wi-Fi when P(Wi-Fi) ≥ wifi_threshold and 4G/5G when
    P(4G) ≥ cell_threshold, else keep default_cc; Wi-Fi → CUBIC, 4G/5G → BBR (§2, Table 1)."""
    wifi_threshold: float = 0.8
    cell_threshold: float = 0.6
    default_cc: str = "cubic"
    wifi_cc: str = "cubic"
    cell_cc: str = "bbr"
    precision: str = "fp32"      # fp32 | bf16 (docs/results/champion-bf16.md: held-out accuracy)
    batch_rows: int = 65536      # rows per Arrow batch handed to the model
    # auto: the driver-side Arrow engine (models/infer_arrow.py: Delta files → torch → Delta, no
    # Spark executors) where it can run (a local lake, reader protocol 1), else the Spark job
    # (models/infer.py); arrow: that engine or an error; spark: always the Spark job
    engine: str = "auto"
    # Out-of-domain guard (models/ood.py, fitted at training, registered with the model): a row
    # whose standardized features lie beyond the training rows' range by more than ood_margin (z
    # units), or whose distance score exceeds the ood_quantile of the training rows' scores, keeps
    # default_cc with decision "ood". ood_method: the score fitted by `ccs train`.
    ood_guard: bool = True
    ood_quantile: float = 0.999
    ood_margin: float = 1.0
    ood_method: str = "mahalanobis"  # mahalanobis | maxabs
    # Temperature scaling (models/ood.py) fitted by `ccs train`, applied to P(Wi-Fi) before the
    # thresholds above. calibration_on:
    #   heldout_nodes (default): on half of the labelled nodes the model did not train on (the
    #     other half reports the calibration error it leaves), so that the thresholds mean on a
    #     new node what §4.2 says. The held-out accuracy is unchanged: T keeps every argmax.
    #   training_paths: on calibration_share of the training nodes' (node, /24) paths, held out
    #     of the fit, never sharper than calibration_min_temperature. On the default fleet (12 × 8 h,
    #     aliccs) that temperature was 0.69 (sharper), and it raised the held-out nodes' ECE from
    #     0.062 to 0.108 (their own best temperature there was 1.27): confidence learnt on the
    #     training nodes does not carry to other nodes.
    # Minimum evidence (issue 57, item 3): a connection with fewer data segments, fewer bytes
    # acknowledged or a shorter life than these is not scored by the model: decision "evidence",
    # default_cc (its features do not mean what they meant in training; 212 monitoring probes of
    # 7 segments and 6 kB were decided `model/bbr`). A missing value is not judged. 0 switches
    # one off. Chosen from the rows training draws from (the tests' small fleet, 8 nodes × 6 h,
    # seed 11, 13,056 connections): 1% quantiles 8 segments, 11,047 bytes, 79 ms (minimum 22.75
    # ms); these minima decline 0.87% of those connections, and catch the probes' median (7
    # segments, 6 kB) and every 0-byte connection.
    min_data_segs: int = 8
    min_bytes_acked: int = 10_000
    min_duration_us: int = 20_000
    # A row with more imputed features than this (silver's `imputed`, `ingest.missing_features:
    # impute`) is out of domain (issue 57, item 4): imputed at the training mean, a record with
    # none of the twelve features sat at z = 0, the guard's centre, and was decided `model/cubic`.
    # 3: the send-window fields (init/min/max_snd_wnd_bytes) that tcp_info does not give may all
    # be imputed and the row still scored; a fourth makes it "ood". -1 switches it off.
    ood_max_imputed: int = 3
    calibrate: bool = True
    calibration_on: str = "heldout_nodes"
    calibration_share: float = 0.1
    calibration_min_temperature: float = 1.0

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"infer.precision must be one of {PRECISIONS}, not {self.precision!r}")
        if self.engine not in INFER_ENGINES:
            raise ValueError(f"infer.engine must be one of {INFER_ENGINES}, not {self.engine!r}")
        if self.ood_method not in OOD_METHODS:
            raise ValueError(f"infer.ood_method must be one of {OOD_METHODS}, not {self.ood_method!r}")
        if not 0.5 <= self.ood_quantile <= 1.0:
            raise ValueError(f"infer.ood_quantile must be in [0.5, 1], not {self.ood_quantile}")
        if not 0.0 <= self.calibration_share < 1.0:
            raise ValueError(f"infer.calibration_share must be in [0, 1), not {self.calibration_share}")
        if self.calibration_on not in ("heldout_nodes", "training_paths"):
            raise ValueError(f"infer.calibration_on must be heldout_nodes or training_paths, not {self.calibration_on!r}")


# ---- the distilled tree -----------------------------------------------------------------------

@dataclass(frozen=True)
class DistillSettings(_Section):
    """`distill:` ALICCS §3.2: the tree grows until its argmax agrees with the DNN's on `fidelity`
    of held-out rows, then deepens while a /16 with enough held-out rows agrees less than
    subset_fidelity."""
    fidelity: float = 0.95          # held-out argmax agreement the tree must reach
    max_depth: int = 20
    min_depth: int = 1
    holdout: float = 0.3            # share of rows held out for fidelity and accuracy
    subset_fidelity: float = 0.90   # per-/16 agreement below this triggers deepening (§3.2)
    subset_min_rows: int = 30       # held-out rows a /16 needs before its agreement counts
    min_samples_leaf: int = 5
    seed: int = 0


@dataclass(frozen=True)
class HandshakeSettings(_Section):
    """`handshake:` the per-flow tree over the handshake features (distill/handshake.py, issue 27),
    trained on the window's labelled connections in their natural mix; it ships in the table."""
    depth: int = 6                  # at most export/edge/ccs_table.h CCS_TREE_MAX_DEPTH (8)
    min_leaf: int = 50              # training rows per leaf at least
    seed: int = 7
    # the handshake features the tree may split on (a subset of contract.HANDSHAKE_FEATURES): leave
    # one out to measure what it carries (`ccs handshake --features`)
    features: tuple[str, ...] = HANDSHAKE_FEATURES

    def __post_init__(self):
        if not self.features or set(self.features) - set(HANDSHAKE_FEATURES) or len(set(self.features)) != len(self.features):
            raise ValueError(f"handshake.features must be distinct names from {HANDSHAKE_FEATURES}, not {self.features}")
        if not 1 <= self.depth <= 8:
            raise ValueError(f"handshake.depth must be in 1..8 (the kernel's bound), not {self.depth}")
        if self.min_leaf < 1:
            raise ValueError(f"handshake.min_leaf must be at least 1, not {self.min_leaf}")


@dataclass(frozen=True)
class DiagnoseSettings(_Section):
    """`diagnose:` SHAP on the distilled tree (distill/diagnose.py)."""
    accuracy_threshold: float = 0.80  # a /16 with DNN accuracy below this is diagnosed by default
    min_rows: int = 50                # rows a /16 needs to be ranked or diagnosed
    over_reliance: float = 1.5        # share in the subset / share overall at or above this ...
    min_excess: float = 0.05          # ... and at least this many share points above: over-relied
    max_rows: int = 20000             # rows (seeded sample) behind the global attribution
    top_features: int = 5
    seed: int = 0


# ---- the export -------------------------------------------------------------------------------

FAMILIES = {"v4": 4, "v6": 6}
BITS = {4: 32, 6: 128}


def _by_family(d: dict, name: str, fam: int, what: str):
    """A per-family mapping's entry, keyed by name ("v4", as in the YAML) or number (4)."""
    unknown = set(d) - set(FAMILIES) - set(FAMILIES.values())
    if unknown:
        raise ValueError(f"export.{what}: unknown families {sorted(map(str, unknown))}; known: v4, v6")
    return d.get(name, d.get(fam))


DECLINED_RULES = ("purity", "plurality")     # export.declined_rule


@dataclass(frozen=True)
class PrefixLadder(_Section):
    """`export.ladder` and `export.purity`: ALICCS §3.3 / Algorithm 1, generalized. A prefix ladder
    per family (multiples of 4 ending at the full length); a prefix becomes one table entry at the
    first level whose request-weighted purity passes, else its addresses go a level down. Purity
    thresholds per level are [min_requests, purity] tiers: busy prefixes need more purity
    (Appendix D); the last level (/32, /128) always becomes an entry.

    Given as in the YAML (families "v4"/"v6", levels as strings, tiers as lists), kept as
    family → levels and family → level → ((min_requests, purity), ...)."""
    ladder: dict[int, tuple[int, ...]] = field(default_factory=lambda: {
        "v4": (16, 24, 32), "v6": (32, 48, 64, 128)})
    purity: dict[int, dict[int, tuple[tuple[int, float], ...]]] = field(default_factory=lambda: {
        "v4": {16: ((0, 0.95), (5000, 0.98)), 24: ((0, 0.90), (1000, 0.95))},
        "v6": {32: ((0, 0.95), (5000, 0.98)), 48: ((0, 0.92), (2000, 0.96)), 64: ((0, 0.90), (1000, 0.95))}})
    # `export.min_support`: a prefix passes its level only with at least [connections, distinct
    # clients] under it (issue 57: one connection made a /16 entry); a level not named needs
    # [1, 1]. A last-level prefix below its support gets no entry (the edge's default CC).
    # Chosen on the default fleet's TRAINING nodes alone (docs/results/issue57-rules.md,
    # bench/issue57_rules.py's sweep: a chain of six settings from the weakest that refuses a
    # one-connection /16 and its /24 up to the former default v4 /16 10/2, /24 3/2, v6 /32 10/2,
    # /48 5/2, /64 3/2; the rule: the strongest meeting issue 57's 2% / 2% goal there, else the
    # nearest): none meets it there; these are the nearest, with all the rules 1.76% of the request
    # weight changed and aliccs' truth gain -2.52% (the former default 6.72%, -32.95%; the weakest,
    # v4 /16 2/1, /24 2/1, v6 /32 2/1: 0.87%, -3.81%). The cost is the /24 (v6 /48, /64) support:
    # refusing only the /16 and v6 /32 moves nothing there beyond the declined rule (0.06%, -0.76%).
    # Held out once after the choice: 1.42%, -0.72% (the goal met; the former default 4.98%,
    # -15.14% in that page at 93db464); 76.0% of the declined connections get the default CC
    # (80.7% under the former default there).
    min_support: dict[int, dict[int, tuple[int, int]]] = field(default_factory=lambda: {
        "v4": {16: (10, 2), 24: (2, 1)}, "v6": {32: (10, 2), 48: (2, 1)}})
    # `export.declined_rule`: how the decisions the model declined (DECLINED) weigh in a prefix.
    # purity: DECLINED is one more CC in every prefix's purity (a model CC's purity is over all
    # decisions). plurality: DECLINED competes only as the plurality: a prefix where it is the
    # heaviest is judged as under `purity` (no entry; passing, it ends its addresses' descent);
    # otherwise purity, weight and requests are over the model decisions alone (as before issue 57).
    # A tie goes to DECLINED under both. plurality, chosen on the default fleet's TRAINING nodes
    # alone (docs/results/issue57-rules.md, bench/issue57_rules.py: 4 training nodes, hours 04-05,
    # each under the table of the hour before): with all of issue 57's rules (min_support as
    # above) it changes the CC of 1.76% of the request weight against the table before them and
    # lowers aliccs' truth gain by 2.52% (purity: 6.11%, -11.93%); the declined rule alone 0.06%,
    # -0.76% (purity: 4.34%, -9.99%). Its cost: 68.3% of the connections the model declines get
    # the default CC at the edge (purity: 79.9%, before the rules 65.2%).
    declined_rule: str = "plurality"

    def __post_init__(self):
        ladder, purity, support = {}, {}, {}
        for name, fam in FAMILIES.items():
            levels = tuple(int(x) for x in (_by_family(self.ladder, name, fam, "ladder") or ()))
            if not levels or list(levels) != sorted(set(levels)):
                raise ValueError(f"export.ladder.{name} must be increasing: {levels}")
            if any(x % 4 or not 0 < x <= BITS[fam] for x in levels) or levels[-1] != BITS[fam]:
                raise ValueError(f"export.ladder.{name}: levels are multiples of 4 ending at "
                                 f"/{BITS[fam]}: {levels}")
            ladder[fam] = levels
            tiers = {}
            for lvl, ts in (_by_family(self.purity, name, fam, "purity") or {}).items():
                t = tuple(sorted((int(lo), float(p)) for lo, p in ts))
                if not t or any(not 0.0 <= p <= 1.0 for _, p in t):
                    raise ValueError(f"export.purity.{name}.{lvl}: tiers of [min_requests, 0..1]")
                tiers[int(lvl)] = t
            unknown = set(tiers) - set(levels)
            if unknown:
                raise ValueError(f"export.purity.{name} has levels not in the ladder: {unknown}")
            purity[fam] = tiers
            sup = {}
            for lvl, pair in ((_by_family(self.min_support, name, fam, "min_support") or {}).items()):
                c, k = (int(x) for x in pair)
                if int(lvl) not in levels or c < 0 or k < 0:
                    raise ValueError(f"export.min_support.{name}.{lvl}: [connections, clients] ≥ 0 "
                                     f"at a ladder level {levels}")
                sup[int(lvl)] = (c, k)
            support[fam] = sup
        object.__setattr__(self, "ladder", ladder)
        object.__setattr__(self, "purity", purity)
        object.__setattr__(self, "min_support", support)
        if self.declined_rule not in DECLINED_RULES:
            raise ValueError(f"export.declined_rule must be one of {DECLINED_RULES}, not {self.declined_rule!r}")

    def support(self, family: int, level: int) -> tuple[int, int]:
        """(connections, distinct clients) a prefix of `level` needs to pass (`export.min_support`)."""
        return self.min_support[family].get(level, (1, 1))

    def threshold(self, family: int, level: int, requests: int) -> float:
        """Purity a prefix of `level` with `requests` requests needs (Appendix D: busier → higher)."""
        tiers = self.purity[family].get(level, ((0, 0.0),))
        need = tiers[0][1]
        for lo, p in tiers:
            if requests >= lo:
                need = p
        return need

    def is_last(self, family: int, level: int) -> bool:
        return level == self.ladder[family][-1]


@dataclass(frozen=True)
class GuardsSettings(_Section):
    """`export.guards:` what stands between an exported table and the store (export/delivery/guards.py)."""
    require_gate: bool = True         # every model version behind the decisions passed its gate
    max_flip_share: float = 0.30      # of traffic whose CC changes against the live table
    min_coverage: float = 0.50        # of model-decided addresses the table covers
    # size caps (issue 58): a generated table that ran away is refused before the store, as the
    # agent's own caps would refuse it (ccs.h CCS_MAX_ENTRIES, ccs_table.h CCS_TREE_MAX_NODES)
    max_entries: int = 1_000_000      # prefix entries in one table
    max_tree_nodes: int = 255         # a tree this large ran into its cap: handshake.depth 6 makes ≤ 127
    max_artifact_bytes: int = 64 << 20   # the encoded table (.bin)
    # growth against the live table: entries and bytes at most max_growth × the live one's,
    # checked once the live table has growth_floor_entries (a young fleet's table may grow fast)
    max_growth: float = 1.5
    growth_floor_entries: int = 100
    # hysteresis: the share of traffic whose CC the table would send back to what the table
    # before the live one gave it, undoing the live table's own change (good/bad alternation)
    max_revert_share: float = 0.10   # make run's stream tables changed 2.9–3.3% of traffic each (docs/results/main-job.md)


ROLLOUT_GATES = ("canary", "health")


@dataclass(frozen=True)
class Health:
    """How a node is judged after a load (export/delivery/rollout.py): wait `wait_s`, then its
    connection rate must stay above `min_rate_ratio` of the rate before."""
    wait_s: float
    min_rate_ratio: float


@dataclass(frozen=True)
class RolloutSettings(_Section):
    """`export.rollout:` the artifact store (a directory, or an fsspec URL: s3://, gs://,
    memory://), the health check of each node after a load, and the `gate` that promotes a cohort
    to the next in the pipeline's rollouts (the hourly DAG's and the stream's, flows/pipeline.py)
    and `ccs rollout`'s by default:

    - `canary` (the default): the cohort's A/B on outcomes (`export.canary`), as a rollout in
      flight (export/delivery/inflight.py): the canary loads, the stream's micro-batches and the
      hourly runs look at its arms in silver.connections as they are ingested, and it is promoted
      cohort by cohort, rolled back and frozen, or sent back (no evidence within the window);
    - `health`: the node's health check alone (table active, no setsockopt error, connection rate
      held), every cohort at once: for a fleet whose nodes have no clients whose outcomes reach
      the lake, where the outcome gate could never promote a table."""
    store: str
    health_wait_s: float = 2.0
    min_rate_ratio: float = 0.5
    gate: str = "canary"

    def __post_init__(self):
        if self.gate not in ROLLOUT_GATES:
            raise ValueError(f"export.rollout.gate must be one of {ROLLOUT_GATES}, not {self.gate!r}")

    @property
    def health(self) -> Health:
        return Health(self.health_wait_s, self.min_rate_ratio)


@dataclass(frozen=True)
class CanarySettings(_Section):
    """`export.canary:` the canary's A/B on outcomes (export/delivery/canary.py, issue 58): an
    always-valid mixture SPRT per metric over the kernel's CRC32 arms, looked at as often as
    wanted, each metric's interval at level `alpha` / number of `metrics`. Two kinds of metric,
    as progressive-delivery analyses split them:

    - `primary` (judged for non-inferiority): a table is promoted once every primary metric's
      always-valid interval excludes a harm above `harm_margin`;
    - guardrails (the other `metrics`): a table is rolled back once a guardrail's interval shows
      harm (wholly on the harm side of 0), as it is on a primary; a guardrail's interval that is
      still wider than the margin does not hold a table back.

    A table is not promoted before `bake_minutes` (at most `max_minutes`), so a guardrail has the
    window to show a harm; neither (not promoted: the cohort goes back, nothing frozen) when
    `max_minutes` pass without a promote or a rollback. At any number of looks: a table that
    harms no metric is rolled back with probability at most `alpha`, and a table that harms a
    primary metric by more than `harm_margin` is promoted with probability at most `alpha` /
    number of metrics. Nothing
    bounds the promotion of a table whose harm is on a guardrail alone and too small for the
    guardrail's interval to show within the window (docs/rollouts.md gives the widths).

    `primary` is delivery_rate (the access log's bytes over request time, the goodput the CC
    choice acts on): the one metric the canary resolves within the window. On the reacting-fleet
    drill (docs/results/rollout-drill.md, 20,000 connections per node-hour) the good tables'
    median interval half-widths at minute 30 were 0.105 in log ratio for delivery_rate, 0.19-0.23
    for retrans_rate and 1.22 for rebuffer_rate, against log(1 + harm_margin) = 0.049; with the
    latter two as primaries no good table of 40 was promoted (commit 3c75368), with
    delivery_rate 23 of 40 went to every cohort and no bad table was promoted (docs/rollouts.md).
    `tau` is the mixing prior's spread of the log ratio (the effect sizes the test is most
    sensitive to); a look needs `min_clusters` client addresses per arm.
    `harm_margin` is the operator's tolerance, relative to the control arm (the default CC):
    the largest harm on a primary metric a table may carry to the next cohort. 5%: about
    ALICCS's whole measured QoE gain over the default (rebuffer rate −4.76% over all
    connections, §5.3; "even a 2%–3% difference in service quality matters"), so a table is not
    let on without evidence that it costs less than what CC selection exists to win."""
    alpha: float = 0.05
    tau: float = 0.2
    harm_margin: float = 0.05
    min_clusters: int = 200
    max_minutes: float = 30.0
    #: no promotion before this many minutes (capped at max_minutes): the guardrails' time to
    #: show a harm. Without it a table 25% faster and 30% more stalling was promoted within the
    #: first minutes in most of 20 replays (sim/ab_outcomes.py), before the rebuffer guardrail
    #: could see it; with 30 it was rolled back in nearly all (tests/test_canary.py, docs/rollouts.md)
    bake_minutes: float = 30.0
    metrics: tuple[str, ...] = ("delivery_rate", "retrans_rate", "rebuffer_rate")
    primary: tuple[str, ...] = ("delivery_rate",)

    #: the metrics export/delivery/canary.py knows (features.ab_moments.CANARY_METRICS)
    KNOWN = ("delivery_rate", "retrans_rate", "rebuffer_rate")

    def __post_init__(self):
        if not 0 < self.alpha < 1:
            raise ValueError(f"export.canary.alpha must be in (0, 1), got {self.alpha}")
        if (self.tau <= 0 or self.harm_margin < 0 or self.min_clusters < 2 or self.max_minutes <= 0
                or self.bake_minutes < 0):
            raise ValueError("export.canary: tau > 0, harm_margin >= 0, min_clusters >= 2, max_minutes > 0 "
                             "and bake_minutes >= 0")
        if not self.metrics or set(self.metrics) - set(self.KNOWN):
            raise ValueError(f"export.canary.metrics must be among {', '.join(self.KNOWN)}, not {self.metrics}")
        if not self.primary or set(self.primary) - set(self.metrics):
            raise ValueError(f"export.canary.primary must be one or more of export.canary.metrics "
                             f"{self.metrics}, not {self.primary}: a table is promoted on its primary metrics")

    @property
    def guardrails(self) -> tuple[str, ...]:
        """The metrics that roll a table back on harm but do not hold it back."""
        return tuple(m for m in self.metrics if m not in self.primary)


@dataclass(frozen=True, kw_only=True)
class ExportSettings(PrefixLadder):
    """`export:` the prefix ladder and purity (PrefixLadder), the tables' lifetime and folder, the
    signing keys' folder (the private key never goes into the repository), the AutoPlex policy
    whose caps go on entries, the guards and the rollout."""
    out: str
    keys_dir: str
    caps_policy: str                  # the autoplex.policies entry whose latest parameters give caps
    rollout: RolloutSettings
    expiry_hours: float = 6.0
    guards: GuardsSettings = field(default_factory=GuardsSettings)
    canary: CanarySettings = field(default_factory=CanarySettings)
    # the handshake tree (issue 27): each table carries `<name>-handshake@champion` (`ccs
    # handshake`) when flow_tree and there is one; an entry below flow_min_purity_permille is
    # "mixed", so a service in flow mode fill, combine or prior lets the tree decide for it; a
    # leaf below flow_min_leaf_permille is "unsure", so in mode prior a confident entry decides
    # there (export/edge/README.md). 750: on the default emulation fleet prior at 650–850 gave
    # the same truth gain; 850 gave up some of the p95 lead over Disco (docs/results/emulate.md)
    flow_tree: bool = True
    flow_min_purity_permille: int = 950
    flow_min_leaf_permille: int = 750

    def __post_init__(self):
        super().__post_init__()
        for name in ("flow_min_purity_permille", "flow_min_leaf_permille"):
            if not 0 <= getattr(self, name) <= 1000:
                raise ValueError(f"export.{name} must be in 0..1000, not {getattr(self, name)}")


# ---- the stream -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class StreamSettings(_Section):
    """`stream:` `ccs stream` (flows/stream.py, issue 26): the edge's rotated log segments → bronze,
    silver and gold.predictions every `trigger_seconds`, and ALICCS Algorithm 1 over the
    connections that closed in the last `window_minutes`, rebuilt at every `table_minutes`
    boundary of the data's own clock (the newest ts_end_ms seen) and emitted as a signed version
    only when it would give at least `min_change` of the window's request weight another CC than
    the last emitted one (the guards' flip share), or that one is `refresh_hours` old (tables
    expire: export.expiry_hours).
    With `half_life_minutes`, a prediction's request weight halves every that many minutes of
    age inside the window (ALICCS Observation IV: prefixes change type within hours)."""
    checkpoint: str | None = None         # None: <data_root>/stream/checkpoint
    trigger_seconds: int = 30             # micro-batch interval: how often new segments are read
    max_files_per_trigger: int = 2000     # segments per micro-batch (bounds a backlog's batch)
    table_minutes: int = 5                # a table per this many minutes of traffic
    window_minutes: int = 60              # Algorithm 1's sliding window
    half_life_minutes: float | None = None
    min_change: float = 0.01
    refresh_hours: float = 2.0
    # where the micro-batches come from (jobs/stream_sources.py, issue 60): file, the segments under
    # the input folder; kafka, the broker's topics ccs.<stream> (export/edge/shipper.py)
    source: str = "file"
    kafka_bootstrap: str | None = None    # host:port; None: the project's broker (<data_root>/kafka/bootstrap)
    max_offsets_per_trigger: int = 200_000  # Kafka records per micro-batch (bounds a backlog's batch)
    # where a new checkpoint starts reading the topics: earliest, latest, or Spark's JSON of offsets
    # per partition ({"ccs.transport": {"0": 42, ...}, ...}); a checkpoint's own offsets win
    kafka_starting_offsets: str = "earliest"
    # the clock of the stream's looks at a rollout in flight (export.rollout.gate canary,
    # export/delivery/inflight.py): wall, the host's (the records' own in a deployment); records,
    # the segments' and silver's (flows/rollout_loop.RecordsClock: a cohort's load at the newest
    # segment its nodes had written plus a minute, a look at the newest minute silver holds for all
    # of them), for logs on another clock than the host's: a simulated fleet at --speed
    # (bench/rollout_loop.py --inflight), a stream far behind. The file source only
    rollout_clock: str = "wall"

    def __post_init__(self):
        if self.source not in ("file", "kafka"):
            raise ValueError(f"stream.source must be file or kafka, not {self.source!r}")
        if self.rollout_clock not in ("wall", "records"):
            raise ValueError(f"stream.rollout_clock must be wall or records, not {self.rollout_clock!r}")
        if self.rollout_clock == "records" and self.source != "file":
            raise ValueError("stream.rollout_clock records reads the segments' clock: the file source only")
        if self.max_offsets_per_trigger < 1:
            raise ValueError("stream.max_offsets_per_trigger must be >= 1")
        if self.trigger_seconds < 1 or self.table_minutes < 1 or self.window_minutes < self.table_minutes:
            raise ValueError("stream: trigger_seconds >= 1, table_minutes >= 1, window_minutes >= table_minutes")
        if not 0 <= self.min_change <= 1:
            raise ValueError(f"stream.min_change must be in 0..1, not {self.min_change}")


# ---- the pipeline ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class PipelineSettings(_Section):
    """`pipeline:` what the DAGs (flows/pipeline.py) read."""
    raw_dir: str                      # the edge logs: <stream>/<node>/<hour>.jsonl
    fleet: str                        # the fleet file `ccs_hourly` rolls out to
    deploy: bool                      # roll out to the fleet (needs root), else stop at the store
    auto_promote: bool                # promote to @champion without a human (`ccs promote`)
    train_window_hours: int = 24      # hours of silver the daily training learns from
    export_window_hours: int = 1      # hours of decisions one hourly export aggregates
    # share of 4G/5G rows in the balanced training set (ALICCS trains on 50%); null: every labelled
    # connection of the window, in the fleet's own mix (ALICCS §5.1 ties the balanced set's
    # accuracy to the 4G share a node serves, Saerens et al. [39])
    cellular_share: float | None = 0.5
    epochs: int | None = None         # training epochs (None: models.train.TrainParams' default)
    # at least this many optimizer steps per training (models.train.effective_epochs): a window
    # with few labelled rows gets more epochs, not an under-trained model
    min_steps: int = 600
    # torch's threads while training (models.train.TrainParams.threads); null: torch's default, one
    # per core. Training beside other work on 2 cores, 1 thread fitted make run's training set
    # in 4.17 s against 51.55 s with 2 (medians of 3 interleaved, load average ~5,
    # docs/results/train-threads.md)
    train_threads: int | None = 1
    # the variant `ccs_train` trains (models.train.VARIANTS): ALICCS, another variant, or
    # `select`: the one model.select's leave-node-out folds of the training nodes choose
    variant: str = "aliccs"
    # each step's rows and duration as a textfile for node_exporter (flows/job_metrics.py,
    # <metrics_dir>/ccs-job-<job>.prom, issue 59); None: not written
    metrics_dir: str | None = None

    def __post_init__(self):
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"pipeline.epochs must be at least 1 (or null), got {self.epochs}")
        if self.cellular_share is not None and not 0.0 < self.cellular_share < 1.0:
            raise ValueError(f"pipeline.cellular_share must be in (0, 1) or null, got {self.cellular_share}")
        if self.min_steps < 0:
            raise ValueError(f"pipeline.min_steps must be 0 or more, got {self.min_steps}")
        if self.train_threads is not None and self.train_threads < 1:
            raise ValueError(f"pipeline.train_threads must be at least 1 (or null), got {self.train_threads}")


@dataclass(frozen=True)
class AbtestSettings(_Section):
    """`abtest:` ALICCS §5.3's randomized control test: two-sided confidence of the intervals
    (delta method over client-address clusters) and the fewest clusters per arm a segment needs
    before it gets an interval and a p-value."""
    confidence: float = 0.95
    min_clusters: int = 30

    def __post_init__(self):
        if not 0 < self.confidence < 1:
            raise ValueError(f"abtest.confidence must lie in (0, 1), got {self.confidence}")
        if self.min_clusters < 2:
            raise ValueError(f"abtest.min_clusters must be at least 2, got {self.min_clusters}")


# ---- all of it ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    """Every section; `cfg.settings`."""
    spark: SparkSettings
    lake: LakeSettings
    mlflow: MlflowSettings
    airflow: AirflowSettings
    simulate: SimulateSettings
    autoplex: AutoplexSettings
    model: ModelSettings
    export: ExportSettings
    pipeline: PipelineSettings
    emulate: EmulateSettings = field(default_factory=EmulateSettings)
    ingest: IngestSettings = field(default_factory=IngestSettings)
    infer: InferSettings = field(default_factory=InferSettings)
    distill: DistillSettings = field(default_factory=DistillSettings)
    diagnose: DiagnoseSettings = field(default_factory=DiagnoseSettings)
    handshake: HandshakeSettings = field(default_factory=HandshakeSettings)
    abtest: AbtestSettings = field(default_factory=AbtestSettings)
    stream: StreamSettings = field(default_factory=StreamSettings)
    object_store: ObjectStoreSettings = field(default_factory=ObjectStoreSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)


#: top-level keys that are not sections (see ccselect/config.py)
SCALARS = ("env", "data_root")


def from_raw(raw: dict[str, Any], source: str | Path) -> Settings:
    """The typed settings of a parsed, interpolated configuration; ConfigError naming the key and
    `source` (the file) for an unknown key, a missing one, a value of the wrong type or range."""
    sections = {k: v for k, v in raw.items() if k not in SCALARS}
    return _build(Settings, sections, "", str(source))


def _build(cls: type, data: Any, where: str, source: str) -> Any:
    what = where or "the top level"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {what} must be a mapping, not {data!r}")
    names = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in names:
            known = ", ".join(sorted(names) + ([] if where else list(SCALARS)))
            raise ConfigError(f"{source}: unknown key {_join(where, key)!r} (the keys of {what}: {known})")
    hints = typing.get_type_hints(cls)
    kwargs = {k: _convert(hints[k], v, _join(where, k), source) for k, v in data.items()}
    for name, f in names.items():
        if name in kwargs or f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        if dataclasses.is_dataclass(hints[name]):       # a section or sub-section: its own keys say what is missing
            kwargs[name] = _build(hints[name], {}, _join(where, name), source)
        else:
            raise ConfigError(f"{source}: {_join(where, name)!r} is required (it has no default)")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{source}: {e}") from e


def _join(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(tp: Any, value: Any, where: str, source: str) -> Any:
    """`value` as type `tp`: numbers stay numbers (an int is a float, a bool is neither), lists
    become tuples, mappings are checked value by value, dataclasses recursively."""
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where, source)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(a, value, where, source)
            except ConfigError:
                pass
        raise ConfigError(f"{source}: {where} must be {_type_name(tp)}, not {value!r}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{source}: {where} must be a list, not {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{where}[{i}]", source) for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(f"{source}: {where} must be a list of {len(args)}, not {value!r}")
        return tuple(_convert(a, v, f"{where}[{i}]", source) for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {where} must be a mapping, not {value!r}")
        return {k: _convert(args[1], v, _join(where, k), source) for k, v in value.items()}
    ok = {bool: isinstance(value, bool),
          int: isinstance(value, int) and not isinstance(value, bool),
          float: isinstance(value, (int, float)) and not isinstance(value, bool),
          str: isinstance(value, str)}
    if tp not in ok:
        raise TypeError(f"settings field {where}: unsupported type {tp!r}")
    if not ok[tp]:
        raise ConfigError(f"{source}: {where} must be {_type_name(tp)}, not {value!r}")
    return float(value) if tp is float else value
