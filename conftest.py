"""Root pytest set-up: make tests/ importable for every collected path (also `pytest rlzoo` for doctests),
so the type checker named in pyproject's --jaxtyping-packages (tests/rlzoo_typecheck.py) resolves."""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent / "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
