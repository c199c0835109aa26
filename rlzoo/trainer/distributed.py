"""Data parallelism under torchrun: the process group, this rank's place in it, and the few collectives the
trainer needs, each a thin call of ``torch.distributed`` (identities in one process).

``torchrun --nproc_per_node N -m rlzoo train ...`` starts N processes with ``RANK``, ``LOCAL_RANK`` and
``WORLD_SIZE`` set; :func:`init_distributed` joins them into one process group (NCCL on CUDA, gloo on CPU,
timing out after ``distributed_timeout`` seconds so that a dead or stuck rank fails the job instead of hanging
it). Without torchrun (``WORLD_SIZE`` unset, or 1 without FSDP2) nothing is initialised and every collective
returns its input.
"""

import dataclasses
import datetime
import logging
import os
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import torch
import torch.distributed as dist
from jaxtyping import Shaped
from torch import Tensor

from rlzoo.batch import Normalizer

__all__ = ["ONE_PROCESS", "RANK_LOCAL", "Distributed", "init_distributed", "leave_process_group", "shown_on_every_rank"]

RANK_LOCAL = MappingProxyType({"rank_local": True})
"""``extra=`` of a warning about what differs by rank (a signal it got, its prompts, its completions): shown by every
rank. The others (settings, data loading: the same on every rank) are rank 0's (:func:`shown_on_every_rank`)."""


def shown_on_every_rank(record: logging.LogRecord) -> bool:
    """The log filter of a rank other than 0 (``rlzoo train`` under torchrun): rlzoo's records other than errors
    and :data:`RANK_LOCAL` ones, which rank 0 logs the same, are dropped (they printed once per rank); other
    loggers' (a reward function's own) pass."""
    return (not record.name.startswith("rlzoo") or record.levelno >= logging.ERROR
            or bool(getattr(record, "rank_local", False)))

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


@dataclasses.dataclass(frozen=True)
class Distributed:
    """This process's rank among ``world_size`` (rank 0 of 1 without torchrun).

    Attributes:
        rank: global rank in [0, world_size).
        world_size: number of processes.
        local_rank: rank on this node (selects the CUDA device).
        initialized: a process group exists (torchrun), even of one rank: FSDP2 can shard over it (CPU offload on
            one GPU); the collectives are identities all the same when ``world_size`` is 1.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    initialized: bool = False

    @property
    def enabled(self) -> bool:
        """More than one process."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes the run directory, metrics and logs."""
        return self.rank == 0

    def all_reduce(self, value: Shaped[Tensor, "*shape"], op: str = "sum") -> Shaped[Tensor, "*shape"]:
        """``value`` reduced over the ranks (``op``: sum, max or min); a new tensor, the input is untouched."""
        out = value.detach().clone()
        if self.enabled:
            dist.all_reduce(out, op=_OPS[op])
        return out

    def reduce_floats(self, values: dict[str, float], op: str = "sum") -> dict[str, float]:
        """A dict of Python floats reduced over the ranks in one collective (same keys, same order on every rank)."""
        if not self.enabled or not values:
            return dict(values)
        reduced = self.all_reduce(torch.tensor(list(values.values()), dtype=torch.float64, device=self._device()), op)
        return dict(zip(values, reduced.tolist(), strict=True))

    def all_gather(self, value: Shaped[Tensor, "n ..."], *, pad_value: float | bool = 0) -> Shaped[Tensor, "total ..."]:
        """Every rank's ``value`` concatenated along dim 0 in rank order (the same on every rank).

        Dim 0 may differ between ranks; a 2-D value whose dim 1 differs is padded at the end with ``pad_value``
        to the widest. Other dims must agree.
        """
        if not self.enabled:
            return value
        device = self._device()
        x = value.to(device)
        sizes = self.all_reduce(torch.tensor([x.shape[0]], device=device), "max")  # pad rows to one size
        rows = int(sizes.item())
        if x.ndim == 2:
            width = int(self.all_reduce(torch.tensor([x.shape[1]], device=device), "max").item())
            x = torch.nn.functional.pad(x, (0, width - x.shape[1]), value=pad_value)
        counts = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(self.world_size)]
        dist.all_gather(counts, torch.tensor([value.shape[0]], device=device))
        padded = torch.cat([x, x.new_full((rows - x.shape[0], *x.shape[1:]), pad_value)]) if x.shape[0] < rows else x
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded)
        return torch.cat([p[: int(c.item())] for p, c in zip(parts, counts, strict=True)]).to(value.device)

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (picklable objects)."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable; tensors on the CPU) in rank order, on every rank."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        """Wait for every rank."""
        if self.enabled:
            dist.barrier()

    def any(self, flag: bool | int | None) -> int:
        """The largest ``flag`` over the ranks (e.g. a signal number; 0 / None = not set), so that all ranks act
        on the same decision."""
        value = int(flag or 0)
        if not self.enabled:
            return value
        return int(self.all_reduce(torch.tensor([value], device=self._device()), "max").item())

    def agreed_error(self, error: str | None) -> str | None:
        """``error`` (this rank's, or None) agreed over the ranks: this rank's, else the first other rank's with its
        rank named (``... (on rank 1's share)``), None when no rank has one. The same decision on every rank, so
        that all drop what failed on one (a collective that only some ranks enter waits forever); every rank must
        call it (one collective, two when a rank has an error)."""
        if not self.any(error is not None):
            return None
        rank, other = next((r, e) for r, e in enumerate(self.all_gather_object(error)) if e is not None)
        return error or f"{other} (on rank {rank}'s share)"

    def normalizer(self, local: Normalizer) -> Normalizer:
        """The :class:`~rlzoo.Normalizer` of the global optimizer-step batch: this rank's counts (with the per-group
        token counts, the positive-reward tokens and the IS weight sums when present) summed over the ranks, in one
        all-reduce on the collective's device (no host round trip)."""
        if not self.enabled:
            return local
        device = self._device()
        optional = ("num_positive_tokens", "is_weight_sum", "num_is_weights")
        present = [name for name in optional if getattr(local, name) is not None]
        scalars = [local.num_tokens, local.num_sequences, *(getattr(local, name) for name in present)]
        groups = [] if local.group_num_tokens is None else [local.group_num_tokens.to(device, torch.float64)]
        counts = torch.cat([torch.stack([torch.as_tensor(c, dtype=torch.float64).to(device) for c in scalars]),
                            *groups])
        total = self.all_reduce(counts)
        summed = dict(zip(present, total[2:len(scalars)], strict=True))
        return Normalizer(num_tokens=total[0], num_sequences=total[1], **summed,
                          group_num_tokens=total[len(scalars):] if groups else None)

    def shard(self, items: Sequence[Any]) -> list[Any]:
        """This rank's strided share of ``items`` (``items[rank::world_size]``)."""
        return list(items[self.rank::self.world_size])

    def _device(self) -> torch.device:
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


ONE_PROCESS = Distributed()
"""The context of a run without torchrun (rank 0 of 1; every collective is the identity)."""


def init_distributed(*, timeout_s: int, device: str, shard: bool = False) -> Distributed:
    """Join the process group torchrun set up (``WORLD_SIZE`` > 1, or 1 when ``shard``), or return the
    one-process context.

    Args:
        timeout_s: seconds a collective waits for the others before failing.
        device: the configured device (``auto``, ``cpu``, ``cuda``...): NCCL with one GPU per local rank when
            it resolves to CUDA, gloo otherwise.
        shard: FSDP2 is asked for: a torchrun launch of one process joins a group of one rank too (FSDP2 needs
            one), so that ``torchrun --nproc_per_node 1 -m rlzoo train --parallelism fsdp`` shards (and offloads)
            on one GPU.

    Raises:
        ValueError: more ranks on a node than visible CUDA devices (names LOCAL_RANK and the device count).
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1 and not (shard and "RANK" in os.environ):
        return ONE_PROCESS
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        if local_rank >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} CUDA devices are visible; "
                             "use --nproc_per_node <= the number of GPUs")
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s),
                                **({"device_id": torch.device("cuda", local_rank)} if cuda else {}))
    return Distributed(rank=rank, world_size=world_size, local_rank=local_rank, initialized=True)


def leave_process_group() -> None:
    """Destroy the default process group after a barrier (every rank must call it); a no-op without one.

    ``rlzoo train`` calls it when a run under torchrun ends normally, stops on a signal or on a non-finite step (the
    ranks agree to stop after the same step), as PyTorch asks of every program that initialised a group (NCCL warns
    at exit otherwise).
    Tearing the group down here joins gloo's and NCCL's threads while Python runs normally, instead of in the
    interpreter's exit, where torch 2.13 can deadlock: the main thread joins gloo's threads in ``~ProcessGroupGloo``
    holding the GIL while a gloo thread waits for the GIL to free a finished collective's tensor (seen with py-spy
    in a DDP process left to exit on its own). Not called after an error that only some ranks meet: the others
    would wait in the barrier until torchrun, seeing the failed rank exit, stops them (or ``distributed_timeout``
    passes).

    Raises:
        RuntimeError: torch.distributed's error when a rank is gone or the barrier outlasts ``distributed_timeout``.
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
