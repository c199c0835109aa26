"""The docs stay true: README code runs, docs/algorithms.md matches the registry, examples run."""

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from rlzoo.losses import algorithms_markdown

ROOT = Path(__file__).resolve().parents[1]


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.DOTALL)


@pytest.mark.parametrize("doc", ["README.md", "docs/composing.md", "docs/trainer.md", "docs/advantages.md",
                                 "docs/compat.md"])
def test_python_blocks_run(doc, tmp_path, monkeypatch):
    """Every ```python block of the document runs as written (blocks of one file share a namespace).

    A document that calls ``torch.compile`` runs in a child Python process: Dynamo cannot trace the
    test-time beartype checker that pytest's jaxtyping hook wraps around rlzoo (see tests/test_compile.py).
    """
    from rlzoo.losses import presets, surrogates

    monkeypatch.chdir(tmp_path)
    blocks = _python_blocks(ROOT / doc)
    assert blocks, f"{doc} has no python blocks"
    if any("torch.compile" in block for block in blocks):
        script = tmp_path / "doc_blocks.py"
        script.write_text("\n".join(blocks))
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=900, check=False)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        return
    namespace: dict = {"__name__": "__doc_example__"}
    with presets.scoped(), surrogates.scoped():
        for block in blocks:
            exec(compile(block, f"{doc} block", "exec"), namespace)  # noqa: S102


def test_algorithms_md_matches_the_registry():
    """docs/algorithms.md is `rlzoo explain --all --markdown`: regenerate it when a preset changes."""
    committed = (ROOT / "docs" / "algorithms.md").read_text()
    assert committed == algorithms_markdown(), (
        "docs/algorithms.md is stale: run `rlzoo explain --all --markdown > docs/algorithms.md`"
    )


def _github_slug(heading: str) -> str:
    """The anchor GitHub gives a markdown heading: lower case, punctuation but '-' and '_' dropped, spaces '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", sorted(p.name for p in (ROOT / "docs").glob("*.md")) + ["../README.md"])
def test_links_within_a_document_reach_a_heading(doc):
    """docs/algorithms.md's index linked #dr-grpo for the heading 'dr_grpo' (GitHub keeps the underscore)."""
    text = (ROOT / "docs" / doc).read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    anchors = {_github_slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}
    broken = sorted(set(re.findall(r"\]\(#([^)]+)\)", text)) - anchors)
    assert not broken, f"{doc}: links to no heading: {broken}"


def test_the_composing_table_names_every_registered_part():
    """docs/composing.md's table of slots had fallen behind the registries (no rejections slot, no geo_mask,
    outlier_token_veto, distillation, positive_nll, rollout_is)."""
    from rlzoo.losses.composition import SLOTS

    text = (ROOT / "docs" / "composing.md").read_text()
    missing = [f"{slot.field}: {name}" for slot in SLOTS for name in slot.base.registry.names()
               if f"`{name}`" not in text]
    assert not missing, f"docs/composing.md does not name: {missing}"


def test_every_preset_is_in_the_readme():
    import rlzoo

    readme = (ROOT / "README.md").read_text()
    missing = [name for name in rlzoo.list_losses() if f"`{name}`" not in readme]
    assert not missing, f"presets missing from the README table: {missing}"


def test_custom_loss_example_trains(tmp_path, monkeypatch):
    """examples/custom_loss.py composes, registers and trains a loss (tiny model, 2 steps)."""
    from rlzoo.losses import presets

    monkeypatch.setattr(sys, "argv", ["custom_loss.py"])
    with presets.scoped():
        module = runpy.run_path(str(ROOT / "examples" / "custom_loss.py"))
        history = module["main"](["--model", "tiny-random", "--max-steps", "2", "--output-dir", str(tmp_path / "run")])
    assert history[-1]["step"] == 2
    assert (tmp_path / "run" / "metrics.jsonl").is_file()


@pytest.mark.parametrize("script", ["own_dataset.py", "lora.py", "custom_loss_train.py"])
def test_issue_examples_train(script, tmp_path, monkeypatch):
    """examples/own_dataset.py, lora.py and custom_loss_train.py run top to bottom (tiny model, 2 steps)."""
    monkeypatch.setattr(sys, "argv", [script])
    module = runpy.run_path(str(ROOT / "examples" / script))
    history = module["main"](["--model", "tiny-random", "--max-steps", "2", "--max-completion-length", "6",
                              "--eval-size", "4", "--output-dir", str(tmp_path / "out")])
    assert history[-1]["step"] == 2


def test_what_overwrite_deletes_is_what_the_code_deletes():
    """docs/trainer.md listed five of the nine things --overwrite deletes (not completions/, tensorboard/, wandb/
    and trackers.json)."""
    from rlzoo.trainer.run_dir import RUN_FILES

    text = " ".join((ROOT / "docs" / "trainer.md").read_text().split())
    listed = re.search(r"`--overwrite` deletes that run's files: (.*?) \(and nothing else", text)
    assert listed, "docs/trainer.md: the sentence `--overwrite` deletes that run's files: ... (and nothing else"
    named = {name.rstrip("/") for name in re.findall(r"`([^`]+)`", listed.group(1))} - {"step-*"}  # (what of them)
    assert named == set(RUN_FILES)
