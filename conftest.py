"""Root pytest set-up for tests/, benchmarks/ and the doctests of rlzoo/: make tests/ importable (so the type
checker named in pyproject's --jaxtyping-packages, tests/rlzoo_typecheck.py, resolves), and skip CUDA-marked
items without a GPU."""

import sys
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
