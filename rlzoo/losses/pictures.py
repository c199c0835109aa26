r"""Pictures of a loss: the per-token objective and its gradient as functions of the ratio ``r`` (``rlzoo plot``).

Nothing here re-derives a formula: every point is the loss itself, called on a one-token batch
(``B = T = 1``) whose log-prob is ``log(r * p_old)``, with autograd for the gradient. So a picture shows what the
code does, for any preset with any overrides and for any loss composed by hand.

Notation: ``J = -loss`` is the objective (maximised); ``g = dJ / d log pi`` its gradient with respect to the
token's log-prob (> 0 raises the token's probability, < 0 lowers it); ``r = pi / pi_old``;
``p_old = pi_old(token)``; ``A`` the advantage.

Conventions (each picture's subtitle lists those that apply):

* one token, ``T = 1``: a sequence-level ratio (GSPO, GMPO, VESPO's ``W``) equals the token ratio, and every
  aggregation reduces to the per-token loss (an aggregation that divides by ``max_completion_length`` gets
  ``max_completion_length = 1`` unless the loss has one);
* the log-probs a loss needs besides ``logprobs`` and ``old_logprobs`` (reference, sampler, ...) equal
  ``old_logprobs``: the reference is the old policy, so a KL penalty is 0 at ``r = 1``, and an IS correction
  weighs 1; entropies, when needed, are 1 nat; a reward, when needed (VAPO's positive-example NLL), is 1 for
  ``A > 0`` and 0 for ``A < 0``; the token is its own group (``group_index`` 0); a loss that reads policy
  versions (the log-linear proximal policy) trains version 1 on a token sampled by version 0 (one update behind:
  the proximal policy is the sampler's);
* batch-coupled parts (Clip-Cov, KL-Cov, the entropy quantile) see a batch of one token: Clip-Cov's
  covariance is 0 (nothing removed), KL-Cov's top-k is that token (always penalised);
* ``p_old`` (default 0.2) matters only to losses that read probabilities (DPPO's trust region) or whose value
  carries ``log pi`` times a detached weight (CISPO, VESPO, DPPO, GPG, DRO); ``r <= 1 / p_old``.

The objective drawn is what the update follows: ``J(1) + integral from 1 to r of g d(log r')`` (trapezoids of
``g / r`` over ``r`` on a linear plus geometric grid, with the breakpoints of ``g`` located by bisection and added on both sides). It
equals the loss's value ``-loss(r)`` wherever the value has no stop-gradient (PPO clip, SAPO, GMPO, KL
penalties, DRO, REINFORCE); where it does not (CISPO's and VESPO's detached weights, DPPO's mask), the value is
drawn too, dotted. With an active penalty (GRPO's KL), the curves without it are drawn thin, and the grey
"no gradient" bands are those of the policy term.

Example:
    >>> from rlzoo.losses.pictures import objective_curves
    >>> up, down = objective_curves("ppo", num=41).curves  # A = +1, A = -1
    >>> [round(b, 9) for b in up.breakpoints], [round(b, 9) for b in down.breakpoints]
    ([1.2], [0.8])
    >>> abs(float(down.gradient[-1]) + float(down.ratios[-1])) < 1e-12  # A < 0, r > 1 + eps: not clipped, g = r A
    True
"""


import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rlzoo.losses.curves import (  # the numbers: re-exported, so rlzoo.losses.pictures stays the one address
    RATIO_OPTIONS,
    ObjectiveCurve,
    ObjectivePicture,
    _OneToken,  # noqa: F401 - tests build one-token batches with it
    objective_curves,
)
from rlzoo.losses.policy_loss import PolicyLoss
from rlzoo.losses.presets import presets

__all__ = ["PICTURE_LOSS_KEY", "RATIO_OPTIONS", "ObjectiveCurve", "ObjectivePicture", "objective_curves", "plot_all",
           "plot_objective"]

PICTURE_LOSS_KEY = "rlzoo:loss"
"""The PNG text chunk holding :attr:`ObjectivePicture.drawn`, the loss a picture shows (``PIL.Image.open(path).text``)."""


_POS, _NEG, _REF, _VALUE, _BAND = "#1f6fb4", "#c0392b", "#9a9a9a", "#444444", "#ebebeb"
_FLAG_COLORS = ("#e67e22", "#8e44ad", "#16a085", "#b7950b", "#d35400", "#2e86c1")


def _spans(r: Any, on: Any) -> list[tuple[float, float]]:
    """The ``[r_start, r_end]`` runs where ``on`` (a bool array over ``r``) is True."""
    out, start = [], None
    for i, flag in enumerate([*on, False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            out.append((float(r[start]), float(r[i - 1])))
            start = None
    return out


def plot_objective(loss: PolicyLoss | str, output: str | os.PathLike[str] | None = None, *, dpi: int = 100,
                   **options: Any) -> Any:
    """Draw :func:`objective_curves` with matplotlib: for ``A > 0`` (left) and ``A < 0`` (right), the objective,
    its gradient with respect to ``log pi``, and which ratios the loss's 0/1 metrics count.

    Objective panels: ``J(1) + integral g d log r`` (solid); the loss's value where it differs (dotted: a
    stop-gradient); the unclipped importance-sampling objective through the same point at ``r = 1`` (grey
    dashed, gradient ``r A``). Gradient panels: ``g`` and ``r A``. With a penalty (KL): thin lines without it.
    Grey bands: no gradient from the policy term (a clip, a mask). Dotted verticals: ``r = 1`` (the first pass
    over a generation batch, where old == current) and the breakpoints of ``g``, labelled.

    Args:
        loss: a preset name or a :class:`PolicyLoss`.
        output: a file (``.png``, or any format matplotlib writes), written atomically; None: return the figure.
            A PNG is stored with a 64-colour palette (Pillow's median cut) and the loss drawn in its text chunk
            ``PICTURE_LOSS_KEY`` (:attr:`ObjectivePicture.drawn`: every option of every part).
        dpi: dots per inch of the file, >= 20 (default 100: 1050 x 740 pixels; docs/pictures uses 72).
        **options: :func:`objective_curves`'s keyword arguments and the preset's overrides.

    Returns:
        the output path, or the ``matplotlib.figure.Figure`` when ``output`` is None.

    Raises:
        ImportError: matplotlib is not installed (says what to install).
        ValueError: ``output`` is a directory, or its extension is no format matplotlib writes (names the ones it
            does).
        OSError: the file cannot be written. And the errors of :func:`objective_curves`.
    """
    try:
        import matplotlib

        if output is not None:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.legend_handler import HandlerTuple
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError as err:
        raise ImportError("rlzoo plot needs matplotlib: pip install matplotlib (it comes with rlzoo[train])") from err

    if not (isinstance(dpi, int) and dpi >= 20):
        raise ValueError(f"plot_objective: dpi must be an int >= 20, got {dpi!r}")
    if output is not None and (Path(output).is_dir() or str(output).endswith(("/", os.sep)) or not Path(output).name):
        raise ValueError(f"output {str(output)!r} is a directory; name a file (e.g. {Path(output) / 'loss.png'})")
    pic = objective_curves(loss, **options)
    style = {"font.size": 9.5, "axes.spines.top": False, "axes.spines.right": False, "axes.titlesize": 10,
             "axes.titleweight": "bold"}
    rows = max(len(curve.flags) for curve in pic.curves)  # 0/1 metric rows: the bottom panels grow past two
    extra = 0.45 * max(0, rows - 2)
    with plt.rc_context(style):
        fig, axes = plt.subplots(3, 2, figsize=(10.5, 7.4 + extra), sharex="col",
                                 gridspec_kw={"height_ratios": [1, 1, 0.36 + 0.2 * max(0, rows - 2)], "hspace": 0.32,
                                              "wspace": 0.16})
        legend: dict[str, Any] = {
            "the loss's curves (A > 0, A < 0)": (Line2D([], [], color=_POS, lw=2.2), Line2D([], [], color=_NEG, lw=2.2)),
            "unclipped IS: J(1) + A (r - 1), gradient r A": Line2D([], [], color=_REF, ls="--", lw=1.1),
        }
        for col, curve in enumerate(pic.curves):
            a, color = curve.advantage, _POS if curve.advantage > 0 else _NEG
            r = curve.ratios.numpy()
            top, mid, low = axes[:, col]
            for ax in (top, mid, low):
                for x0, x1 in _spans(r, curve.no_gradient.numpy()):
                    ax.axvspan(x0, x1, color=_BAND, zorder=0, lw=0)
                    legend.setdefault("no gradient from the policy term (clipped / masked)", Patch(color=_BAND))
                for b in curve.breakpoints:
                    ax.axvline(b, color="#b0b0b0", ls=":", lw=1, zorder=1)
                ax.axvline(1.0, color="#333333", ls=":", lw=1, zorder=1)
            for ax in (top, mid):
                ax.axhline(0.0, color="#cfcfcf", lw=0.8, zorder=1)
            one = int(torch.argmin((curve.ratios - 1).abs()))
            top.plot(r, (float(curve.value[one]) + a * (curve.ratios - 1)).numpy(), "--", color=_REF, lw=1.1, zorder=2)
            mid.plot(r, (a * curve.ratios).numpy(), "--", color=_REF, lw=1.1, zorder=2)
            top.plot(r, curve.objective.numpy(), color=color, lw=2.2, zorder=4)
            mid.plot(r, curve.gradient.numpy(), color=color, lw=2.2, zorder=4)
            if curve.policy_gradient is not None and curve.policy_objective is not None:
                top.plot(r, curve.policy_objective.numpy(), color=color, lw=0.9, alpha=0.8, zorder=3)
                mid.plot(r, curve.policy_gradient.numpy(), color=color, lw=0.9, alpha=0.8, zorder=3)
                legend.setdefault("thin: without the penalty (the policy term alone)",
                                  Line2D([], [], color="#777777", lw=0.9))
            if not curve.value_is_objective:
                top.plot(r, curve.value.numpy(), ls=(0, (1, 1.5)), color=_VALUE, lw=1.5, zorder=3)
                legend.setdefault("dotted: the loss's value (a stop-gradient: not what the update follows)",
                                  Line2D([], [], color=_VALUE, ls=(0, (1, 1.5)), lw=1.5))
            sign = f"A = {a:+g}"
            top.set_title(f"{sign}:  objective  J = -loss")
            mid.set_title(f"{sign}:  gradient  dJ / d log \u03c0  (> 0 raises \u03c0)")
            for b in curve.breakpoints:
                top.annotate(f"r = {b:.5g}", (b, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -1),
                             textcoords="offset points", ha="left", va="top", fontsize=8, color="#555555", zorder=5,
                             bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})
            flags = list(curve.flags.items())
            for k, (name, flag) in enumerate(flags):
                c = _FLAG_COLORS[k % len(_FLAG_COLORS)]
                spans = _spans(r, flag.numpy())
                for x0, x1 in spans:
                    low.plot([x0, x1], [-k, -k], color=c, lw=6, solid_capstyle="butt", zorder=3)
                x0, x1 = max(spans, key=lambda s: s[1] - s[0])
                # from the bar's end toward the middle of the axis, so that a long name stays inside the panel
                inward_left = x0 - r[0] <= r[-1] - x1
                low.annotate(name, (x0 if inward_left else x1, -k), xytext=(0, 4.5), textcoords="offset points",
                             ha="left" if inward_left else "right", va="bottom", fontsize=8, color=c, zorder=4)
            low.set_yticks([])
            low.set_ylim(-max(1, len(flags)) + 0.45, 0.75)
            low.spines["left"].set_visible(False)
            low.set_title("0/1 metrics: which ratios they count" if flags else "no 0/1 metric changes with r",
                          fontsize=8.5, fontweight="normal", loc="left", color="#555555")
            low.set_xlabel("ratio  r = \u03c0 / \u03c0_old")
            mid.tick_params(labelbottom=False)
        legend["r = 1: the first pass over a generation batch (old = current)"] = Line2D([], [], color="#333333",
                                                                                          ls=":", lw=1)
        fig.legend(list(legend.values()), list(legend), loc="lower center", ncols=2, frameon=False, fontsize=8.5,
                   handler_map={tuple: HandlerTuple(ndivide=None)})
        title = f"{pic.label}: {pic.title}"
        fig.suptitle(title, fontsize=min(12.5, 12.5 * 88 / len(title)), fontweight="bold", y=0.99)  # fits the width
        conventions = [f"one token (T = 1), |A| = {abs(pic.curves[0].advantage):g}, p_old = {pic.old_prob:.3g}",
                       *pic.notes]
        fig.text(0.5, 0.948, "computed by calling the loss with autograd on one-token batches; " + "; ".join(conventions),
                 ha="center", fontsize=8.5, color="#555555")
        fig.subplots_adjust(left=0.07, right=0.985, top=0.9, bottom=0.085 + 0.022 * ((len(legend) + 1) // 2))
    if output is None:
        return fig
    path = Path(output)
    buffer = io.BytesIO()
    fmt = path.suffix.lstrip(".").lower() or "png"
    formats = set(fig.canvas.get_supported_filetypes()) - {"pgf"}  # pgf: LaTeX source that needs xelatex to draw
    if fmt not in formats:
        plt.close(fig)
        raise ValueError(f"output {str(path)!r}: matplotlib writes no {fmt!r} pictures; give a file ending in one of "
                         f"{', '.join('.' + f for f in sorted(formats))}")
    # no version nor date in png, pdf and svg files (the same picture, the same bytes); only these writers take it
    metadata = {"png": {"Software": None}, "pdf": {"Creator": None, "Producer": None, "CreationDate": None},
                "svg": {"Creator": None, "Date": None}}.get(fmt)
    with plt.rc_context({"svg.hashsalt": "rlzoo"}):  # an SVG's element ids: not random
        fig.savefig(buffer, format=fmt, dpi=dpi, **({"metadata": metadata} if metadata else {}))
    plt.close(fig)
    if fmt == "png":  # a 64-colour palette (Pillow, which matplotlib needs): about 3x smaller, no visible change
        from PIL import Image
        from PIL.PngImagePlugin import PngInfo

        image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB").quantize(64, Image.Quantize.MEDIANCUT)
        info = PngInfo()
        info.add_text(PICTURE_LOSS_KEY, pic.drawn)
        buffer = io.BytesIO()
        image.save(buffer, format="png", optimize=True, pnginfo=info)
    # /dev/null, /dev/stdout (a link to what a shell redirects to), a FIFO: written in place (a rename onto it would
    # replace the device or the link itself, as root)
    if (path.exists() and not path.is_file()) or (os.path.lexists(path) and os.path.abspath(path).startswith(("/dev/",
                                                                                                             "/proc/"))):
        path.write_bytes(buffer.getvalue())
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, path)
    return path


def plot_all(output_dir: str | os.PathLike[str], names: Sequence[str] | None = None, **options: Any) -> list[Path]:
    """``plot_objective(name, output_dir / f"{name}.png", **options)`` for every registered preset (or ``names``)
    with its defaults: the pictures of docs/algorithms.md (``rlzoo plot --all --output-dir docs/pictures``).

    Args:
        output_dir: the directory (created if missing).
        names: preset names (default: every registered preset).
        **options: :func:`plot_objective`'s ``dpi`` and :func:`objective_curves`'s keyword arguments
            (``old_prob``, ``r_max``, ...), not loss options.

    Raises:
        UnknownNameError: an unknown name in ``names``.
        OSError: the directory cannot be created or a file written.
    """
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    return [plot_objective(name, directory / f"{name}.png", **options) for name in (names or presets.names())]
