"""Reference implementations used as test oracles (never copied into rlzoo).

* TRL 1.16 (a test dependency): imported normally.
* verl 0.9.1 ``core_algos``: installed with ``--no-deps``; it imports ``ray`` at module load for
  unrelated worker code, which a lightweight stub satisfies so the tests need no Ray install.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

import pytest


class _Stub(types.ModuleType):
    """A module whose every attribute is another stub and whose calls return a stub (or the decoratee)."""

    def __getattr__(self, name: str) -> "_Stub":
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):
        if args and callable(args[0]) and not kwargs and len(args) == 1:
            return args[0]
        return _Stub(f"{self.__name__}()")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Stub(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        pass


def verl_core_algos() -> types.ModuleType:
    """``verl.trainer.ppo.core_algos``; skips the test when verl is not installed (fails under ``CI``)."""
    if importlib.util.find_spec("verl") is None:
        message = "verl (test oracle) is not installed: pip install --no-deps verl==0.9.1"
        if os.environ.get("CI"):  # CI installs it (.ci/run): a missing oracle there is a failure, not a skip
            pytest.fail(message)
        pytest.skip(message)
    # `import verl` itself imports ray (verl/protocol.py): stub it before the first import of verl
    if importlib.util.find_spec("ray") is None and not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder(("ray",)))
    from verl.trainer.ppo import core_algos

    return core_algos
