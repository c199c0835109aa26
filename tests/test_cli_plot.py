"""``rlzoo plot``: a preset's picture with loss overrides, every preset's, and bad input as one-line errors."""

import sys

import pytest

import rlzoo
from rlzoo.cli import console_main, main

PNG = b"\x89PNG\r\n\x1a\n"


def test_plot_a_preset_with_loss_overrides(tmp_path, capsys, monkeypatch):
    """--loss.NAME VALUE reaches get_loss (as rlzoo train takes it); the default file is NAME.png."""
    from rlzoo.losses import pictures

    seen = {}
    original = pictures.objective_curves

    def spy(loss, **options):
        seen.update(options)
        return original(loss, **{**options, "num": 11})

    monkeypatch.setattr(pictures, "objective_curves", spy)
    out = tmp_path / "dapo.png"
    assert main(["plot", "dapo", "--output", str(out), "--loss.epsilon_high", "0.3", "--loss.dual_clip=3",
                 "--old-prob", "0.25"]) == 0
    assert out.read_bytes()[:8] == PNG
    assert seen["epsilon_high"] == 0.3 and seen["dual_clip"] == 3 and seen["old_prob"] == 0.25
    assert "wrote" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    assert main(["plot", "gpg"]) == 0
    assert (tmp_path / "gpg.png").read_bytes()[:8] == PNG


def test_plot_names_the_default_file_by_the_registered_spelling(tmp_path, monkeypatch, capsys):
    """`rlzoo plot DAPO` wrote DAPO.png: the default file is the preset's registered name (dapo.png, as
    docs/pictures names them)."""
    from rlzoo.losses import pictures

    monkeypatch.setattr(pictures, "plot_objective", lambda name, path, **kw: path.write_bytes(PNG) and path)
    monkeypatch.chdir(tmp_path)
    assert main(["plot", "DAPO"]) == 0 and main(["plot", "Dr-GRPO"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dapo.png", "dr_grpo.png"]


def test_plot_of_one_preset_honours_output_dir(tmp_path, monkeypatch):
    """User trial: `rlzoo plot dapo --output-dir xx` wrote ./dapo.png, ignoring the flag silently."""
    from rlzoo.losses import pictures

    monkeypatch.setattr(pictures, "plot_objective", lambda name, path, **kw: path.write_bytes(PNG) and path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "xx").mkdir()
    assert main(["plot", "dapo", "--output-dir", "xx"]) == 0
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == [] and (tmp_path / "xx" / "dapo.png").is_file()
    with pytest.raises(ValueError, match="give --output FILE or --output-dir DIR, not both"):
        main(["plot", "dapo", "--output-dir", "xx", "--output", "a.png"])


def test_plot_all_writes_one_picture_per_preset(tmp_path, monkeypatch):
    """--all draws every registered preset into --output-dir, named after it (what docs/pictures holds)."""
    from rlzoo.losses import pictures

    drawn = []
    monkeypatch.setattr(pictures, "plot_objective", lambda name, path, **kw: drawn.append(name) or path)
    assert main(["plot", "--all", "--output-dir", str(tmp_path / "pics")]) == 0
    assert drawn == rlzoo.list_losses()


@pytest.mark.parametrize(("argv", "message"), [
    (["plot", "not-a-loss"], "dapo"),
    (["plot", "dapo", "--loss.not_an_option", "1"], "not_an_option"),
    (["plot", "dapo", "--task.max_terms", "3"], "loss options only"),
    (["plot", "--all", "dapo"], "defaults"),
    # the flags named, not the plotting functions' parameters (old_prob, advantage, r_max, dpi)
    (["plot", "ppo", "--old-prob", "2"], "rlzoo: error: --old-prob must be in (0, 1), got 2.0"),
    (["plot", "ppo", "--advantage-magnitude", "0"], "rlzoo: error: --advantage-magnitude must be > 0, got 0.0"),
    (["plot", "ppo", "--r-max", "-1"], "rlzoo: error: --r-max must be finite and > 1, got -1.0"),
    (["plot", "--all", "--dpi", "3"], "rlzoo: error: --dpi must be an int >= 20, got 3"),
    (["plot", "dapo", "--output", "dapo.txt"], "matplotlib writes no 'txt' pictures; give a file ending in one of "),
    (["plot", "dapo", "--output", "dapo.pgf"], "matplotlib writes no 'pgf' pictures"),  # LaTeX: a traceback
])
def test_plot_bad_input_is_one_line(argv, message, capsys, monkeypatch):
    """Unknown names and options, dotted options of another kind, --all with a name, bad ranges: exit 2 and one
    line naming the problem (console_main's user-error contract)."""
    monkeypatch.setattr(sys, "argv", ["rlzoo", *argv])
    assert console_main() == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_plot_writes_the_formats_matplotlib_writes(tmp_path):
    """--output x.jpg / .webp / .svg failed inside matplotlib ("metadata not supported for format 'jpeg'"): the
    date- and version-free metadata is given only to the writers that take it, and a picture drawn twice is the
    same file."""
    from rlzoo.losses.pictures import plot_objective

    for name in ("a.jpg", "a.webp", "a.tif", "a.svg", "a.pdf", "a.eps", "b.svg", "b.pdf", "b.eps"):
        plot_objective("dapo", tmp_path / name, dpi=20)
    assert all((tmp_path / n).stat().st_size > 1000 for n in ("a.jpg", "a.webp", "a.tif", "a.eps"))
    for fmt in ("svg", "pdf"):  # (PostScript records its creation date)
        assert (tmp_path / f"a.{fmt}").read_bytes() == (tmp_path / f"b.{fmt}").read_bytes()


def test_plot_of_a_run_directory_points_to_its_plot(tmp_path, capsys, monkeypatch):
    """`rlzoo plot RUN` said "unknown loss preset 'runs/x'": it names the run's own plot now; a preset's name wins
    over a run directory of that name."""
    for run in ("run", "dapo"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert main(["plot", "dapo", "--output", "d.png"]) == 0
    monkeypatch.setattr(sys, "argv", ["rlzoo", "plot", "run"])
    assert console_main() == 2
    err = capsys.readouterr().err
    assert err == "rlzoo: error: rlzoo plot draws a loss preset's objective; run is a run, whose plot is run/reward.png " \
                  "(written at each checkpoint) (RLZOO_DEBUG=1 shows the traceback)\n"


def test_plot_output_that_is_a_directory_is_refused_before_drawing(tmp_path, capsys, monkeypatch):
    """--output DIR left '.DIR.tmp' behind with "[Errno 21] Is a directory"; --output . "has an empty name"; a
    trailing slash wrote a file named like the directory."""
    (tmp_path / "outd").mkdir()
    monkeypatch.chdir(tmp_path)
    for output in ("outd", ".", "newd/"):
        monkeypatch.setattr(sys, "argv", ["rlzoo", "plot", "dapo", "--output", output])
        assert console_main() == 2
        assert f"rlzoo: error: output {output!r} is a directory; name a file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outd"]
