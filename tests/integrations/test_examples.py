"""The integration recipes of docs/integrations.md run: the TRL script trains, the verl module registers, and
the doc quotes the committed benchmark."""

import json
import runpy
from pathlib import Path

import pytest
import torch
from oracles import verl_core_algos

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "integrations.md"


def test_trl_example_trains(tmp_path, monkeypatch):
    """examples/trl_integration.py: TRL's GRPOTrainer with rlzoo's gmpo, 2 steps on the tiny model, and grpo (a KL
    term) 1 step; the tiny model's directory is removed after (it left a /tmp/tiny-random-* per run)."""
    import tempfile

    pytest.importorskip("trl", reason="TRL is not installed: pip install trl==1.16.0")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model's ops are too small to share between threads
    try:
        module = runpy.run_path(str(ROOT / "examples" / "trl_integration.py"))
        history = module["main"](["--model", "tiny-random", "--max-steps", "2", "--output-dir", str(tmp_path)])
        # a preset with a KL term: the example gives GRPOConfig its beta (it stopped at construction: beta=0)
        assert len(module["main"](["--model", "tiny-random", "--max-steps", "1", "--loss", "grpo",
                                   "--output-dir", str(tmp_path)])) == 1
    finally:
        torch.set_num_threads(threads)
    assert len(history) == 2
    assert all("clip_ratio/region_mean" in row and "reward" in row for row in history)
    assert not any(path.name.startswith(("tiny-random", "trl-integration")) for path in scratch.iterdir())


def test_verl_example_module_registers_what_the_doc_selects():
    """examples/verl_losses.py registers the loss_mode names the doc's verl config uses."""
    core_algos = verl_core_algos()
    saved = dict(core_algos.POLICY_LOSS_REGISTRY)
    try:
        runpy.run_path(str(ROOT / "examples" / "verl_losses.py"))
        registered = set(core_algos.POLICY_LOSS_REGISTRY) - set(saved)
        assert {"rlzoo_gmpo", "rlzoo_gspo", "rlzoo_two_sided", "rlzoo_sapo"} <= registered
        runpy.run_path(str(ROOT / "examples" / "verl_losses.py"))  # importing twice is harmless
    finally:
        core_algos.POLICY_LOSS_REGISTRY.clear()
        core_algos.POLICY_LOSS_REGISTRY.update(saved)
    doc = DOC.read_text()
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=rlzoo_gmpo" in doc
    assert "actor_rollout_ref.model.external_lib=verl_losses" in doc


def test_doc_quotes_the_committed_benchmark():
    """docs/integrations.md quotes benchmarks/results/trl_integration_cpu.json (regenerate both together)."""
    result = json.loads((ROOT / "benchmarks" / "results" / "trl_integration_cpu.json").read_text())
    doc = DOC.read_text()
    assert result["meets_target"]
    for name, row in result["loss_types"].items():
        assert f"{100 * row['added_share_of_trl_step']:+.1f} %" in doc, name
