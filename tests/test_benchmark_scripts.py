"""The benchmark scripts stay runnable: each one imports against today's rlzoo, every rlzoo name it imports (also
inside functions) exists, and it parses ``--help`` (their full runs take minutes to an hour and are run by hand;
their results are committed under benchmarks/results). Two of them once imported helpers a refactor had moved, and
nothing noticed."""

import ast
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith(("test_", "conftest")))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_benchmark_script_imports_and_parses_its_arguments(script, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(script.parent))
    spec = importlib.util.spec_from_file_location(f"benchmark_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "main"):  # a library of cases for the pytest-benchmark suite
        return
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as stop:
        module.main()
    assert stop.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_rlzoo_name_a_benchmark_script_imports_exists(script):
    missing = []
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "rlzoo":
            module = importlib.import_module(node.module)
            missing += [f"{node.module}.{a.name}" for a in node.names if not hasattr(module, a.name) and not (
                hasattr(module, "__path__") and importlib.util.find_spec(f"{node.module}.{a.name}"))]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "rlzoo" and importlib.util.find_spec(alias.name) is None:
                    missing.append(alias.name)
    assert not missing, f"{script.name} imports names rlzoo no longer has: {missing}"
