"""What a parallelism setting cannot honour is refused before the model loads; what has no effect is said."""

import logging

import pytest
import torch

from rlzoo.trainer.config import ParallelConfig
from rlzoo.trainer.distributed import Distributed
from rlzoo.trainer.parallel import check_parallelism

TWO = Distributed(rank=0, world_size=2, initialized=True)
CPU = torch.device("cpu")


def test_cpu_offload_needs_cuda():
    with pytest.raises(ValueError, match="fsdp_cpu_offload needs CUDA devices"):
        check_parallelism(ParallelConfig(parallelism="fsdp", fsdp_cpu_offload=True), dist=TWO, device=CPU,
                          backend="hf")
    check_parallelism(ParallelConfig(parallelism="fsdp", fsdp_cpu_offload=True), dist=TWO,
                      device=torch.device("cuda", 0), backend="hf")  # accepted where it can run


def test_vllm_under_torchrun_needs_ddp():
    with pytest.raises(ValueError, match="--backend vllm under torchrun needs --parallelism ddp"):
        check_parallelism(ParallelConfig(parallelism="fsdp"), dist=TWO, device=CPU, backend="vllm")
    check_parallelism(ParallelConfig(parallelism="ddp"), dist=TWO, device=CPU, backend="vllm")


def test_fsdp_without_torchrun_is_said_to_have_no_effect(caplog):
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        check_parallelism(ParallelConfig(parallelism="fsdp"), dist=Distributed(), device=CPU, backend="hf")
    assert "--parallelism fsdp has no effect without torchrun" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        check_parallelism(ParallelConfig(parallelism="fsdp", fsdp_cpu_offload=True), dist=Distributed(), device=CPU,
                          backend="hf")
    assert "--parallelism fsdp and --fsdp-cpu-offload have no effect without torchrun" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):  # inert_options: "... without --parallelism fsdp"
        check_parallelism(ParallelConfig(fsdp_cpu_offload=True), dist=Distributed(), device=CPU, backend="hf")
    assert not caplog.text, "said twice"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        check_parallelism(ParallelConfig(), dist=Distributed(), device=CPU, backend="hf")
    assert not caplog.text
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        check_parallelism(ParallelConfig(distributed_timeout=60), dist=Distributed(), device=CPU, backend="hf")
    assert "--distributed-timeout has no effect without torchrun" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        check_parallelism(ParallelConfig(distributed_timeout=60), dist=TWO, device=CPU, backend="hf")
    assert not caplog.text


@pytest.mark.parametrize("seconds", [0, 86_400_001, 86_400_000_000_000])
def test_a_distributed_timeout_out_of_range_is_one_line(seconds):
    """86400000000000 s crashed in datetime.timedelta (OverflowError), 10**10 s failed the rendezvous at once
    (the store's timeout in ms overflowed); at most 1000 days is taken (86400000 s ran)."""
    with pytest.raises(ValueError, match=rf"distributed_timeout must be in \[1, 86400000\] \(1000 days\), got {seconds}"):
        ParallelConfig(distributed_timeout=seconds)
    assert ParallelConfig(distributed_timeout=86_400_000).distributed_timeout == 86_400_000
