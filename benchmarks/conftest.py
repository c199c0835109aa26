"""pytest-benchmark set-up for ``python -m pytest benchmarks/ --benchmark-only``.

* The project's pytest ``addopts`` turn on the jaxtyping/beartype import hook for rlzoo (a test-time
  checker). Benchmarks must time the code users run, and Dynamo cannot compile through the hook, so
  this conftest removes the hook before anything imports rlzoo.
* CUDA cases (``@pytest.mark.cuda``) are skipped cleanly without a GPU by the root conftest.py.
* Environment knobs: ``RLZOO_BENCH_ROUNDS`` (timed rounds per case; default 3 on CPU, 10 on CUDA),
  ``RLZOO_BENCH_THREADS`` (torch CPU threads; default: all cores), ``RLZOO_BENCH_MEMORY=0`` (skip the
  peak-memory measurement).
* Machine info (torch/triton/trl versions, GPU, threads) is added to the saved JSON.
"""

import os
import platform
import sys

import pytest


def _drop_jaxtyping_hook() -> bool:
    """Remove jaxtyping's import hook from ``sys.meta_path``; True if rlzoo was already imported under it."""
    for finder in list(sys.meta_path):
        if type(finder).__module__.startswith("jaxtyping"):
            sys.meta_path.remove(finder)
    return "rlzoo" in sys.modules and "jaxtyping" in str(getattr(sys.modules["rlzoo"], "__loader__", ""))


RLZOO_TYPECHECKED = _drop_jaxtyping_hook()

import torch

if os.environ.get("RLZOO_BENCH_THREADS"):
    torch.set_num_threads(int(os.environ["RLZOO_BENCH_THREADS"]))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs a CUDA device")



def _version(name: str) -> str | None:
    try:
        module = __import__(name)
    except Exception:  # noqa: BLE001 - an optional package that fails to import is reported as absent
        return None
    return getattr(module, "__version__", "unknown")


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    machine_info["torch"] = torch.__version__
    machine_info["torch_threads"] = torch.get_num_threads()
    machine_info["cpu_count"] = os.cpu_count()
    machine_info["platform_detail"] = platform.platform()
    for name in ("triton", "trl", "liger_kernel", "transformers"):
        machine_info[name] = _version(name)
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        machine_info["cuda_device"] = props.name
        machine_info["cuda_memory_gib"] = round(props.total_memory / 2**30, 1)
        machine_info["cuda_version"] = torch.version.cuda
    else:
        machine_info["cuda_device"] = None
    machine_info["rlzoo_typechecked"] = RLZOO_TYPECHECKED
    try:
        with open("/proc/loadavg") as f:
            machine_info["loadavg_at_start"] = f.read().split()[:3]
    except OSError:
        pass
