"""Shared cases of the fused-linear kernel tests: odd shapes, every logit transform, seeded float64 problems."""

import math

import torch

# (N, H, V, chunk_size): a single token and vocabulary, chunks that split V unevenly, a chunk larger than V
SHAPES = [(1, 1, 1, None), (1, 3, 2, 1), (7, 5, 13, 4), (33, 8, 130, 17), (5, 4, 9, 100)]
# logit transforms: temperature, scale, soft-cap, and all of them with a bias
OPTIONS = [
    {},
    {"temperature": 0.6},
    {"logit_scale": 0.25},
    {"logit_softcap": 2.0},
    {"bias": True, "logit_scale": 1.7, "logit_softcap": 5.0, "temperature": 1.3},
]


def linear_problem(n, h, v, dtype=torch.float64, seed=0, bias=False):
    """``(hidden [n, h], weight [v, h], bias [v] | None, ids [n])``: float64 draws cast to ``dtype`` (leaves that
    require grad), weight scaled so that logits are O(3)."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64)
    weight = torch.randn(v, h, generator=g, dtype=torch.float64) / math.sqrt(h) * 3
    b = torch.randn(v, generator=g, dtype=torch.float64) if bias else None
    ids = torch.randint(0, v, (n,), generator=g)
    cast = [t if t is None else t.to(dtype).requires_grad_() for t in (hidden, weight, b)]
    return (*cast, ids)
