"""docs/algorithms.md shows every preset's picture: docs/pictures/NAME.png exists for each registered preset
(regenerate: ``rlzoo plot --all --output-dir docs/pictures --dpi 72``), and no picture is left for a preset that is gone."""

from pathlib import Path

import rlzoo
from rlzoo.losses import algorithms_markdown

PICTURES = Path(__file__).resolve().parents[1] / "docs" / "pictures"
REGENERATE = "run `rlzoo plot --all --output-dir docs/pictures --dpi 72` (and `rlzoo explain --all --markdown > docs/algorithms.md`)"


def test_every_preset_has_its_picture():
    missing = [name for name in rlzoo.list_losses() if not (PICTURES / f"{name}.png").is_file()]
    assert not missing, f"presets without a picture in docs/pictures: {missing}; {REGENERATE}"
    for name in rlzoo.list_losses():
        assert (PICTURES / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_each_picture_shows_the_preset_as_it_is_now():
    """A picture stores the loss it draws (every option of every part, rlzoo.losses.pictures.PICTURE_LOSS_KEY):
    a preset whose defaults or parts changed since its picture was drawn fails here until it is redrawn."""
    from PIL import Image

    from rlzoo.losses.pictures import PICTURE_LOSS_KEY

    for name in rlzoo.list_losses():
        with Image.open(PICTURES / f"{name}.png") as image:
            drawn = image.text.get(PICTURE_LOSS_KEY)
        assert drawn == repr(rlzoo.get_loss(name)), f"docs/pictures/{name}.png shows {drawn}; {REGENERATE}"


def test_no_picture_without_a_preset():
    stale = sorted(p.name for p in PICTURES.glob("*.png") if p.stem not in rlzoo.list_losses())
    assert not stale, f"pictures of presets that are not registered: {stale}; delete them"


def test_algorithms_md_links_each_picture():
    text = algorithms_markdown()
    for name in rlzoo.list_losses():
        assert f"](pictures/{name}.png)" in text, name


def test_grpo_explained_shows_the_committed_runs(capsys):
    """docs/grpo-explained.md's tables are `python benchmarks/grpo_explained.py tables` of the committed results
    (benchmarks/results/grpo_explained), and every figure it shows exists."""
    import importlib.util
    import re

    root = PICTURES.parents[1]
    spec = importlib.util.spec_from_file_location("grpo_explained", root / "benchmarks" / "grpo_explained.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["tables"]) == 0
    doc = (root / "docs" / "grpo-explained.md").read_text()
    for table in capsys.readouterr().out.strip().split("\n\n"):
        assert table in doc, f"docs/grpo-explained.md lacks this table of the results (rerun `tables`):\n{table}"
    figures = re.findall(r"\]\(((?:pictures|grpo_explained)/[^)]+\.png)\)", doc)
    assert len(figures) >= 5
    for figure in figures:
        assert (root / "docs" / figure).is_file(), figure
