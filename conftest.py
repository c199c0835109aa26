"""Root pytest set-up for tests/, benchmarks/ and the doctests of rlzoo/: make tests/ importable (so the type
checker named in pyproject's --jaxtyping-packages, tests/rlzoo_typecheck.py, resolves), skip CUDA-marked items
without a GPU, and run every other item on the CPU where a GPU is present too (as CI does)."""

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent / "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``@pytest.mark.cuda`` items when no GPU is present."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def _hide_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    if torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture(autouse=True)
def _cpu_unless_marked_cuda(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Items not marked ``cuda`` see no GPU, in-process and in the processes they start: their exact equalities
    (bitwise resume, float32 tolerances) state CPU arithmetic, and ``--device auto`` / ``--dtype auto`` would put
    them on CUDA under bf16 autocast on a GPU machine. The ``cuda``-marked items are the GPU's tests."""
    if "cuda" not in request.keywords:
        _hide_gpu(monkeypatch)


@pytest.fixture(scope="module")
def cpu_only_module() -> Iterator[None]:
    """The same for a module-scoped fixture of CPU tests (set up before the per-item fixture above)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _hide_gpu(monkeypatch)
        yield
