"""Groups of completions of one prompt, and the per-group statistics every group-relative estimator uses.

A batch of ``N`` rewards is split into ``K`` groups, either as ``group_size`` consecutive items (TRL's order:
``num_generations`` completions of one prompt follow each other) or by explicit ``group_ids`` (verl's
``index`` / ``uid`` array, any order). :class:`GroupIndex` maps each item to its group ``0..K-1`` once; every
statistic is then one ``index_add_`` / ``scatter_reduce`` over the batch, with no Python loop over groups.

Notation: ``N`` items (completions), ``K`` groups, ``T`` completion tokens, ``G_k`` the size of group ``k``.
"""

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from jaxtyping import Bool, Float, Int, Shaped
from torch import Tensor

__all__ = ["WHITEN_EPS", "GroupIds", "GroupIndex", "whiten"]

GroupIds = Int[Tensor, " N"] | Sequence[int] | Sequence[str] | np.ndarray
"""Explicit group labels: an integer tensor ``[N]``, or a sequence / numpy array of hashable labels
(verl's ``uid`` strings). Items with equal labels form one group; the labels' order is irrelevant."""

WHITEN_EPS = 1e-8
"""Added to the variance inside the square root by :func:`whiten` (verl ``masked_whiten``)."""


@dataclasses.dataclass(frozen=True, eq=False)
class GroupIndex:
    """The group of every item, and reductions over groups.

    Build it with :meth:`build`. All reductions take a ``Float[N]`` tensor and return ``Float[K]`` in its
    dtype; :meth:`expand` maps a per-group ``[K]`` tensor back to items ``[N]``.

    Attributes:
        index: ``Int[N]``, the group of each item, in ``[0, K)``.
        counts: ``Int[K]``, items per group (every group is non-empty).

    Example:
        >>> import torch
        >>> g = GroupIndex.build(4, group_ids=["b", "a", "b", "a"])
        >>> g.index.tolist(), g.counts.tolist()
        ([1, 0, 1, 0], [2, 2])
        >>> g.mean(torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist()
        [3.0, 2.0]
    """

    index: Int[Tensor, " N"]
    counts: Int[Tensor, " K"]

    @property
    def num_groups(self) -> int:
        """``K``."""
        return int(self.counts.shape[0])

    @property
    def num_items(self) -> int:
        """``N``."""
        return int(self.index.shape[0])

    @classmethod
    def build(
        cls,
        n: int,
        *,
        group_size: int | None = None,
        group_ids: GroupIds | None = None,
        device: torch.device | str | None = None,
        owner: str = "advantage estimator",
    ) -> "GroupIndex":
        """Group ``n`` items by ``group_size`` consecutive items or by ``group_ids`` (exactly one of them).

        Args:
            n: number of items ``N >= 1``.
            group_size: ``G >= 1`` dividing ``n``: items ``[kG, (k+1)G)`` form group ``k`` (TRL's order).
            group_ids: ``[N]`` labels (integer tensor, or a sequence / numpy array of hashables, e.g. verl's
                ``uid`` strings); items with equal labels form one group.
            device: where ``index`` and ``counts`` live (default: ``group_ids``' device, else CPU).
            owner: named in error messages.

        Raises:
            ValueError: if both or neither of ``group_size`` / ``group_ids`` are given, ``group_size`` is not
            a
                positive integer dividing ``n``, or ``group_ids`` does not hold ``n`` integer / hashable
                labels.
        """
        if group_size is not None and group_ids is not None:
            raise ValueError(f"{owner}: pass either group_size or group_ids, not both")
        if group_size is None and group_ids is None:
            raise ValueError(
                f"{owner} compares the completions of one prompt: pass group_size=G (groups of G consecutive "
                "items, TRL's order) or group_ids=[N] labels (verl's index)"
            )
        if group_size is not None:
            if (
                isinstance(group_size, bool)
                or not isinstance(group_size, (int, np.integer))
                or group_size < 1
            ):
                raise ValueError(f"{owner}: group_size must be a positive integer, got {group_size!r}")
            group_size = int(group_size)
            if n % group_size != 0:
                raise ValueError(
                    f"{owner}: group_size={group_size} does not divide the number of rewards N={n}; "
                    "rewards must come in groups of group_size consecutive items (TRL's order), or pass group_ids"
                )
            index = torch.arange(n, device=device) // group_size
            counts = torch.full((n // group_size,), group_size, dtype=torch.long, device=device)
            return cls(index=index, counts=counts)
        if isinstance(group_ids, Tensor):
            if (
                group_ids.dtype.is_floating_point
                or group_ids.dtype.is_complex
                or group_ids.dtype == torch.bool
            ):
                raise ValueError(
                    f"{owner}: group_ids must be an integer tensor (or a sequence of labels), got dtype "
                    f"{group_ids.dtype}"
                )
            if tuple(group_ids.shape) != (n,):
                raise ValueError(
                    f"{owner}: group_ids must have shape [N]={(n,)} like rewards, got "
                    f"{tuple(group_ids.shape)}"
                )
            _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
            target = group_ids.device if device is None else device
            return cls(index=inverse.to(device=target, dtype=torch.long), counts=counts.to(target))
        try:
            labels = np.asarray(group_ids)
        except Exception as exc:  # noqa: BLE001 - re-raised with the field's name
            raise ValueError(f"{owner}: group_ids must be a sequence of hashable labels: {exc}") from None
        if labels.ndim != 1 or labels.shape[0] != n:
            raise ValueError(
                f"{owner}: group_ids must hold N={n} labels like rewards, got shape {labels.shape}"
            )
        try:
            _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
        except TypeError as exc:
            raise ValueError(f"{owner}: group_ids labels must be mutually comparable ({exc})") from None
        index = torch.as_tensor(inverse.reshape(-1).astype(np.int64), device=device)
        return cls(index=index, counts=torch.as_tensor(counts.astype(np.int64), device=device))

    def expand(self, per_group: Shaped[Tensor, "K ..."]) -> Shaped[Tensor, "N ..."]:
        """``per_group[index]``: a ``[K]`` (or ``[K, ...]``) statistic for each of the ``N`` items."""
        return per_group[self.index]

    def sum(self, x: Float[Tensor, "N ..."]) -> Float[Tensor, "K ..."]:
        """Per-group sum over the items (dim 0; trailing dims, e.g. tokens ``[N, T]``, are kept)."""
        out = torch.zeros((self.num_groups, *x.shape[1:]), dtype=x.dtype, device=x.device)
        return out.index_add(0, self.index, x)

    def size(self, dtype: torch.dtype) -> Float[Tensor, " K"]:
        """Per-group item count ``G_k`` as ``dtype``."""
        return self.counts.to(dtype)

    def mean(self, x: Float[Tensor, " N"]) -> Float[Tensor, " K"]:
        """Per-group mean ``(1/G_k) sum_{i in k} x_i``."""
        return self.sum(x) / self.size(x.dtype)

    def std(self, x: Float[Tensor, " N"]) -> Float[Tensor, " K"]:
        """Per-group unbiased (Bessel) standard deviation ``sqrt(sum (x - mean)^2 / (G_k - 1))``; 0 for
        singletons.

        Matches ``torch.std`` (verl) and TRL's ``nanstd`` on groups of two or more.
        """
        centered = x - self.expand(self.mean(x))
        dof = (self.size(x.dtype) - 1).clamp(min=1)
        return (self.sum(centered * centered) / dof).sqrt()

    def max(self, x: Float[Tensor, " N"]) -> Float[Tensor, " K"]:
        """Per-group maximum."""
        out = torch.empty(self.num_groups, dtype=x.dtype, device=x.device)
        return out.scatter_reduce(0, self.index, x, reduce="amax", include_self=False)

    def min(self, x: Float[Tensor, " N"]) -> Float[Tensor, " K"]:
        """Per-group minimum."""
        out = torch.empty(self.num_groups, dtype=x.dtype, device=x.device)
        return out.scatter_reduce(0, self.index, x, reduce="amin", include_self=False)

    def degenerate(self, x: Float[Tensor, " N"]) -> Bool[Tensor, " K"]:
        """Groups holding no relative information: a single item, or all values exactly equal (zero
        variance)."""
        return self.max(x) == self.min(x)


def whiten(x: Float[Tensor, "*shape"], weight: Float[Tensor, "*shape"]) -> Float[Tensor, "*shape"]:
    """Weighted whitening ``(x - mean) / sqrt(var + 1e-8)`` with count weights (verl ``masked_whiten``).

    ``mean = sum w x / sum w`` and the unbiased ``var = sum w (x - mean)^2 / (sum w - 1)``. With a 0/1
    ``weight`` this is verl's ``masked_whiten(x, mask)`` over every counted element; with ``weight`` =
    sequence lengths on per-sequence values it equals token-level whitening of those values broadcast over
    each sequence's tokens.

    Conventions (verl raises instead): ``sum w < 2`` gives ``var = 0``, so a single counted element maps to 0.
    Elements with weight 0 are still transformed (they do not enter the statistics); callers zero them.

    Args:
        x: values, any shape.
        weight: non-negative counts of the same shape (a 0/1 mask, or lengths).

    Returns:
        Whitened ``x``, same shape and dtype.
    """
    total = weight.sum()
    mean = (weight * x).sum() / total.clamp(min=1)
    centered = x - mean
    var = (weight * centered * centered).sum() / (total - 1).clamp(min=1)
    return centered * torch.rsqrt(var + WHITEN_EPS)
