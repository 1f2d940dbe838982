"""`ccs emulate`: trace-driven QoE emulation of CC-selection policies (ALICCS §5.4, Appendix E, G).

The trace is silver.connections with QoE joined: every playback session (a connection with a QoE
beacon) with the CC it was served with. The fleet runs an A/B split by CRC32 of the client IP
(ALICCS Appendix A), so inside every /24 and time window both CUBIC and BBR serve a random share of
the clients: the time-window mechanism of §5.4 ([25, 27]) gets unbiased outcome estimates per CC.

The estimator (§5.4 "To simulate any algorithm's outcomes for CCs ... not actually adopted"): a
policy picks a CC for each session. If the trace served the session with that CC, its outcome is
the observed one; otherwise it is the average outcome of the sessions the CC served in the same
prefix group (/24, IPv6 /48), network type and window; if the CC served none there, the average
over earlier windows of that prefix group and type ("historical times"); failing that, the CC's
average over the node's sessions of that type in the window; failing everything, the observed
outcome is kept and the session is counted as unestimated. Every session's estimate level is
counted per policy (`n_observed`, `n_window`, `n_history`, `n_node`, `n_unestimated`).

The network type of a session is its client-reported label where there is one, else the
champion's predicted type (gold.predictions), else "unknown".

Outcomes: rebuffer rate (rebuffer_ms / play_ms), retransmission rate (total_retrans /
data_segs_out), and §5.4's aggregate QoE = 1 − α·rebuffer − (1 − α)·retransmission (α = 0.8).

Policies (all decide before seeing the session's outcome; the learned ones learn only from hours
before the emulated range, or, for Pytheas, online from its own choices):
- `cubic` (the production default), `bbr`: everyone on one CC.
- `oracle`: per window and /24, the CC with the best average QoE (§5.4). In-sample, that choice
  also picks the noise of the averages it is scored with (a winner's curse: on the default fleet
  its estimated gain over CUBIC was 2.4× its true gain, measured against the simulator's truth), so
  it is cross-fitted: sessions are split in two folds by a hash of the connection id; a fold's CC is
  the one that did best on the other fold, and the fold is scored with its own data only.
  `oracle_insample` is the paper's literal version, reported beside it.
- `aliccs`: the purity-aggregated table (export.tables.aggregate, Algorithm 1) built from the previous
  hour's gold.predictions (the last `pipeline.export_window_hours` of them, as the hourly export
  does), looked up by longest-prefix match; a miss keeps the default CC — what the edge enforces
  in the hour after the hourly export. Only model decisions make entries, and every decision the
  model declined (fallback, `ood`, `evidence`) counts against its prefix's purity and support, as
  in the export (export/tables/aggregate.py); the summary's `baselines.aliccs` counts the table's
  source predictions per decision.
- `aliccs_fill`, `aliccs_combine`, `aliccs_flow`, `aliccs_prior`: that table with the handshake tree it carries
  (`ccs handshake`, distill/handshake.py; export/tables/flow.py), decided per session exactly as
  the kernel does in the service's flow mode (table_format.decide; export/edge/README.md): `fill`
  — the tree where the entry misses or is mixed (purity below export.flow_min_purity_permille);
  `combine` — also where the entry is confident, the tree's leaf wins when it disagrees with more
  confidence than the entry's purity; `flow` — the tree for every connection; `prior` — the tree
  for every connection, except that a confident entry decides where the leaf is unsure
  (confidence below export.flow_min_leaf_permille): the flow first, the prefix's history where
  the flow says little. The tree is fitted on the training window's labelled connections (before the emulated hours), on the
  handshake features alone (`HANDSHAKE_FEATURES`), as it would ship.
- `aliccs_stream` (issue 26): the streaming table — the same Algorithm 1 rebuilt every
  `stream_trigger_minutes` over the model predictions of the connections that ended in the last
  `stream_window_minutes` (a prediction exists once its connection has ended; its time is the
  connection's `ts_end_ms`, from silver.connections), live `stream_delay_minutes` after its
  boundary (processing and rotation). A session starting at t is decided by the table of boundary
  b = floor((t − delay) / trigger)·trigger, longest-prefix matched as `aliccs`; a miss keeps the
  default. A prefix whose type changes (ALICCS §3.3, Observation IV) is followed within about
  trigger + delay, not the hour or two of the hourly export.
- `aliccs_stream_fill`, `_combine`, `_flow`, `_prior`: the flow policies over the streaming table.
- Any streaming policy at lag L minutes instead of the delay, as `<policy>@<L>`: the table of
  b = floor((t − L) / trigger)·trigger (L = 0: the boundary just passed, built in no time).
  `run(..., stream_lags=)` (`ccs emulate --stream-lags`) adds `aliccs_stream@L` and
  `true_table_stream@L` per lag and the summary's `lag_curve`: per lag, the share of the true
  type's truth gain and the rebuffer tail.
- `configanator`: network classes (K-means over per-/24 mean features, Configanator §3.2), each
  class's best CC over the training hours, a decision tree from {the /24's features, its class}
  to that CC (the exploitation arm, §3.1), and an ε-bandit exploring a random CC (§3.1 arm 2).
- `disco`: a decision tree from what a flow shows when it is accepted (its MSS, the client's
  initial window, the handshake's RTT — `HANDSHAKE_FEATURES`) to the CC that did better in its /24
  and window over the training hours (Disco [47]; Antelope is the same per flow, Appendix E). Only
  the handshake: the rest of a session's TCP statistics exist once it has run under some CC.
- `disco_type`: Disco's tree on the same handshake features, trained on the network-type label
  instead (the labelled training sessions, Wi-Fi → CUBIC, 4G/5G → BBR, as ALICCS §4.2 maps the
  type): Disco given ALICCS's own label, so that a gap between `disco` and `aliccs` is not only
  Disco's noisier per-prefix QoE label (issue 55).
- `gbdt`: the hourly table built as `aliccs`'s (the same source predictions, the same OOD, evidence
  and fallback declines, the same ladder and purity), with every model decision's type predicted
  instead by gradient-boosted trees (models/gbdt.py) trained on the labelled training sessions'
  twelve log features — the skeptic's classifier in ALICCS's place (issue 55).
- `pytheas`: group-based exploration–exploitation (Pytheas [26]): per user group (region + ASN)
  and node, a discounted UCB bandit over the two CCs, updated with each session's outcome.
- `true_type` (only with the simulator's truth): Wi-Fi → CUBIC, 4G/5G → BBR by the true network
  type — the classifier's upper bound, per session.
- `true_table` (only with the truth): the table ALICCS's design would serve with a perfect
  classifier — per prefix group, the majority true type of its sessions in the hour the table is
  built from (`table_lag_hours` before, all nodes, as the hourly export), Wi-Fi → CUBIC, 4G/5G →
  BBR, a group without sessions then → the default. The bound of a prefix table with that lag:
  what the hour of lag costs even without a single misclassification.
- `true_table_stream` (only with the truth): the same bound on the streaming table's timeline —
  per prefix group, the majority true type of the sessions that ended in the window of the table
  live at the session's start (same trigger, window and lag as `aliccs_stream`).
The truth is read for these three policies and for the `truth` check of the summary (each
policy's `share_of_true_type_gain`: its truth gain over all-CUBIC as a share of `true_type`'s),
never for anything a policy learns from.

The package, one concern a file (the names are all importable from here, as before):
`estimate.py` the sessions and the estimator; `decide.py` what each policy decides; `policies.py`
the registry (`@policy`, one function a policy, registered in one place, and `Emulation`, the tables
several policies share); `report.py` scoring and the summary; `engine.py` the job (`run`).
"""
from __future__ import annotations

from ccselect.evaluation.emulate.estimate import (  # noqa: F401
    CCS, LEVELS, PERCENTILES, TAIL_TIE, _cell_stats, _history, _type_label, estimates, extract, hour_shift_col, qoe,
    sessions)
from ccselect.evaluation.emulate.decide import (  # noqa: F401
    _best_cc_labels, _explore, _log_features, _prefix_means, _type_cc, aliccs_choice, aliccs_policy,
    configanator_policy, disco_policy, disco_type_policy, extract_stream_predictions, fixed_policy, flow_decide,
    flow_decide_local, flow_inputs, flow_policy, gbdt_table_policy, live_slot, match_entries, oracle_crossfit,
    oracle_insample, pytheas_policy, slot_entries, stream_entries, stream_lag_hours, stream_lookup, stream_slots,
    table_lookup, true_stream_shares, true_table_policy, true_table_stream_policy, true_type_policy)
from ccselect.evaluation.emulate.policies import (  # noqa: F401
    Emulation, FLOW_POLICIES, POLICIES, Policy, REGISTRY, STREAM_POLICIES, TRUTH_POLICIES, _aliccs, _aliccs_stream,
    _aliccs_stream_with_tree, _aliccs_with_tree, _configanator, _disco, _disco_type, _fixed, _gbdt, _oracle,
    _oracle_insample, _pytheas, _true_table, _true_table_stream, _true_type, policy, split_lag)
from ccselect.evaluation.emulate.report import (  # noqa: F401
    _by_percentile, _node_intervals, _tail_rows, cubic_truth_by_node, cubic_truth_qoe, per_cell, per_window,
    read_truth, score, summarize, tail_contrasts, truth_cells, truth_check, with_truth)
from ccselect.evaluation.emulate.engine import _score_and_summarize, lag_curve, run  # noqa: F401
