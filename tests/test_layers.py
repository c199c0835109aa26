"""DESIGN.md section 1: each layer of rlzoo imports only from itself and the layers listed above it, so a
loss never imports the trainer (the trainer wires losses and kernels, never the reverse); and no module imports
another package's private module (``rlzoo.losses._x`` from outside ``rlzoo.losses``)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "rlzoo"
LAYERS = [
    ("rlzoo.batch", "rlzoo.registry", "rlzoo._version"),
    ("rlzoo.losses",),
    ("rlzoo.algorithms",),
    ("rlzoo.advantages",),
    ("rlzoo.compat",),
    ("rlzoo.kernels",),
    ("rlzoo.integrations",),
    ("rlzoo.trainer",),
    ("rlzoo.cli", "rlzoo.__main__"),
]


def _layer(module: str) -> int:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    if module == "rlzoo":
        return -1  # the package facade
    raise AssertionError(f"{module} is in no layer of DESIGN.md section 1; add it to LAYERS")


def _rlzoo_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "rlzoo":
                found.update(f"rlzoo.{a.name}" for a in node.names)
            elif node.module.startswith("rlzoo."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("rlzoo."))
    return found


MODULES = sorted(p for p in ROOT.rglob("*.py") if p.name != "__init__.py" or p.parent != ROOT)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_imports_only_from_its_layer_or_above(path):
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    own = _layer(module)
    bad = sorted(m for m in _rlzoo_imports(path) if _layer(m) > own)
    assert not bad, f"{module} (layer {own}) imports from lower layers: {bad}"


def _private_part(module: str) -> str | None:
    """The package owning ``module``'s first private component (``rlzoo.kernels`` for ``rlzoo.kernels._tiles``)."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_"):
            return ".".join(parts[:i])
    return None


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_no_import_of_another_packages_private_module(path):
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    package = ".".join(parts[:-1])
    bad = sorted(m for m in _rlzoo_imports(path)
                 if (owner := _private_part(m)) is not None and not (package + ".").startswith(owner + "."))
    assert not bad, f"{package} imports private modules of other packages: {bad}"
