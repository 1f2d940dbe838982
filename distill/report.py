"""The diagnosis as a page a person reads: global SHAP summary, one bar chart per diagnosed
subset (its attribution shares beside the global ones), the tree's top levels and rules, and
the worst /16s — PNGs (matplotlib, Agg) beside one self-contained `index.html`."""
from __future__ import annotations

import html
import os

import numpy as np
import pandas as pd

from ccselect.contract import FEATURES
# Imported inside the functions that use them (heavy, not needed to import this module): matplotlib, shap, sklearn.


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def global_summary_png(path: str, values_wifi: np.ndarray, raw: np.ndarray) -> str:
    """SHAP beeswarm of the P(Wi-Fi) output: each dot a connection, colour its feature value."""
    import shap
    plt = _plt()
    plt.figure()
    shap.summary_plot(values_wifi, raw, feature_names=list(FEATURES), show=False, plot_size=(9, 6))
    plt.title("SHAP of P(Wi-Fi), all rows")
    plt.tight_layout()
    plt.savefig(path, dpi=90)
    plt.close("all")
    return path


def subset_bars_png(path: str, prof: pd.DataFrame, title: str) -> str:
    """Share of attribution per feature: this subset against all rows; over-relied in red."""
    plt = _plt()
    df = prof.sort_values("share")
    y = np.arange(len(df))
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = ["#c0392b" if o else "#2e86c1" for o in df["over_relied"]]
    ax.barh(y + 0.2, df["share"], height=0.4, color=colors, label="this subset")
    ax.barh(y - 0.2, df["global_share"], height=0.4, color="#aab7b8", label="all rows")
    ax.set_yticks(y, df["feature"])
    ax.set_xlabel("share of mean |SHAP| (P(Wi-Fi))")
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def tree_png(path: str, tree, depth: int = 3) -> str:
    """The tree's first levels (the rules that split the most rows)."""
    from sklearn.tree import plot_tree
    plt = _plt()
    fig, ax = plt.subplots(figsize=(16, 7))
    plot_tree(tree, max_depth=depth, feature_names=list(FEATURES), filled=True, impurity=False,
              precision=2, fontsize=7, ax=ax)
    ax.set_title(f"distilled tree, first {depth} levels (value = [P(4G), P(Wi-Fi)])")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _table(df: pd.DataFrame, floats: str = "{:.3f}") -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = []
    for _, r in df.iterrows():
        cells = []
        for v in r:
            if isinstance(v, (float, np.floating)):
                cells.append(f"<td>{floats.format(v)}</td>")
            else:
                cells.append(f"<td>{html.escape(str(v))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


_CSS = ("body{font-family:sans-serif;margin:24px;color:#222;background:#fff}"
        "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}"
        "th{background:#eef}img{max-width:100%;border:1px solid #ddd}pre{background:#f6f6f6;padding:8px;"
        "font-size:12px;max-height:420px;overflow:auto}.over{color:#c0392b;font-weight:bold}")


def write_html(out_dir: str, meta: dict, by16: pd.DataFrame, subsets: list[dict], rules: str,
               images: dict[str, str]) -> str:
    """`index.html` in `out_dir`; `images` maps a role (global, tree, subset key) to a PNG file
    name in `out_dir`; `subsets` holds kind, key, rows, accuracy, tree_accuracy, fidelity,
    top, over_relied and the profile frame."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>ccs diagnose {html.escape(meta['run'])}"
             f"</title><style>{_CSS}</style></head><body>",
             f"<h1>ccs diagnose — {html.escape(meta['window'])}</h1>",
             "<p>" + " · ".join(f"{html.escape(k)}: <b>{html.escape(str(v))}</b>" for k, v in meta.items()) + "</p>",
             "<h2>Global attribution</h2>",
             f"<img src='{images['global']}' alt='global SHAP summary'>",
             "<h2>Diagnosed subsets</h2>"]
    if not subsets:
        parts.append("<p>No subset selected.</p>")
    for s in subsets:
        over = ", ".join(s["over_relied"]) or "none"
        parts += [f"<h3>{html.escape(s['kind'])} {html.escape(s['key'])}</h3>",
                  f"<p>rows {s['rows']} · DNN accuracy {s['accuracy']:.3f} · tree accuracy "
                  f"{s['tree_accuracy']:.3f} · tree–DNN agreement {s['fidelity']:.3f}</p>",
                  f"<p>top features: {html.escape(', '.join(s['top']))}</p>",
                  f"<p>over-relied: <span class='over'>{html.escape(over)}</span></p>",
                  f"<img src='{images[s['key']]}' alt='attribution shares of {html.escape(s['key'])}'>",
                  _table(s["profile"][["feature", "mean_abs_shap", "share", "global_share", "lift", "over_relied"]]
                         .sort_values("share", ascending=False))]
    parts += ["<h2>Accuracy per /16 (worst 20)</h2>", _table(by16.head(20)),
              "<h2>The distilled tree</h2>", f"<img src='{images['tree']}' alt='distilled tree, top levels'>",
              f"<pre>{html.escape(rules)}</pre>", "</body></html>"]
    path = os.path.join(out_dir, "index.html")
    with open(path, "w") as fh:
        fh.write("\n".join(parts))
    return path
