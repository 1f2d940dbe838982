"""Training of the ALICCS classifier (§3.1): alternating updates — the discriminators on L_D with
G and C fixed, then G and C on L_all (eq. 7) with the discriminators fixed — and the variants
that the ablation of Fig. 10 compares (plain MLP, without GAN, without RSC, without L_variance).

Node domains (issue 28): ALICCS's discriminators read the prefix group, a proxy for what shifts
between nodes. Every node's traffic is there unlabelled (only ~30% of nodes carry labels), so a
third discriminator D_N reads the *node* from G's output, trained on unlabelled rows of every node
(labelled ones among them), and G makes D_N's answer uniform over the nodes (the domain
confusion loss of Tzeng et al., ICCV 2015, with the DANN warm-up of Ganin et al., JMLR 2016;
eq. 7's −L_D form lets G beat a discriminator without blinding it): unsupervised domain
adaptation with nodes as domains. `aliccs_nodes` adds it to ALICCS; `dann_nodes` is it alone
with the classifier.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ccselect.models.losses import DiscriminatorLoss, PrefixVarianceLoss, RSCLoss, total_loss
from ccselect.models.nets import Classifier, Discriminator, Generator, NetTypeModel

VARIANTS = {
    # name: (use_gan, use_rsc, use_variance, use_node_domains)
    "aliccs": (True, True, True, False),
    "no_gan": (False, True, True, False),
    "no_rsc": (True, False, True, False),
    "no_variance": (True, True, False, False),
    "mlp": (False, False, False, False),
    "aliccs_nodes": (True, True, True, True),
    "dann_nodes": (False, False, False, True),
}
#: variants that need every node's unlabelled rows (TrainData.x_unl)
NODE_DOMAIN_VARIANTS = tuple(v for v, f in VARIANTS.items() if f[3])


@dataclass(frozen=True)
class TrainParams:
    variant: str = "aliccs"
    lambda1: float = 0.3       # weight of −L_D (eq. 7); chosen by grid search (Appendix D)
    lambda2: float = 0.05      # weight of L_G = L_variance (eq. 7)
    lambda3: float = 0.3       # weight of the node confusion loss (node-domain variants)
    epochs: int = 12
    #: at least this many optimizer steps: a small window's rows make few batches an epoch (the
    #: make-run window's 1,755 rows: 4 batches, 48 steps in 12 epochs, an under-trained model);
    #: `fit` then runs more epochs (`effective_epochs`). 0: exactly `epochs`
    min_steps: int = 0
    batch_size: int = 512
    rows_per_prefix: int = 8   # batches hold runs of ≤8 rows of one /24, so eq. 3 has pairs
    lr: float = 2e-3
    d_lr: float = 2e-3
    hidden: int = 64
    rep: int = 32
    rsc_feature_drop: float = 1 / 3
    rsc_batch_drop: float = 1 / 3
    seed: int = 0
    device: str = "auto"
    #: torch's intra-op threads while fitting (restored after); None: leave torch's own setting.
    #: The pipeline passes `pipeline.train_threads`; the benches set torch's themselves.
    threads: int | None = None

    def flags(self) -> tuple[bool, bool, bool, bool]:
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; one of {sorted(VARIANTS)}")
        return VARIANTS[self.variant]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TrainData:
    """Training rows: standardized features x [N, F] float32, network type y [N] (0 = 4G/5G,
    1 = Wi-Fi), /24 id prefix [N], prefix group group [N] (index within its own type)."""

    x: np.ndarray
    y: np.ndarray
    prefix: np.ndarray
    group: np.ndarray
    n_groups: tuple[int, int]  # (K0 for 4G, K1 for Wi-Fi)
    # node-domain variants: unlabelled rows of every node (standardized as x) and their node index
    x_unl: np.ndarray | None = None
    node_unl: np.ndarray | None = None
    n_nodes: int = 0


def choose_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def prefix_batches(prefix: np.ndarray, batch_size: int, rows_per_prefix: int,
                   rng: np.random.Generator) -> list[np.ndarray]:
    """Row indices in batches made of shuffled runs of ≤`rows_per_prefix` rows from one /24."""
    order = np.lexsort((rng.random(len(prefix)), prefix))
    p = prefix[order]
    starts = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])
    ends = np.r_[starts[1:], len(p)]
    runs = [order[i:min(i + rows_per_prefix, e)] for s, e in zip(starts, ends) for i in range(s, e, rows_per_prefix)]
    runs = [runs[i] for i in rng.permutation(len(runs))]
    flat = np.concatenate(runs) if runs else np.array([], dtype=np.int64)
    return [flat[i:i + batch_size] for i in range(0, len(flat), batch_size)]


class Trainer:
    """Holds G, C, D0, D1 and their optimizers; `train_one_epoch` and `evaluate` apart."""

    def __init__(self, params: TrainParams, n_features: int, n_groups: tuple[int, int], n_nodes: int = 0):
        self.p = params
        self.use_gan, self.use_rsc, self.use_var, self.use_nodes = params.flags()
        torch.manual_seed(params.seed)
        self.device = choose_device(params.device)
        self.G = Generator(n_features, params.hidden, params.rep).to(self.device)
        self.C = Classifier(params.rep).to(self.device)
        self.D0 = Discriminator(params.rep, max(1, n_groups[0])).to(self.device)
        self.D1 = Discriminator(params.rep, max(1, n_groups[1])).to(self.device)
        self.opt_gc = torch.optim.Adam([*self.G.parameters(), *self.C.parameters()], lr=params.lr)
        if self.use_nodes and n_nodes < 2:
            raise ValueError(f"variant {params.variant} needs unlabelled rows of two or more nodes")
        self.DN = Discriminator(params.rep, max(2, n_nodes)).to(self.device) if self.use_nodes else None
        self.opt_d = torch.optim.Adam([*self.D0.parameters(), *self.D1.parameters(),
                                       *(self.DN.parameters() if self.DN is not None else ())], lr=params.d_lr)
        self.l_d = DiscriminatorLoss()
        self.l_var = PrefixVarianceLoss()
        self.l_rsc = RSCLoss(params.rsc_feature_drop, params.rsc_batch_drop)
        self.rng = np.random.default_rng(params.seed)

    @property
    def model(self) -> NetTypeModel:
        return NetTypeModel(self.G, self.C)

    def discriminator_step(self, x: torch.Tensor, y: torch.Tensor, g: torch.Tensor,
                           xu: torch.Tensor | None = None, nu: torch.Tensor | None = None) -> float:
        """Phase 1: train D0, D1 on L_D (and D_N on the unlabelled rows' nodes, L_N) with G fixed
        (its output detached)."""
        loss = torch.zeros((), device=self.device)
        if self.use_gan:
            with torch.no_grad():
                z = self.G(x)
            loss = loss + self.l_d(self.D0(z), self.D1(z), y, g)
        if self.use_nodes and xu is not None:
            with torch.no_grad():
                zu = self.G(xu)
            loss = loss + F.cross_entropy(self.DN(zu), nu)
        self.opt_d.zero_grad(set_to_none=True)
        loss.backward()
        self.opt_d.step()
        return loss.item()

    def generator_step(self, x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, pfx: torch.Tensor,
                       lambda1: float, xu: torch.Tensor | None = None, nu: torch.Tensor | None = None,
                       lambda3: float = 0.0) -> dict[str, float]:
        """Phase 2: train G and C on L_all with the discriminators fixed (not stepped)."""
        z = self.G(x)
        ce = F.cross_entropy(self.C(z), y)
        l_c = ce
        rsc = torch.zeros((), device=z.device)
        if self.use_rsc:
            rsc, _ = self.l_rsc(z, y, self.C)
            l_c = ce + rsc
        l_d = self.l_d(self.D0(z), self.D1(z), y, g) if self.use_gan else torch.zeros((), device=z.device)
        l_g = self.l_var(z, pfx) if self.use_var else torch.zeros((), device=z.device)
        loss = total_loss(l_c, l_d, l_g, lambda1 if self.use_gan else 0.0, self.p.lambda2 if self.use_var else 0.0)
        l_n = torch.zeros((), device=z.device)
        if self.use_nodes and xu is not None:
            # G makes D_N's answer uniform over the nodes (the domain confusion loss: the
            # cross-entropy of D_N's output against the uniform distribution), rather than
            # maximising L_N as eq. 7 does L_D: −L_N can be maximised by a z from which D_N's
            # answers are confidently wrong yet the node is as readable as before (a probe
            # fitted after training reads it; the beaten-not-blind of the prefix groups)
            l_n = -F.log_softmax(self.DN(self.G(xu)), dim=1).mean()
            loss = loss + lambda3 * l_n
        self.opt_gc.zero_grad(set_to_none=True)
        loss.backward()
        self.opt_gc.step()
        return {"ce": ce.item(), "rsc": rsc.item(), "l_d_adv": l_d.item(), "l_variance": l_g.item(),
                "l_node_confusion": l_n.item(), "l_all": loss.item()}

    def train_one_epoch(self, data: TrainData, epoch: int) -> dict[str, float]:
        self.G.train(), self.C.train(), self.D0.train(), self.D1.train()
        batches = prefix_batches(data.prefix, self.p.batch_size, self.p.rows_per_prefix, self.rng)
        # λ1 warm-up as in DANN: 2/(1+e^(−10p)) − 1 over training progress p
        progress = epoch / max(1, self.p.epochs)
        lam1 = self.p.lambda1 * (2 / (1 + math.exp(-10 * progress)) - 1)
        sums: dict[str, float] = {}
        t = lambda a, dt: torch.as_tensor(a, dtype=dt, device=self.device)  # noqa: E731
        lam3 = self.p.lambda3 * (2 / (1 + math.exp(-10 * progress)) - 1)
        use_unl = self.use_nodes and data.x_unl is not None and len(data.x_unl) > 0
        for idx in batches:
            x, y = t(data.x[idx], torch.float32), t(data.y[idx], torch.long)
            g, pfx = t(data.group[idx], torch.long), t(data.prefix[idx], torch.long)
            xu = nu = None
            if use_unl:  # a batch of unlabelled rows, drawn from every node's
                ui = self.rng.integers(0, len(data.x_unl), size=len(idx))
                xu, nu = t(data.x_unl[ui], torch.float32), t(data.node_unl[ui], torch.long)
            stats = {}
            if self.use_gan or use_unl:
                stats["l_d"] = self.discriminator_step(x, y, g, xu, nu)
            stats.update(self.generator_step(x, y, g, pfx, lam1, xu, nu, lam3))
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v * len(idx)
        n = max(1, sum(len(b) for b in batches))
        out = {k: v / n for k, v in sums.items()}
        out["lambda1_effective"] = lam1
        return out

    @torch.no_grad()
    def represent(self, x: np.ndarray, batch: int = 65536) -> np.ndarray:
        """G's output z [N, rep] for standardized rows x (what the invariance probe reads)."""
        self.G.eval()
        out = [self.G(torch.as_tensor(x[i:i + batch], dtype=torch.float32, device=self.device)).cpu().numpy()
               for i in range(0, len(x), batch)]
        return np.concatenate(out) if out else np.zeros((0, self.p.rep), dtype=np.float32)

    @torch.no_grad()
    def predict_proba(self, x: np.ndarray, batch: int = 65536) -> np.ndarray:
        """P(Wi-Fi) per row (the second of the two class probabilities)."""
        self.G.eval(), self.C.eval()
        out = []
        for i in range(0, len(x), batch):
            xb = torch.as_tensor(x[i:i + batch], dtype=torch.float32, device=self.device)
            out.append(torch.softmax(self.C(self.G(xb)), 1)[:, 1].cpu().numpy())
        return np.concatenate(out) if out else np.zeros(0)

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
        pred = self.predict_proba(x) >= 0.5
        return accuracy_report(y, pred)


def accuracy_report(y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    y = np.asarray(y).astype(bool)
    pred = np.asarray(pred).astype(bool)
    return {
        "n": int(len(y)),
        "accuracy": float((pred == y).mean()) if len(y) else float("nan"),
        "wifi_recall": float(pred[y].mean()) if y.any() else float("nan"),
        "cell_recall": float((~pred[~y]).mean()) if (~y).any() else float("nan"),
        "share_cell": float((~y).mean()) if len(y) else float("nan"),
    }


def effective_epochs(params: TrainParams, n_rows: int) -> int:
    """`params.epochs`, or more when that many epochs of `n_rows` rows give fewer than
    `params.min_steps` optimizer steps (one step per batch of `batch_size` rows)."""
    per_epoch = max(1, math.ceil(n_rows / max(1, params.batch_size)))
    return max(params.epochs, math.ceil(params.min_steps / per_epoch) if params.min_steps > 0 else 0)


def fit(params: TrainParams, data: TrainData,
        on_epoch: Callable[[int, dict[str, float]], None] | None = None) -> Trainer:
    """Train one variant; `on_epoch(epoch, metrics)` is called after each epoch (MLflow logging).
    The trainer's `p` holds the epochs it ran (`effective_epochs`)."""
    params = replace(params, epochs=effective_epochs(params, len(data.y)))
    before = torch.get_num_threads()
    if params.threads:
        torch.set_num_threads(params.threads)
    try:
        trainer = Trainer(params, data.x.shape[1], data.n_groups, data.n_nodes)
        for epoch in range(params.epochs):
            metrics = trainer.train_one_epoch(data, epoch)
            if on_epoch:
                on_epoch(epoch, metrics)
    finally:
        torch.set_num_threads(before)
    return trainer
