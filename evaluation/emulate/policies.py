"""The policies, registered: `@policy(name, ...)` declares a policy once, with what it needs;
`Emulation` holds the tables several policies share. POLICIES and the other tuples are read off
the registry."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession, functions as F

from ccselect.config import Config
from ccselect import hours      # hours.Window: a time range (pyspark's Window is the window function's)
from ccselect.hours import hour_shift
from ccselect.settings import EmulateSettings
from ccselect.distill.handshake import load_handshake
from ccselect.export.artifact import table_format as tf
from ccselect.export.tables.flow import table_tree
from ccselect.evaluation.emulate.decide import (
    aliccs_choice, configanator_policy, disco_policy, disco_type_policy, extract_stream_predictions, fixed_policy,
    flow_decide_local, flow_inputs, gbdt_table_policy, oracle_crossfit, oracle_insample, pytheas_policy,
    stream_entries, stream_lag_hours, stream_lookup, table_lookup, true_stream_shares, true_table_policy,
    true_table_stream_policy, true_type_policy)

# ---- the policies, registered ---------------------------------------------------------------------
# Each policy is one function, registered here with `@policy` (its name, and what it needs: the
# simulator's truth, the handshake tree, a lag on the streaming table's timeline), in the order the
# summaries list them. `run` loops over this registry; `app/run.py`'s summary over `POLICIES`.
# A registered function gets the emulation (`Emulation`: the sessions, the range's estimates, the
# training sessions, the truth, and the tables several policies share, each built once) and the
# policy's name (`<policy>` or `<policy>@<lag>`), and returns its (conn_id, choice) frame and what
# the summary's `baselines` reports of it (None: nothing).


def split_lag(name: str, p: EmulateSettings) -> tuple[str, int | None]:
    """A policy name as (policy, lag in minutes): `aliccs_stream@15` → ("aliccs_stream", 15); a
    streaming policy without `@` runs at `stream_delay_minutes`; any other policy has no lag (None).
    Raises ValueError on a lag that is not a whole number of minutes ≥ 0, or one on a policy that
    is not a streaming one."""
    base, at, lag = name.partition("@")
    if not at:
        return base, (p.stream_delay_minutes if base in STREAM_POLICIES else None)
    if base not in STREAM_POLICIES or not lag.isdigit():
        raise ValueError(f"{name!r}: only the streaming policies ({', '.join(STREAM_POLICIES)}) take a lag, "
                         f"as <policy>@<minutes>")
    return base, int(lag)


@dataclass(frozen=True)
class Policy:
    name: str
    decide: Callable[["Emulation", str], tuple[DataFrame, dict | None]]
    #: reads the simulator's truth (only with --truth)
    truth: bool = False
    #: the table's handshake tree (`ccs handshake`), in this kernel flow mode
    flow_mode: str | None = None
    #: on the streaming table's timeline: runs at `stream_delay_minutes`, or at a lag as `<name>@<L>`
    stream: bool = False
    #: the tails are also contrasted against it (issue 26: the streaming table; issue 27: does the
    #: table with its handshake tree beat Disco's tail?), beside ALICCS's hourly table
    tail_reference: bool = False
    #: scored with its fold-own estimates (the cross-fitted Oracle)
    fold_scored: bool = False


REGISTRY: dict[str, Policy] = {}


def policy(*names: str, flow_modes: tuple[str, ...] | None = None, **needs):
    """Register the decorated function as the policies `names` (`flow_modes`: each one's kernel
    flow mode, for the policies of the table with its handshake tree); `needs`: Policy's flags."""
    def register(decide):
        for i, name in enumerate(names):
            if name in REGISTRY:
                raise ValueError(f"policy {name!r} registered twice")
            REGISTRY[name] = Policy(name, decide, flow_mode=flow_modes[i] if flow_modes else None, **needs)
        return decide
    return register


class Emulation:
    """What the policies of one `run` read: the sessions `s` (the range and the training hours
    before it), `est_all` (their estimates), `est` (the range's), `train` (the hours before), the
    truth, and the tables several policies read, each built once on first use and unpersisted by
    `close`; `info` collects the summary's `baselines`."""

    def __init__(self, spark: SparkSession, cfg: Config, window: hours.Window, p: EmulateSettings,
                 lag_of: dict[str, tuple[str, int | None]], s: DataFrame, est_all: DataFrame,
                 truth: DataFrame | None):
        self.spark, self.cfg, self.window, self.p, self.lag_of = spark, cfg, window, p, lag_of
        self.s, self.est_all, self.truth = s, est_all, truth
        self.est: DataFrame | None = None
        self.train: DataFrame | None = None
        self.info: dict[str, Any] = {}
        # built once, read by several policies: the streaming tables (all slots), the truth's shares
        # per slot, each lag's lookup in them, and the hourly table's lookup (with its source decisions)
        self.tables: dict[Any, DataFrame | None] = {}
        self.hourly_counts: dict[str, int] = {}
        self._flow_in: dict[Any, pa.Table] = {}
        self._flow_tree: tf.Tree | None = None

    def in_range(self) -> int:
        """Narrow to the range's sessions; their count."""
        self.est = self.est_all.where("in_range").persist()
        self.train = self.s.where(~F.col("in_range"))
        return self.est.count()

    def handshake_tree(self, name: str) -> tf.Tree:
        if self._flow_tree is None:
            loaded = load_handshake(self.cfg)
            if loaded is None:
                raise ValueError(f"policy {name} needs the handshake tree: run `ccs handshake` first")
            ex = self.cfg.settings.export
            self._flow_tree = table_tree(loaded[0], self.cfg.settings.infer, ex.flow_min_purity_permille,
                                         ex.flow_min_leaf_permille)
            self.info["flow_tree"] = {"model": loaded[1], "features": list(loaded[0].features),
                                      "nodes": len(self._flow_tree.nodes), "depth": self._flow_tree.depth()}
        return self._flow_tree

    def stream_table(self, lag: int) -> DataFrame:
        """The streaming tables' lookup at `lag` (`stream_lookup`), shared by the streaming policies."""
        p, stream = self.p, self.tables
        if "entries" not in stream:
            max_lag = max(lg for b, lg in self.lag_of.values() if b in STREAM_POLICIES)
            preds = extract_stream_predictions(self.spark, self.cfg, self.window, p, max_lag)
            stream["entries"] = stream_entries(preds, self.cfg.settings.export, p).persist() if preds is not None else None
            self.info["stream_table"] = {"trigger_minutes": p.stream_trigger_minutes, "window_minutes": p.stream_window_minutes,
                                         "delay_minutes": p.stream_delay_minutes,
                                         "source_hours": f"{hour_shift(self.window.lo, -stream_lag_hours(p, max_lag))}..{self.window.hi}"}
        if ("lookup", lag) not in stream:     # the streaming policies at one lag share the lookup
            stream[("lookup", lag)] = stream_lookup(self.est, stream["entries"], self.cfg.settings.export, p, lag).persist()
        return stream[("lookup", lag)]

    def flow_table(self, key, looked: DataFrame | None) -> pa.Table:
        """`flow_inputs` of one table's lookup (`looked`), fetched once for its flow policies."""
        if key not in self._flow_in:
            self._flow_in[key] = flow_inputs(self.est, looked)
        return self._flow_in[key]

    def hourly_table(self) -> tuple[DataFrame | None, dict]:
        """The previous hour's table looked up once (`table_lookup`): ALICCS and every flow
        policy read the same entries."""
        if "hourly" not in self.tables:
            looked = table_lookup(self.spark, self.cfg, self.est, self.p, self.hourly_counts)
            self.tables["hourly"] = looked.persist() if looked is not None else None
        return self.tables["hourly"], self.hourly_counts

    def true_shares(self) -> DataFrame:
        """`true_stream_shares`, built once for every lag of `true_table_stream`."""
        if "truth" not in self.tables:
            self.tables["truth"] = true_stream_shares(self.s, self.truth, self.p).persist()
        return self.tables["truth"]

    def lag(self, name: str) -> int | None:
        return self.lag_of[name][1]

    def close(self) -> None:
        for frame in self.tables.values():
            if frame is not None:
                frame.unpersist()


@policy("cubic", "bbr")
def _fixed(em: Emulation, name: str):
    """Everyone on one CC (`cubic`: the production default)."""
    return fixed_policy(em.est, name), None


@policy("oracle", fold_scored=True)
def _oracle(em: Emulation, name: str):
    return oracle_crossfit(em.est, em.p), None


@policy("oracle_insample")
def _oracle_insample(em: Emulation, name: str):
    return oracle_insample(em.est, em.p), None


@policy("aliccs")
def _aliccs(em: Emulation, name: str):
    looked, counts = em.hourly_table()
    return aliccs_choice(em.est, looked, em.p), {"source_decisions": dict(counts)}


@policy("aliccs_fill", "aliccs_combine", "aliccs_flow", "aliccs_prior",
        flow_modes=("fill", "combine", "flow", "prior"), tail_reference=True)
def _aliccs_with_tree(em: Emulation, name: str):
    """The hourly table with its handshake tree, decided as the kernel does in the flow mode."""
    return flow_decide_local(em.spark, em.flow_table("hourly", em.hourly_table()[0]), em.p,
                             em.handshake_tree(name), REGISTRY[name].flow_mode)


@policy("aliccs_stream", stream=True, tail_reference=True)
def _aliccs_stream(em: Emulation, name: str):
    return em.stream_table(em.lag(name)).select(
        "conn_id", F.coalesce(F.col("_ecc"), F.lit(em.p.default_cc)).alias("choice")), None


@policy("aliccs_stream_fill", "aliccs_stream_combine", "aliccs_stream_flow", "aliccs_stream_prior",
        flow_modes=("fill", "combine", "flow", "prior"), stream=True, tail_reference=True)
def _aliccs_stream_with_tree(em: Emulation, name: str):
    """The streaming table with its handshake tree."""
    base, lag = em.lag_of[name]
    return flow_decide_local(em.spark, em.flow_table(("stream", lag), em.stream_table(lag)), em.p,
                             em.handshake_tree(name), REGISTRY[base].flow_mode)


@policy("configanator")
def _configanator(em: Emulation, name: str):
    return configanator_policy(em.train, em.est, em.p)


@policy("disco")
def _disco(em: Emulation, name: str):
    return disco_policy(em.train, em.est, em.p)


@policy("disco_type")
def _disco_type(em: Emulation, name: str):
    return disco_type_policy(em.train, em.est, em.p)


@policy("gbdt")
def _gbdt(em: Emulation, name: str):
    return gbdt_table_policy(em.spark, em.cfg, em.train, em.est, em.p)


@policy("pytheas")
def _pytheas(em: Emulation, name: str):
    return pytheas_policy(em.est_all, em.p), None


@policy("true_type", truth=True)
def _true_type(em: Emulation, name: str):
    return true_type_policy(em.est, em.truth), None


@policy("true_table", truth=True)
def _true_table(em: Emulation, name: str):
    return true_table_policy(em.s, em.est, em.truth, em.p), None


@policy("true_table_stream", truth=True, stream=True)
def _true_table_stream(em: Emulation, name: str):
    return true_table_stream_policy(em.est, em.true_shares(), em.p, em.lag(name)), None


#: every policy, in the order the summaries list them
POLICIES = tuple(REGISTRY)
#: the policies of the table with its handshake tree, and the kernel's flow mode each emulates
FLOW_POLICIES = {x.name: x.flow_mode for x in REGISTRY.values() if x.flow_mode}
#: the policies of the streaming table (issue 26); each also runs at another lag as `<name>@<minutes>`
STREAM_POLICIES = tuple(x.name for x in REGISTRY.values() if x.stream)
#: the policies that read the simulator's truth (only with --truth)
TRUTH_POLICIES = tuple(x.name for x in REGISTRY.values() if x.truth)
