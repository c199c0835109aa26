"""Reference implementations used as test oracles (never copied into rlzoo).

* TRL 1.16 (a test dependency): imported normally.
* verl 0.9.1 ``core_algos``: installed with ``--no-deps``; it imports ``ray`` at module load for
  unrelated worker code, which a lightweight stub satisfies so the tests need no Ray install.
* AReaL 1.0.4 and SkyRL 0.4.0: installed with ``--no-deps`` (pure Python); a few of their files are imported
  from the installed package with the rest of the package stubbed (:func:`areal`, :func:`skyrl`).
"""

import ast
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Self

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


# ------------------------------------------------------------------------------ AReaL and SkyRL (partial import)
# Both install with --no-deps as pure Python (.ci/run), but their package __init__ files pull in their whole
# systems (Ray, aiohttp, hydra, inference clients, ...). The oracles need a few files whose top-level imports are
# light: those files run as they are, from the installed package; every other module of the package, and every
# third-party module those files import at top level that is not installed, is a stub. Nothing stays registered
# afterwards: the interpreter's module table is restored.


class _FalsyStub(_Stub):
    """A stub that is False in a condition (``if ray.is_initialized():`` at import: an absent service is not
    running), iterates as empty, is a context manager (logging scopes) and can be a base class."""

    def __getattr__(self, name: str) -> "_FalsyStub":
        if name.startswith("__"):
            raise AttributeError(name)
        return _FalsyStub(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):
        if args and callable(args[0]) and not kwargs and len(args) == 1:
            return args[0]
        return _FalsyStub(f"{self.__name__}()")

    def __bool__(self) -> bool:
        return False

    def __iter__(self):
        return iter(())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def __mro_entries__(self, bases):
        return (object,)


def _top_level_imports(path: str) -> set[str]:
    """The root names a file imports unconditionally (module-level ``import`` / ``from``; those in a ``try``
    handle their own absence and are left alone)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    roots = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


class _PartialFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``package``'s modules in ``real`` from their files; its other modules and the roots ``stubbed``: stubs."""

    def __init__(self, package: str, location: str, real: tuple[str, ...], stubbed: set[str]) -> None:
        self.package, self.location, self.real, self.stubbed = package, location, real, stubbed

    def find_spec(self, fullname, path, target=None):
        if fullname in self.real:
            parts = fullname.split(".")[1:]
            return importlib.util.spec_from_file_location(fullname, os.path.join(self.location, *parts) + ".py")
        if fullname.split(".")[0] in self.stubbed | {self.package}:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _FalsyStub(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        pass


def _partial_import(package: str, real: tuple[str, ...], *, install: str,
                    reexports: dict[str, str] | None = None) -> dict[str, types.ModuleType]:
    """The modules ``real`` (imported in order) of the installed reference ``package``, without its package imports.

    ``reexports`` maps a stubbed package to a real module whose public names it re-exports (``from
    areal.utils.functional import ppo_actor_loss_fn`` in a real file then gets the real function). Skips the test
    when ``package`` is not installed (fails under ``CI``, which installs it with the command ``install``).
    """
    spec = importlib.machinery.PathFinder.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        message = f"{package} (test oracle) is not installed: {install}"
        if os.environ.get("CI"):  # CI installs it (.ci/run): a missing oracle there is a failure, not a skip
            pytest.fail(message)
        pytest.skip(message)
    location = spec.submodule_search_locations[0]
    stubbed = set()
    for name in real:
        for root in _top_level_imports(os.path.join(location, *name.split(".")[1:]) + ".py"):
            if (root != package and root not in sys.stdlib_module_names
                    and importlib.machinery.PathFinder.find_spec(root) is None):
                stubbed.add(root)
    ours = stubbed | {package}  # the module names this import owns; third-party modules it loads stay loaded
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] in ours}
    for name in saved:  # e.g. verl's ray stub (truthy): these files get their own
        del sys.modules[name]
    finder = _PartialFinder(package, location, real, stubbed)
    sys.meta_path.insert(0, finder)
    try:
        modules = {}
        for name in real:
            modules[name] = importlib.import_module(name)
            for stub_name, source in (reexports or {}).items():
                if source == name:
                    stub = importlib.import_module(stub_name)
                    for attr, value in vars(modules[name]).items():
                        if not attr.startswith("_"):
                            setattr(stub, attr, value)
        return modules
    finally:
        sys.meta_path.remove(finder)
        for name in [name for name in sys.modules if name.split(".")[0] in ours]:
            del sys.modules[name]
        sys.modules.update(saved)


@functools.cache
def _areal() -> types.SimpleNamespace:
    modules = _partial_import(
        "areal",
        ("areal.utils.constants", "areal.api.cli_args", "areal.utils.data", "areal.utils.functional.functional",
         "areal.trainer.ppo.actor"),
        install="pip install --no-deps areal==1.0.4",
        reexports={"areal.utils.functional": "areal.utils.functional.functional"},
    )
    return types.SimpleNamespace(cli_args=modules["areal.api.cli_args"], data=modules["areal.utils.data"],
                                 functional=modules["areal.utils.functional.functional"],
                                 actor=modules["areal.trainer.ppo.actor"])


def areal() -> types.SimpleNamespace:
    """AReaL 1.0.4's ``cli_args`` (RejectionSamplingConfig, NormConfig), ``data`` (Normalization), ``functional``
    (ppo_actor_loss_fn) and ``actor`` (grpo_loss_fn, compute_prox_logp_approximations, _apply_m2po_masking)
    modules; skips the test when AReaL is not installed (fails under ``CI``)."""
    return _areal()


@functools.cache
def _skyrl() -> types.SimpleNamespace:
    utils = "skyrl.backends.skyrl_train.utils"
    modules = _partial_import(
        "skyrl",
        ("skyrl.train.config.config", f"{utils}.torch_utils", f"{utils}.off_policy_correction_utils",
         f"{utils}.ppo_utils"),
        install="pip install --no-deps --ignore-requires-python skyrl==0.4.0",
        reexports={"skyrl.train.config": "skyrl.train.config.config"},
    )
    return types.SimpleNamespace(config=modules["skyrl.train.config.config"],
                                 off_policy=modules[f"{utils}.off_policy_correction_utils"],
                                 ppo_utils=modules[f"{utils}.ppo_utils"])


def skyrl() -> types.SimpleNamespace:
    """SkyRL 0.4.0's ``config`` (AlgorithmConfig, OffPolicyCorrectionConfig), ``off_policy``
    (off_policy_correction_utils: compute_outlier_token_mask, compute_sequence_mask) and ``ppo_utils``
    (ppo_policy_loss, apply_loss_reduction_to_advantages_minibatch) modules; skips the test when SkyRL is not
    installed (fails under ``CI``). SkyRL asks for Python >= 3.12; these files run on 3.11 (the tests that call
    them are the proof), hence ``--ignore-requires-python``."""
    return _skyrl()
