"""A model that knows when it does not know: the out-of-domain guard and the temperature that
travel with the network-type classifier (models/registry.py logs both into the model).

- `DomainGuard`: fitted on the standardized training rows (log1p, z-score with the window's
  statistics, features/scaling.py). A row is out of domain (`flags`) when one of its standardized
  features lies beyond the training rows' range by more than `margin` (z units), or when its
  distance score exceeds `threshold`, the `quantile` (99.9% by default) of the training rows'
  scores. The score is the Mahalanobis distance of the standardized row to the training rows
  (their mean and covariance; `method="mahalanobis"`), or the largest |z| (`method="maxabs"`).
  The training scores' quantiles are kept (`quantiles`), so inference can read another quantile
  (`infer.ood_quantile`) without refitting.
- Temperature scaling (Guo et al. 2017): the model outputs softmax probabilities (4G, Wi-Fi); its
  logit log(p_wifi / p_cell) divided by T gives calibrated probabilities. T is fitted by
  minimizing the negative log-likelihood on held-out labelled rows, so that ALICCS §4.2's
  thresholds (trust Wi-Fi at ≥ 0.8, 4G/5G at ≥ 0.6) mean the confidence they name.

NumPy only: the inference UDF runs this on Arrow batches.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ccselect.settings import OOD_METHODS as METHODS

#: training-score quantiles a guard keeps (inference interpolates between them)
QUANTILE_GRID = (0.9, 0.95, 0.99, 0.995, 0.998, 0.999, 0.9995, 0.9999, 1.0)
_EPS = 1e-7


@dataclass(frozen=True)
class DomainGuard:
    """Per-feature range of the standardized training rows plus a distance score and its threshold."""
    features: tuple[str, ...]
    lo: tuple[float, ...]            # per-feature minimum of the training rows' z
    hi: tuple[float, ...]            # per-feature maximum
    method: str                      # "mahalanobis" | "maxabs"
    center: tuple[float, ...]        # mean of the training rows' z (Mahalanobis)
    precision: tuple[tuple[float, ...], ...]  # inverse covariance of the training rows' z (Mahalanobis)
    quantile: float                  # the quantile `threshold` was set at
    threshold: float                 # the training scores' `quantile`
    margin: float                    # z units allowed beyond [lo, hi]
    quantiles: tuple[tuple[float, float], ...]  # (q, training score quantile q) over QUANTILE_GRID
    n: int

    # -- scoring ----------------------------------------------------------------------------------
    def score(self, z: np.ndarray) -> np.ndarray:
        """The distance score of standardized rows z [N, F] (float64 [N])."""
        z = np.asarray(z, dtype=np.float64)
        if self.method == "maxabs":
            return np.abs(z).max(axis=1) if z.shape[1] else np.zeros(len(z))
        d = z - np.asarray(self.center)
        # (d P) · d row by row: one BLAS product and one pass; the three-operand einsum costs
        # about 3x as much CPU per row (measured on 1 M rows; the two agree within 1e-13 relative)
        return np.sqrt(np.maximum(np.einsum("ij,ij->i", d @ np.asarray(self.precision), d), 0.0))

    def threshold_at(self, quantile: float | None = None) -> float:
        """The score threshold at `quantile` of the training rows (the fitted one by default;
        another is interpolated between the kept quantiles)."""
        if quantile is None or math.isclose(quantile, self.quantile):
            return self.threshold
        qs, vs = zip(*self.quantiles)
        return float(np.interp(quantile, qs, vs))

    def out_of_range(self, z: np.ndarray) -> np.ndarray:
        z = np.asarray(z, dtype=np.float64)
        return ((z < np.asarray(self.lo) - self.margin) | (z > np.asarray(self.hi) + self.margin)).any(axis=1)

    def flags(self, z: np.ndarray, quantile: float | None = None) -> np.ndarray:
        """True where a row is out of domain: a feature beyond the training range (± margin) or a
        score above the threshold. A row with a non-finite value is out of domain."""
        z = np.asarray(z, dtype=np.float64)
        finite = np.isfinite(z)
        if finite.all():  # the usual batch: no copy
            return self.out_of_range(z) | (self.score(z) > self.threshold_at(quantile))
        zz = np.where(finite, z, 0.0)
        return ~finite.all(axis=1) | self.out_of_range(zz) | (self.score(zz) > self.threshold_at(quantile))

    # -- persistence -----------------------------------------------------------------------------
    def to_json(self) -> str:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["quantiles"] = [list(q) for q in self.quantiles]
        d["precision"] = [list(r) for r in self.precision]
        return json.dumps(d, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "DomainGuard":
        d = json.loads(text)
        return cls(features=tuple(d["features"]), lo=tuple(d["lo"]), hi=tuple(d["hi"]), method=d["method"],
                   center=tuple(d["center"]), precision=tuple(tuple(r) for r in d["precision"]),
                   quantile=float(d["quantile"]), threshold=float(d["threshold"]), margin=float(d["margin"]),
                   quantiles=tuple((float(q), float(v)) for q, v in d["quantiles"]), n=int(d["n"]))


def fit_guard(z: np.ndarray, features: Sequence[str], quantile: float = 0.999, method: str = "mahalanobis",
              margin: float = 1.0) -> DomainGuard:
    """A `DomainGuard` from the standardized training rows z [N, F]."""
    if method not in METHODS:
        raise ValueError(f"unknown guard method {method!r}; one of {METHODS}")
    z = np.asarray(z, dtype=np.float64)
    z = z[np.isfinite(z).all(axis=1)]
    if len(z) < 2:
        raise ValueError("need at least two finite training rows to fit the guard")
    center = z.mean(axis=0)
    cov = np.atleast_2d(np.cov(z, rowvar=False))
    # a little ridge: a constant feature (std 0 → z 0) leaves the covariance singular
    prec = np.linalg.pinv(cov + 1e-6 * np.eye(len(cov)))
    guard = DomainGuard(features=tuple(features), lo=tuple(z.min(axis=0).tolist()), hi=tuple(z.max(axis=0).tolist()),
                        method=method, center=tuple(center.tolist()), precision=tuple(tuple(r) for r in prec.tolist()),
                        quantile=float(quantile), threshold=math.inf, margin=float(margin), quantiles=(), n=len(z))
    s = guard.score(z)
    grid = sorted(set(QUANTILE_GRID) | {float(quantile)})
    qs = tuple((q, float(np.quantile(s, q))) for q in grid)
    return DomainGuard(**{**guard.__dict__, "threshold": float(np.quantile(s, quantile)), "quantiles": qs})


# ---- temperature scaling -------------------------------------------------------------------------

def logit(p_wifi: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p_wifi, dtype=np.float64), _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


def calibrate(p_wifi: np.ndarray, temperature: float) -> np.ndarray:
    """P(Wi-Fi) after temperature scaling: sigmoid(logit(p) / T) (T = 1 leaves p as it is)."""
    p = np.asarray(p_wifi, dtype=np.float64)
    if temperature == 1.0:
        return p
    return 1.0 / (1.0 + np.exp(-logit(p) / float(temperature)))


def nll(p_wifi: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(np.asarray(p_wifi, dtype=np.float64), _EPS, 1 - _EPS)
    y = np.asarray(y).astype(bool)
    return float(-np.mean(np.where(y, np.log(p), np.log1p(-p)))) if len(p) else math.nan


def fit_temperature(p_wifi: np.ndarray, y: np.ndarray, t_min: float = 0.05, t_max: float = 20.0) -> float:
    """The T in [t_min, t_max] minimizing the NLL of `calibrate(p_wifi, T)` against labels y (1 = Wi-Fi):
    a log-spaced grid, then golden-section search around its best point. 1.0 without both classes."""
    y = np.asarray(y).astype(bool)
    if len(y) == 0 or y.all() or not y.any():
        return 1.0
    z = logit(p_wifi)

    def loss(log_t: float) -> float:
        q = 1.0 / (1.0 + np.exp(-z / math.exp(log_t)))
        return nll(q, y)

    grid = np.linspace(math.log(t_min), math.log(t_max), 61)
    i = int(np.argmin([loss(g) for g in grid]))
    if i == 0 or i == len(grid) - 1:   # the best temperature lies at (or beyond) a bound: the bound
        return float(t_min if i == 0 else t_max)
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    for _ in range(40):
        if loss(c) < loss(d):
            b = d
        else:
            a = c
        c, d = b - g * (b - a), a + g * (b - a)
    return float(math.exp((a + b) / 2))


def ece(p_wifi: np.ndarray, y: np.ndarray, bins: int = 15) -> float:
    """Expected calibration error of the predicted class's confidence (max(p, 1 − p)) against
    its accuracy, over equal-width confidence bins in [0.5, 1]."""
    p = np.asarray(p_wifi, dtype=np.float64)
    y = np.asarray(y).astype(bool)
    if not len(p):
        return math.nan
    conf = np.maximum(p, 1 - p)
    correct = (p >= 0.5) == y
    idx = np.minimum(((conf - 0.5) * 2 * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        m = idx == b
        if m.any():
            total += m.mean() * abs(conf[m].mean() - correct[m].mean())
    return float(total)


@dataclass(frozen=True)
class Calibration:
    """The fitted temperature and what it did on the rows it was fitted on."""
    temperature: float
    n: int
    nll_before: float
    nll_after: float
    ece_before: float
    ece_after: float
    rows: str   # which rows it was fitted on, in words
    # what it does on rows it was not fitted on (`report`): {rows, n, ece_before, ece_after, and
    # per threshold the share of trusted rows and how often they are right, before and after}
    report: dict | None = None

    def to_json(self) -> str:
        return json.dumps({k: getattr(self, k) for k in self.__dataclass_fields__}, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Calibration":
        d = json.loads(text)
        return cls(float(d["temperature"]), int(d["n"]), float(d["nll_before"]), float(d["nll_after"]),
                   float(d["ece_before"]), float(d["ece_after"]), str(d.get("rows", "")), d.get("report"))


def fit_calibration(p_wifi: np.ndarray, y: np.ndarray, rows: str = "", min_temperature: float = 0.05) -> Calibration:
    """The temperature of `fit_temperature` (not below `min_temperature`) and its effect on the rows."""
    t = fit_temperature(p_wifi, y, t_min=min_temperature)
    q = calibrate(p_wifi, t)
    return Calibration(t, int(len(y)), nll(p_wifi, y), nll(q, y), ece(p_wifi, y), ece(q, y), rows)


def trust(p_wifi: np.ndarray, y: np.ndarray, wifi_threshold: float, cell_threshold: float) -> dict:
    """ALICCS §4.2's thresholds on labelled rows: the share of rows each trusts (Wi-Fi at
    P(Wi-Fi) ≥ wifi_threshold, 4G/5G at P(4G) ≥ cell_threshold) and how often those are right —
    what a calibrated model's thresholds should promise (right at least as often as the threshold)."""
    p = np.asarray(p_wifi, dtype=np.float64)
    y = np.asarray(y).astype(bool)
    wifi, cell = p >= wifi_threshold, (1.0 - p) >= cell_threshold
    n = max(len(p), 1)
    return {"wifi_share": float(wifi.sum() / n), "wifi_right": float(y[wifi].mean()) if wifi.any() else None,
            "cell_share": float(cell.sum() / n), "cell_right": float((~y[cell]).mean()) if cell.any() else None}


def report(p_wifi: np.ndarray, y: np.ndarray, temperature: float, rows: str, wifi_threshold: float,
           cell_threshold: float) -> dict:
    """A temperature's effect on rows it was not fitted on: ECE and `trust` before and after."""
    q = calibrate(p_wifi, temperature)
    return {"rows": rows, "n": int(len(y)), "ece_before": ece(p_wifi, y), "ece_after": ece(q, y),
            "trust_before": trust(p_wifi, y, wifi_threshold, cell_threshold),
            "trust_after": trust(q, y, wifi_threshold, cell_threshold)}
