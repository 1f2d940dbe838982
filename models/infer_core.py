"""`ccs infer`'s computation, once, for both engines: the Spark job (models/infer.py, in an Arrow
UDF) and the in-process engine (models/infer_arrow.py, over Delta's files). Plain NumPy (and torch
for the model): no Spark, no Delta, no files.

- What a row brings: the pass-through columns, the twelve Table 4 features (contract.FEATURES)
  and the columns the minimum-evidence rule reads.
- Standardize (log1p, then z-score with the champion's statistics, as features/scaling.py), score
  P(Wi-Fi) with the champion's network in batches without gradients, calibrate it with the
  champion's temperature, and flag the rows its out-of-domain guard finds unlike its training rows
  (`probabilities`).
- The decision (ALICCS §4.2, `decide_arrays`): "evidence" (too little traffic to judge), "ood",
  "model" (the predicted type's probability reaches its threshold) or "fallback"; the CC follows.
  The Spark job states the same rule in columns (`models.infer.decide`); tests compare the two row
  by row (tests/test_real_logs_round2.py) and the engines' tables (tests/test_infer.py).
- The result's decision counts and shares (`decision_report`).
"""
from __future__ import annotations

import math

import numpy as np

from ccselect.contract import FEATURES
from ccselect.hours import Window
from ccselect.settings import InferSettings
from ccselect.models.ood import calibrate
# Imported inside the functions that use them (heavy, not needed to import this module): torch.

#: silver's columns copied to gold.predictions as they are
PASS_THROUGH = ("conn_id", "client_ip", "family", "prefix16", "prefix24", "prefix48", "prefix64", "ug_id",
                "requests", "node_id", "hour")
#: what the minimum-evidence rule reads (`infer.min_data_segs`, `min_bytes_acked`, `min_duration_us`)
EVIDENCE_COLS = ("data_segs_out", "bytes_acked", "duration_us")
#: the codes of `decide_arrays`: pred_net_type and decision (a list index); the CC's are `cc_labels`
NET_TYPES = ("wifi", "cell")
DECISIONS = ("model", "fallback", "ood", "evidence")


def cc_labels(p: InferSettings) -> tuple[str, str, str]:
    """The CC per code of `decide_arrays`: the default, Wi-Fi's and 4G/5G's."""
    return p.default_cc, p.wifi_cc, p.cell_cc


# ---- the champion's terms ----------------------------------------------------------------------

def fleet_scaling(stats) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The champion's feature statistics (`champion.stats`) as per-feature (mean, std) in
    contract.FEATURES order (refused in another order)."""
    if tuple(stats.features) != tuple(FEATURES):
        raise ValueError("the champion's feature statistics are not in contract.FEATURES order")
    return tuple(stats.mean), tuple(stats.std)


def temperature(champion, p: InferSettings) -> float:
    """The champion's calibration temperature, 1 when `infer.calibrate` is off."""
    return float(getattr(champion, "temperature", 1.0)) if p.calibrate else 1.0


def guard(champion, p: InferSettings):
    """The champion's out-of-domain guard (models/ood.py), None when `infer.ood_guard` is off."""
    return getattr(champion, "guard", None) if p.ood_guard else None


def per_node(champion) -> bool:
    """Whether the champion is per-node standardized (`champion.node_std`, a `*_nodestd` variant)."""
    return getattr(champion, "node_std", None) is not None


# ---- the model on arrays -------------------------------------------------------------------------

def standardize(cols: list[np.ndarray], mean, std) -> np.ndarray:
    """[N, F] float32 = (log1p(max(x, 0)) − mean) / std per feature (std 0 → 1), as
    features.scaling.transform computes it in Spark; a missing (imputed, NaN) value is the
    training mean, z = 0."""
    n = len(cols[0]) if cols else 0
    out = np.empty((n, len(cols)), dtype=np.float32)
    for j, (c, m, s) in enumerate(zip(cols, mean, std)):
        s = s if s > 0 and math.isfinite(s) else 1.0
        z = (np.log1p(np.maximum(c.astype(np.float64, copy=False), 0.0)) - m) / s
        out[:, j] = np.where(np.isnan(z), 0.0, z)
    return out


def predict_wifi(model, x: np.ndarray, precision: str = "fp32", chunk: int = 8192) -> np.ndarray:
    """P(Wi-Fi) (the model's second output) for standardized rows x [N, F], float64, `chunk`
    rows at a time: 8 k rows keep the 64-wide activations near the core's L2 (measured with a
    thread per core: 6.9 M rows/s against 4.1 M with 64 k rows)."""
    import torch
    out = np.empty(len(x), dtype=np.float64)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    forward = _inplace_forward(model) or model
    with torch.inference_mode():
        for i in range(0, len(x), chunk):
            xb = torch.from_numpy(x[i:i + chunk]).to(dtype)
            out[i:i + chunk] = forward(xb)[:, 1].float().numpy()
    return out


def _inplace_forward(model):
    """NetTypeModel's forward as the same operators in the same order, with the ReLUs in place
    (no new tensor per activation): the same floats, less memory traffic. None for a model of
    another shape (it then runs as it is)."""
    import torch
    import torch.nn.functional as F
    gen = getattr(getattr(model, "generator", None), "net", None)
    head = getattr(getattr(model, "classifier", None), "net", None)
    if not isinstance(gen, torch.nn.Sequential) or not isinstance(head, torch.nn.Linear):
        return None
    steps = []
    for m in gen:
        if isinstance(m, torch.nn.Linear):
            steps.append(("linear", m.weight, m.bias))
        elif isinstance(m, torch.nn.LayerNorm):
            steps.append(("norm", m.normalized_shape, m.weight, m.bias, m.eps))
        elif isinstance(m, torch.nn.ReLU):
            steps.append(("relu",))
        else:           # dropout (eval: identity) or anything else: run the module itself
            return None

    def forward(h):
        for step in steps:
            if step[0] == "linear":
                h = F.linear(h, step[1], step[2])
            elif step[0] == "norm":
                h = F.layer_norm(h, step[1], step[2], step[3], step[4])
            else:
                h = h.relu_()
        return torch.softmax(F.linear(h.relu_(), head.weight, head.bias), dim=-1)
    return forward


def probabilities(model, z: np.ndarray, precision: str, temperature: float, guard=None,
                  ood_quantile: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(P(Wi-Fi) calibrated with `temperature`, float64; out of domain, bool: the rows `guard`
    flags at `ood_quantile`, none without a guard) for standardized rows z."""
    p_wifi = calibrate(predict_wifi(model, z, precision), temperature)
    ood = guard.flags(z, ood_quantile) if guard is not None else np.zeros(len(p_wifi), dtype=bool)
    return p_wifi, ood


# ---- the decision (ALICCS §4.2) -----------------------------------------------------------------

def evidence_minima(p: InferSettings) -> dict[str, int]:
    """The minimum-evidence rule's minima per column (those switched on)."""
    m = {"data_segs_out": p.min_data_segs, "bytes_acked": p.min_bytes_acked, "duration_us": p.min_duration_us}
    return {c: int(v) for c, v in m.items() if v and v > 0}


def decide_arrays(p_wifi: np.ndarray, ood: np.ndarray, p: InferSettings,
                  thin: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """`models.infer.decide` on NumPy arrays: p_cell = 1 − p_wifi; the predicted type "wifi" at
    p_wifi ≥ 0.5, else "cell"; a row is trusted when its type's probability reaches its threshold
    (≥) and it is not out of domain; decision "ood" / "model" / "fallback"; the CC Wi-Fi → wifi_cc,
    4G/5G → cell_cc, untrusted → default_cc; before all, decision "evidence" where `thin` (too
    little evidence). Codes index NET_TYPES, DECISIONS and `cc_labels` (for dictionary arrays)."""
    p_cell = 1.0 - p_wifi
    wifi = p_wifi >= 0.5
    thin = np.zeros(len(p_wifi), bool) if thin is None else thin
    trusted = np.where(wifi, p_wifi >= float(p.wifi_threshold), p_cell >= float(p.cell_threshold)) & ~ood & ~thin
    return {
        "p_cell": p_cell,
        "pred_net_type": np.where(wifi, 0, 1).astype(np.int8),          # wifi, cell
        # model, fallback, ood, evidence
        "decision": np.where(thin, 3, np.where(ood, 2, np.where(trusted, 0, 1))).astype(np.int8),
        "cc": np.where(~trusted, 0, np.where(wifi, 1, 2)).astype(np.int8),      # default, wifi, cell CC
    }


# ---- the result ----------------------------------------------------------------------------------

def decision_report(decisions: dict[str, int]) -> dict:
    """The result's `decisions` (rows per "decision/cc") and the shares of "ood" and "evidence"."""
    total = sum(decisions.values())
    out: dict = {"decisions": decisions}
    for kind in ("ood", "evidence"):
        out[f"{kind}_share"] = (sum(v for k, v in decisions.items() if k.split("/", 1)[0] == kind) / total
                                if total else 0.0)
    return out


def summary(champion, p: InferSettings, window: Window) -> dict:
    """The result's description of the run: window, model, precision, thresholds, temperature, guard."""
    g = guard(champion, p)
    return {"window": window.name, "model_name": champion.name, "model_version": champion.version,
            "precision": p.precision, "thresholds": {"wifi": p.wifi_threshold, "cell": p.cell_threshold},
            "temperature": champion.temperature if p.calibrate else 1.0,
            "ood_guard": (None if g is None else
                          {"method": g.method, "quantile": p.ood_quantile,
                           "threshold": g.threshold_at(p.ood_quantile), "margin": g.margin})}
