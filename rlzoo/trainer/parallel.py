"""The policy (and reference) model as the ranks hold it: plain in one process, DDP or FSDP2 under torchrun.

Every differentiated forward goes through a :class:`~rlzoo.trainer.scorer.LogProbModule`, which DDP or FSDP2
wraps as its root, so their hooks see every parameter the fused log-prob path uses (the lm_head weight
included). Generation, evaluation and saving use the Hugging Face model inside it; under FSDP2 they run in
:meth:`ParallelModel.gathered`, which all-gathers every parameter once (and keeps them gathered for the many
forward calls of ``generate``, whose count differs between ranks) and reshards after.

Gradient averaging is compensated: DDP and FSDP2 divide the summed gradients by the world size, so each rank's
loss (already divided by the global counts of :meth:`Distributed.normalizer`) is multiplied by it
(:meth:`ParallelModel.backward`): the update equals the one-process update on the same global batch.
"""

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from rlzoo.trainer.config import ParallelConfig
from rlzoo.trainer.distributed import Distributed
from rlzoo.trainer.precision import Precision
from rlzoo.trainer.scorer import LogProbModule

__all__ = ["ParallelModel", "check_parallelism", "decoder_layers"]

log = logging.getLogger("rlzoo.train")


_DEFAULT_TIMEOUT = ParallelConfig().distributed_timeout


def check_parallelism(config: ParallelConfig, *, dist: Distributed, device: torch.device, backend: str) -> None:
    """Refuse, before the model loads, a parallelism the run cannot honour; warn when it has no effect.

    Raises:
        ValueError: ``fsdp_cpu_offload`` without a CUDA device (FSDP2's CPU offload pins host memory for copies to
            the GPU); ``--backend vllm`` under torchrun with FSDP2 (each rank's engine needs whole weights, which
            the sharded parameters are not).
    """
    sharded = config.parallelism == "fsdp"
    if dist.initialized and sharded and config.fsdp_cpu_offload and device.type != "cuda":
        raise ValueError(f"fsdp_cpu_offload needs CUDA devices (it moves FSDP2's shards between pinned host memory and "
                         f"the GPU), but the run is on {device.type}: drop --fsdp-cpu-offload")
    if dist.initialized and sharded and backend == "vllm":
        raise ValueError("--backend vllm under torchrun needs --parallelism ddp: each rank's vLLM engine takes whole "
                         "weights after every optimizer step, which FSDP2's sharded parameters are not (not "
                         "implemented); or use --backend hf, which generates from the gathered FSDP2 model")
    if not dist.initialized and sharded:  # --fsdp-cpu-offload without fsdp: inert_options says so
        given = "--parallelism fsdp and --fsdp-cpu-offload have" if config.fsdp_cpu_offload else "--parallelism fsdp has"
        log.warning("%s no effect without torchrun (given, or a resumed run's setting; the model is whole): launch "
                    "with torchrun --nproc_per_node N -m rlzoo train ... (N = 1 too) to shard it", given)
    if not dist.initialized and config.distributed_timeout != _DEFAULT_TIMEOUT:
        log.warning("--distributed-timeout has no effect without torchrun (one process waits for no other rank)")


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The repeated blocks of a causal LM: its first ``ModuleList`` whose children are all of one type (a
    Hugging Face model's ``model.layers``), the units FSDP2 shards one at a time.

    Raises:
        ValueError: the model has no such list.
    """
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0 and len({type(m) for m in module}) == 1:
            return module
    raise ValueError(f"{type(model).__name__} has no list of decoder layers for FSDP to shard; use --parallelism ddp")


@torch.no_grad()
def _first_forward(module: torch.nn.Module, device: torch.device) -> None:
    """One tiny forward through the FSDP2 root: FSDP2 initialises its units lazily, root first, in the first
    forward; :meth:`ParallelModel.gathered` unshards every unit and must not come first."""
    one = torch.ones(1, 1, dtype=torch.long, device=device)
    module(one, one.bool(), torch.zeros(1, dtype=torch.long, device=device), one, one.bool(), temperature=1.0,
           share_prefix=False, fused=True, with_entropy=False)


class ParallelModel:
    """A model with the module its log-probs are computed through.

    Args:
        model: the Hugging Face causal LM (already on this rank's device).
        dist: the process group context.
        config: the parallelism section.
        precision: under bf16-mixed, FSDP2 computes with bf16 parameters and reduces gradients in fp32.
        trainable: the policy (True) or the frozen reference (False: no DDP, FSDP2 shards it all the same).

    Attributes:
        model: the Hugging Face model (generation, saving).
        module: the :class:`LogProbModule` to call (wrapped by DDP or FSDP2 under torchrun).
        sharded: FSDP2 shards the parameters.
    """

    def __init__(self, model: torch.nn.Module, *, dist: Distributed, config: ParallelConfig, precision: Precision,
                 trainable: bool = True) -> None:
        self.model = model
        self.dist = dist
        self.sharded = dist.initialized and config.parallelism == "fsdp"
        module: torch.nn.Module = LogProbModule(model)
        if self.sharded:
            from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

            kwargs: dict[str, Any] = {}
            if precision.autocast_dtype is not None:
                kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=precision.autocast_dtype,
                                                           reduce_dtype=torch.float32)
            if config.fsdp_cpu_offload:
                kwargs["offload_policy"] = CPUOffloadPolicy()
            for layer in decoder_layers(model):
                fully_shard(layer, **kwargs)
            # the root too reshards after every forward: its no-grad forwards (old / reference log-probs) have no
            # backward to reshard after, and the optimizer must hold (and step) the sharded parameters
            fully_shard(module, reshard_after_forward=True, **kwargs)
            _first_forward(module, precision.device)
        elif dist.enabled and trainable:
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [precision.device.index or 0] if precision.device.type == "cuda" else None
            module = DistributedDataParallel(module, device_ids=device_ids)
        self.module = module

    @contextlib.contextmanager
    def accumulating(self, *, sync: bool) -> Iterator[None]:
        """Around one micro-batch's forward and backward. Under DDP, ``sync`` False (a micro-batch before the
        optimizer step's last) skips the gradient all-reduce (DDP's ``no_sync``): the gradients add up locally and
        the last micro-batch's all-reduce averages their sum, the same update with one all-reduce per optimizer step
        instead of one per micro-batch (as accelerate does under gradient accumulation). FSDP2 reduce-scatters after
        every micro-batch (skipping it would hold whole unsharded gradients on every rank); one process: a no-op."""
        from torch.nn.parallel import DistributedDataParallel

        if sync or not isinstance(self.module, DistributedDataParallel):
            yield
            return
        with self.module.no_sync():
            yield

    def backward(self, loss: Float[Tensor, ""]) -> None:
        """``loss.backward()``, times the world size to undo the wrappers' gradient averaging."""
        (loss * self.dist.world_size if self.dist.enabled else loss).backward()

    @contextlib.contextmanager
    def gathered(self) -> Iterator[torch.nn.Module]:
        """The Hugging Face model with every parameter whole, for any number of forward calls (generation,
        evaluation); a no-op unless FSDP2 shards it. Every rank must enter it (it all-gathers)."""
        if not self.sharded:
            yield self.model
            return
        from torch.distributed.fsdp import FSDPModule

        units = [m for m in self.module.modules() if isinstance(m, FSDPModule)]
        for unit in units:
            unit.unshard()
            unit.set_reshard_after_forward(False, recurse=False)
        try:
            yield self.model
        finally:
            for unit in units:
                unit.reshard()
                unit.set_reshard_after_forward(True, recurse=False)

    def full_state_dict(self) -> dict[str, Tensor]:
        """Under FSDP2, the model's whole state dict with the Hugging Face names, on the CPU, on rank 0 ({} on
        the others); every rank must call it (it all-gathers). Without sharding the model itself is whole:
        its own ``state_dict()``."""
        if not self.sharded:
            return dict(self.model.state_dict())
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k.removeprefix("model."): v for k, v in state.items()} if self.dist.is_main else {}
