"""The losses of ALICCS §3.1, eqs. (1)-(7), as modules with their shapes.

Notation: B samples, H representation width, K0/K1 prefix groups of 4G and Wi-Fi.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DiscriminatorLoss(nn.Module):
    """L_D = R_D0 + R_D1 (eqs. 1, 2, 4): cross-entropy of D0 on the 4G samples' prefix groups
    plus that of D1 on the Wi-Fi samples'.

    Inputs: logits0 [B, K0], logits1 [B, K1], y [B] (0 = 4G, 1 = Wi-Fi), group [B] (the sample's
    prefix-group index within its own network type). A type absent from the batch adds 0.
    """

    def forward(self, logits0: torch.Tensor, logits1: torch.Tensor, y: torch.Tensor,
                group: torch.Tensor) -> torch.Tensor:
        loss = logits0.new_zeros(())
        for k, logits in ((0, logits0), (1, logits1)):
            m = y == k
            if m.any():
                loss = loss + F.cross_entropy(logits[m], group[m])
        return loss


class PrefixVarianceLoss(nn.Module):
    """L_variance (eq. 3): the within-/24 scatter of G's representation,
    Σ_prefix Σ_{j∈prefix} ‖X^j − X̄_prefix‖², divided by B so its scale does not grow with the
    batch. Inputs: z [B, H], prefix [B] (integer /24 id). Prefixes seen once contribute 0."""

    def forward(self, z: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
        uniq, inv = torch.unique(prefix, return_inverse=True)
        counts = torch.bincount(inv, minlength=len(uniq)).to(z.dtype).unsqueeze(1)
        sums = torch.zeros(len(uniq), z.shape[1], dtype=z.dtype, device=z.device).index_add_(0, inv, z)
        means = sums / counts
        return ((z - means[inv]) ** 2).sum() / z.shape[0]


class RSCLoss(nn.Module):
    """L_RSC (the RSC term of eq. 5; Huang et al., ECCV 2020, as in DomainBed's RSC):
    1. gradient of the true-class logit w.r.t. the representation z [B, H];
    2. per sample, mute the `feature_drop` share of dimensions with the largest gradient;
    3. keep the muting only for the `batch_drop` share of samples whose true-class probability
       drops most when muted (the others keep all features);
    4. cross-entropy of C on the muted representation.
    Inputs: z [B, H] (attached to G), y [B]; `classifier` is C. Returns (loss, mask [B, H])."""

    def __init__(self, feature_drop: float = 1 / 3, batch_drop: float = 1 / 3):
        super().__init__()
        if not (0 <= feature_drop < 1 and 0 <= batch_drop <= 1):
            raise ValueError("RSC drop shares must be in [0, 1)")
        self.feature_drop = feature_drop
        self.batch_drop = batch_drop

    def masks(self, z: torch.Tensor, y: torch.Tensor, classifier: nn.Module) -> torch.Tensor:
        zd = z.detach().requires_grad_(True)
        logits = classifier(zd)
        onehot = F.one_hot(y, logits.shape[1]).to(logits.dtype)
        (grad,) = torch.autograd.grad((logits * onehot).sum(), zd)
        h = z.shape[1]
        n_mute = int(round(self.feature_drop * h))
        mask_f = torch.ones_like(z)
        if n_mute:
            top = grad.topk(n_mute, dim=1).indices
            mask_f.scatter_(1, top, 0.0)
        with torch.no_grad():
            p = torch.softmax(logits, 1)
            p_muted = torch.softmax(classifier(z.detach() * mask_f), 1)
            change = ((p - p_muted) * onehot).sum(1)
        n_keep = int(round(self.batch_drop * z.shape[0]))
        chosen = torch.zeros(z.shape[0], dtype=torch.bool, device=z.device)
        if n_keep:
            chosen[change.topk(n_keep).indices] = True
        return torch.where(chosen.unsqueeze(1), mask_f, torch.ones_like(mask_f))

    def forward(self, z: torch.Tensor, y: torch.Tensor, classifier: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        mask = self.masks(z, y, classifier)
        return F.cross_entropy(classifier(z * mask), y), mask


def total_loss(l_c: torch.Tensor, l_d: torch.Tensor, l_g: torch.Tensor, lambda1: float, lambda2: float) -> torch.Tensor:
    """L_all = L_C − λ1·L_D + λ2·L_G (eq. 7), minimised by G and C with D fixed."""
    return l_c - lambda1 * l_d + lambda2 * l_g
