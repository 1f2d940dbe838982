"""Gradient-boosted trees on the twelve standardized features of Table 4: the baseline a skeptic
tries first beside the MLP (issue 55), in `ccs evaluate` as `gbdt` and, on features re-standardized
per node over each node's own traffic, `gbdt_nodestd`.

scikit-learn's HistGradientBoostingClassifier with its defaults (100 boosting rounds of 31-leaf
trees, learning rate 0.1), early stopping off so that a seed gives one model whatever the rows'
order; the labels are the same balanced training set every variant trains on."""
from __future__ import annotations

import numpy as np

# Imported inside the functions that use them (heavy, not needed to import this module): sklearn.


def fit(x: np.ndarray, y: np.ndarray, seed: int):
    """A fitted classifier of Wi-Fi (1) against cellular (0)."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    model = HistGradientBoostingClassifier(early_stopping=False, random_state=seed)
    return model.fit(np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64))


def predict_proba(model, x: np.ndarray) -> np.ndarray:
    """P(Wi-Fi) per row."""
    if not len(x):
        return np.zeros(0)
    proba = model.predict_proba(np.asarray(x, dtype=np.float32))
    classes = list(model.classes_)
    return proba[:, classes.index(1)] if 1 in classes else np.zeros(len(x))
