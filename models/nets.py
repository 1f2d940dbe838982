"""The networks of ALICCS Fig. 6: generator G (feature extractor), classifier C, and the two
discriminators D0 (4G) and D1 (Wi-Fi) that predict a sample's /24 prefix group (§3.1)."""
from __future__ import annotations

import torch
from torch import nn


def _mlp(sizes: list[int], dropout: float = 0.0) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-2], sizes[1:-1]):
        layers += [nn.Linear(a, b), nn.LayerNorm(b), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(sizes[-2], sizes[-1]))
    return nn.Sequential(*layers)


class Generator(nn.Module):
    """G: standardized Table 4 features [B, F] → representation X_y [B, H] (ReLU output)."""

    def __init__(self, n_features: int, hidden: int = 64, rep: int = 32):
        super().__init__()
        self.net = _mlp([n_features, hidden, hidden, rep])
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.net(x))


class Classifier(nn.Module):
    """C: representation [B, H] → logits over network type [B, 2] (0 = 4G/5G, 1 = Wi-Fi)."""

    def __init__(self, rep: int = 32, n_classes: int = 2):
        super().__init__()
        self.net = nn.Linear(rep, n_classes)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class Discriminator(nn.Module):
    """D_k: representation [B, H] → logits over the prefix groups of network type k [B, K_k]."""

    def __init__(self, rep: int, n_groups: int, hidden: int = 64):
        super().__init__()
        self.net = _mlp([rep, hidden, n_groups])

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class NetTypeModel(nn.Module):
    """G followed by C: what inference runs (discriminators are for training only).
    Input [B, 12] standardized features; output [B, 2] class probabilities (4G, Wi-Fi)."""

    def __init__(self, generator: Generator, classifier: Classifier):
        super().__init__()
        self.generator = generator
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.classifier(self.generator(x)), dim=-1)
