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
  ``A > 0`` and 0 for ``A < 0``; the token is its own group (``group_index`` 0);
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

import dataclasses
import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.batch import PolicyBatch
from rlzoo.losses.policy_loss import PolicyLoss
from rlzoo.losses.presets import get_loss, presets

__all__ = ["ObjectiveCurve", "ObjectivePicture", "objective_curves", "plot_all", "plot_objective"]

RATIO_OPTIONS = ("dual_clip", "delta", "clip_ratio_c")
"""Options whose value is a ratio threshold: the default ``r`` range reaches 1.2 x the largest one of an active
part (and 1.2 x ``1 + epsilon_high``, CISPO's cap of 5), so that it shows."""

_DEFAULT_R_MAX = 3.0
_BISECTIONS = 48
_CONSISTENT = 1e-3  # value == integral of the gradient, relative to the curves' spread


@dataclasses.dataclass(frozen=True)
class ObjectiveCurve:
    """One loss at one advantage, on a grid of ratios (float64, ascending).

    Attributes:
        advantage: the token's advantage ``A``.
        ratios: ``Float[N]``, the grid of ``r``: ``1``, and both sides of each breakpoint.
        value: ``Float[N]``, the loss's value ``-loss(r)``.
        gradient: ``Float[N]``, ``g = -d loss / d logprobs``.
        objective: ``Float[N]``, ``J(1) + integral_1^r g d log r'`` (what the update follows).
        policy_gradient, policy_objective: ``Float[N]``, the same without the loss's active penalties (KL,
            entropy); None when it has none.
        flags: the metrics that are 0/1 on the one-token batch and not constant over the grid (which ratios a
            metric such as ``clip_ratio/region_mean`` counts), name -> ``Bool[N]``; identical flags are kept
            once, under the first name (``region`` names first, then alphabetical).
        breakpoints: where the policy gradient jumps or becomes 0, located by bisection (to ~1e-12 relative; a
            continuous kink of ``g`` itself is not one).
        value_is_objective: the value equals the integral of the gradient to 1e-3 of the curves' spread (no
            stop-gradient in the value).
    """

    advantage: float
    ratios: Float[Tensor, " N"]
    value: Float[Tensor, " N"]
    gradient: Float[Tensor, " N"]
    objective: Float[Tensor, " N"]
    policy_gradient: Float[Tensor, " N"] | None
    policy_objective: Float[Tensor, " N"] | None
    flags: Mapping[str, Bool[Tensor, " N"]]
    breakpoints: tuple[float, ...]
    value_is_objective: bool

    @property
    def no_gradient(self) -> Bool[Tensor, " N"]:
        """Where the policy term gives no gradient (a clip, a mask): ``g == 0`` exactly."""
        return (self.gradient if self.policy_gradient is None else self.policy_gradient) == 0


@dataclasses.dataclass(frozen=True)
class ObjectivePicture:
    """What :func:`plot_objective` draws: a loss's curves for ``A = +|A|`` and ``A = -|A|``.

    Attributes:
        label: the preset name and its overrides (``dapo (epsilon_high=0.3)``), or ``custom loss``.
        title: the preset's title, or the loss's surrogate.
        loss: the loss as called (after the ``max_completion_length`` convention).
        old_prob: the ``p_old`` used.
        curves: ``(A > 0, A < 0)``.
        notes: the conventions that apply to this loss, one short phrase each.
    """

    label: str
    title: str
    loss: PolicyLoss
    old_prob: float
    curves: tuple[ObjectiveCurve, ObjectiveCurve]
    notes: tuple[str, ...]


class _OneToken:
    """Calls a loss on a one-token batch at ratio ``r``: ``(-loss, -d loss / d logprobs, metrics)``, float64."""

    def __init__(self, loss: PolicyLoss, advantage: float, old_prob: float, fields: Mapping[str, Tensor]) -> None:
        self.loss = loss
        self.log_old = math.log(old_prob)
        self.old = torch.tensor([[self.log_old]], dtype=torch.float64)
        self.advantages = torch.tensor([advantage], dtype=torch.float64)
        self.mask = torch.ones(1, 1, dtype=torch.bool)
        known = {f.name for f in dataclasses.fields(PolicyBatch)}
        self.fields: dict[str, Tensor] = {}
        for name in sorted(loss.required_fields()):
            if name in fields:
                self.fields[name] = fields[name]
            elif name.endswith("logprobs"):
                self.fields[name] = self.old
            elif name == "entropies":
                self.fields[name] = torch.ones(1, 1, dtype=torch.float64)
            elif name == "rewards":  # a correct answer exactly when the advantage is positive
                self.fields[name] = torch.tensor([1.0 if advantage > 0 else 0.0], dtype=torch.float64)
            elif name == "group_index":  # the one sequence is its own group
                self.fields[name] = torch.zeros(1, dtype=torch.long)
            else:
                raise ValueError(f"rlzoo plot: the loss needs PolicyBatch.{name}, which has no picture convention; "
                                 f"pass fields={{{name!r}: a [1, 1] tensor}} (PolicyBatch fields: "
                                 f"{', '.join(sorted(known))})")

    def __call__(self, r: float) -> tuple[float, float, dict[str, float]]:
        logprob = min(0.0, math.log(r) + self.log_old)  # r * p_old <= 1: only rounding is clamped
        lp = torch.tensor([[logprob]], dtype=torch.float64, requires_grad=True)
        if self.loss.bypass_mode:  # the sampler's log-probs are the old ones (verl's bypass_mode)
            fields = {**self.fields, "rollout_logprobs": self.old}
            batch = PolicyBatch(logprobs=lp, advantages=self.advantages, completion_mask=self.mask, **fields)
        else:
            batch = PolicyBatch(logprobs=lp, old_logprobs=self.old, advantages=self.advantages,
                                completion_mask=self.mask, **self.fields)
        with torch.random.fork_rng(devices=[]):  # a part that draws random numbers (Clip-Cov) leaves no trace
            out = self.loss(batch)
        (grad,) = torch.autograd.grad(out.loss, lp, allow_unused=True)
        return -float(out.loss.detach()), 0.0 if grad is None else -float(grad), {
            k: float(v) for k, v in out.metrics.items()}


def _ratio_range(loss: PolicyLoss) -> float:
    """The default largest ``r``: 3, or 1.2 x the largest ratio threshold of an active part (:data:`RATIO_OPTIONS`)."""
    marks = [float(v) for part in loss.parts() for k in RATIO_OPTIONS if k in part.option_names()
             and isinstance(v := getattr(part, k), (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    marks += [1.0 + float(part.epsilon_high) for part in loss.parts() if "epsilon_high" in part.option_names()
              and math.isfinite(float(part.epsilon_high))]  # inf: that side is not clipped (M2PO)
    return max([_DEFAULT_R_MAX, *(1.2 * m for m in marks)])


def _bisect(call: _OneToken, a: float, b: float, ga: float, gb: float) -> float:
    """The point of ``[a, b]`` where ``g`` switches from 0 to non-zero (or back), or from near ``ga`` to near
    ``gb``."""
    flip = (ga == 0.0) != (gb == 0.0)
    for _ in range(_BISECTIONS):
        m = 0.5 * (a + b)
        if m in (a, b):
            break
        gm = call(m)[1]
        left = (gm == 0.0) == (ga == 0.0) if flip else abs(gm - ga) <= abs(gm - gb)
        a, b = (m, b) if left else (a, m)
    return 0.5 * (a + b)


def _breakpoints(call: _OneToken, grid: Sequence[float], g: Sequence[float]) -> list[float]:
    """Where ``g`` (on ``grid``) becomes 0 or stops being 0, or jumps, located by bisection.

    A jump candidate is a grid step larger than 2 % of ``max |g|`` and 4 x both neighbouring steps; it is kept
    when, after bisection, ``g`` still differs across ``[b (1 - 1e-9), b (1 + 1e-9)]`` by half the step (a
    steep but continuous stretch does not)."""
    scale = max(1e-12, max(abs(x) for x in g))
    steps = [abs(g[i + 1] - g[i]) for i in range(len(g) - 1)]
    found = []
    for i, step in enumerate(steps):
        if (g[i] == 0.0) != (g[i + 1] == 0.0):
            found.append(_bisect(call, grid[i], grid[i + 1], g[i], g[i + 1]))
            continue
        neighbours = max(steps[i - 1] if i > 0 else 0.0, steps[i + 1] if i + 1 < len(steps) else 0.0)
        if step > 0.02 * scale and step > 4.0 * neighbours:
            b = _bisect(call, grid[i], grid[i + 1], g[i], g[i + 1])
            if abs(call(b * (1 + 1e-9))[1] - call(b * (1 - 1e-9))[1]) > 0.5 * step:
                found.append(b)
    return found


def _integral(ratios: Float[Tensor, " N"], value: Float[Tensor, " N"], gradient: Float[Tensor, " N"]) -> Float[Tensor, " N"]:
    """``value(1) + integral_1^r gradient d(log r')``, as ``integral (gradient / r') dr'`` by trapezoids: exact
    where ``gradient / r`` is piecewise constant (``r A`` and its clipped forms: PPO, CISPO below its cap),
    second-order elsewhere."""
    per_r = gradient / ratios
    pieces = 0.5 * (per_r[1:] + per_r[:-1]) * (ratios[1:] - ratios[:-1])
    cumulative = torch.cat([torch.zeros(1, dtype=ratios.dtype), torch.cumsum(pieces, 0)])
    one = int(torch.argmin((ratios - 1.0).abs()))
    return value[one] + cumulative - cumulative[one]


def _flags(metrics: Sequence[Mapping[str, float]]) -> dict[str, Bool[Tensor, " N"]]:
    """The metrics that are 0/1 on the one-token batch and change over the grid, duplicates dropped."""
    out: dict[str, Bool[Tensor, " N"]] = {}
    for name in sorted(metrics[0], key=lambda k: ("region" not in k, k)):
        values = torch.tensor([m[name] for m in metrics], dtype=torch.float64)
        if not bool(((values == 0) | (values == 1)).all()) or bool((values == values[0]).all()):
            continue
        flag = values == 1
        if not any(torch.equal(flag, f) for f in out.values()):
            out[name] = flag
    return out


def _curve(full: _OneToken, policy: _OneToken | None, advantage: float, grid: list[float]) -> ObjectiveCurve:
    """Evaluate the loss (and its policy term) on ``grid`` plus both sides of each breakpoint."""
    shape = policy or full
    shape_g = [shape(r)[1] for r in grid]
    points = set(grid)
    breakpoints = _breakpoints(shape, grid, shape_g)
    for b in breakpoints:  # both sides of a jump: drawn and integrated sharply
        points.update(side for side in (b * (1 - 1e-9), b * (1 + 1e-9)) if grid[0] <= side <= grid[-1])
    ratios = torch.tensor(sorted(points), dtype=torch.float64)
    rows = [full(float(r)) for r in ratios]
    value = torch.tensor([v for v, _, _ in rows], dtype=torch.float64)
    gradient = torch.tensor([d for _, d, _ in rows], dtype=torch.float64)
    objective = _integral(ratios, value, gradient)
    spread = float(value.max() - value.min()) + float(objective.max() - objective.min())
    consistent = float((value - objective).abs().max()) <= _CONSISTENT * max(1.0, spread)
    policy_gradient = policy_objective = None
    if policy is not None:
        policy_rows = [policy(float(r)) for r in ratios]
        policy_gradient = torch.tensor([d for _, d, _ in policy_rows], dtype=torch.float64)
        policy_value = torch.tensor([v for v, _, _ in policy_rows], dtype=torch.float64)
        policy_objective = _integral(ratios, policy_value, policy_gradient)
    return ObjectiveCurve(advantage=advantage, ratios=ratios, value=value, gradient=gradient, objective=objective,
                          policy_gradient=policy_gradient, policy_objective=policy_objective,
                          flags=_flags([m for _, _, m in rows]), breakpoints=tuple(sorted(breakpoints)),
                          value_is_objective=consistent)


def objective_curves(
    loss: PolicyLoss | str,
    *,
    advantage: float = 1.0,
    old_prob: float = 0.2,
    r_min: float = 0.05,
    r_max: float | None = None,
    num: int = 151,
    fields: Mapping[str, Tensor] | None = None,
    **overrides: Any,
) -> ObjectivePicture:
    """The per-token objective ``J = -loss`` and its gradient ``dJ / d log pi`` as functions of ``r``, for
    ``A = +advantage`` and ``A = -advantage``, computed by calling the loss on one-token batches (float64).

    Args:
        loss: a preset name (``rlzoo.get_loss(loss, **overrides)``) or a :class:`PolicyLoss`.
        advantage: ``|A|``, finite and > 0 (default 1).
        old_prob: ``p_old`` in (0, 1) (default 0.2); lowered to ``1 / r_max`` when ``r_max`` needs it.
        r_min: smallest ratio, > 0 (default 0.05).
        r_max: largest ratio, finite and > max(1, r_min) (default 3, or 1.2 x the loss's largest active
            ``dual_clip``, ``delta``, ``clip_ratio_c`` or ``1 + epsilon_high``).
        num: points of each of a linear and a geometric grid over ``[r_min, r_max]``, an int >= 11 (default
            151): about ``4 num`` loss calls per sign, plus 48 per breakpoint, twice that with a penalty.
        fields: ``[1, 1]`` tensors for PolicyBatch fields without a convention (see the module docstring).
        **overrides: the preset's keyword options (only with a preset name).

    Returns:
        :class:`ObjectivePicture`.

    Raises:
        UnknownNameError: an unknown preset or option (lists the valid ones).
        ValueError: an argument outside its range above (named), overrides given with a loss object, or a
            needed PolicyBatch field without a convention.
        TypeError: ``loss`` is neither a name nor a :class:`PolicyLoss`.
    """
    if isinstance(loss, str):
        built, title, label = get_loss(loss, **overrides), presets.get(loss).title, presets.get(loss).name
    elif isinstance(loss, PolicyLoss):
        if overrides:
            raise ValueError("objective_curves: pass overrides with a preset name, or call loss.with_options(...)")
        built, title, label = loss, loss.surrogate.describe(), loss.name or "custom loss"
    else:
        raise TypeError(f"objective_curves: loss must be a preset name or a PolicyLoss, got {type(loss).__name__}")
    if overrides:
        label += f" ({', '.join(f'{k}={v}' for k, v in overrides.items())})"
    for name, value, ok, want in (("advantage", advantage, advantage > 0 and math.isfinite(advantage), "> 0"),
                                  ("old_prob", old_prob, 0 < old_prob < 1, "in (0, 1)"),
                                  ("r_min", r_min, r_min > 0 and math.isfinite(r_min), "> 0"),
                                  ("num", num, isinstance(num, int) and num >= 11, "an int >= 11")):
        if not ok:
            raise ValueError(f"objective_curves: {name} must be {want}, got {value!r}")
    notes = []
    if built.aggregation.needs_max_completion_length and built.max_completion_length is None:
        built = built.with_options(max_completion_length=1)
        notes.append("max_completion_length = 1")
    r_max = _ratio_range(built) if r_max is None else float(r_max)
    if not (math.isfinite(r_max) and r_max > max(1.0, r_min)):
        raise ValueError(f"objective_curves: r_max must be finite and > max(1, r_min), got {r_max!r}")
    old_prob = min(old_prob, 1.0 / r_max)
    grid = sorted({*torch.linspace(r_min, r_max, num, dtype=torch.float64).tolist(),
                   *torch.logspace(math.log10(r_min), math.log10(r_max), num, dtype=torch.float64).tolist(), 1.0})
    penalised = any(p.active for p in built.penalties)
    policy = dataclasses.replace(built, penalties=()) if penalised else None
    curves = tuple(_curve(_OneToken(built, a, old_prob, fields or {}),
                          None if policy is None else _OneToken(policy, a, old_prob, fields or {}), a, grid)
                   for a in (advantage, -advantage))
    if type(built.ratio).mixes_tokens or type(built.surrogate).mixes_tokens:
        notes.append("sequence ratio = token ratio")
    needs = sorted(f for f in built.required_fields() if f.endswith("logprobs") and f not in (fields or {}))
    if needs:
        notes.append(" = ".join([*needs, "old_logprobs"]))
    if "entropies" in built.required_fields():
        notes.append("entropy = 1 nat")
    if built.batch_coupled:
        notes.append("batch-coupled part: a batch of this one token")
    return ObjectivePicture(label=label, title=title, loss=built, old_prob=old_prob,
                            curves=curves, notes=tuple(notes))  # type: ignore[arg-type]


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
            A PNG is stored with a 64-colour palette (Pillow's median cut).
        dpi: dots per inch of the file, >= 20 (default 100: 1050 x 740 pixels; docs/pictures uses 72).
        **options: :func:`objective_curves`'s keyword arguments and the preset's overrides.

    Returns:
        the output path, or the ``matplotlib.figure.Figure`` when ``output`` is None.

    Raises:
        ImportError: matplotlib is not installed (says what to install).
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
    pic = objective_curves(loss, **options)
    style = {"font.size": 9.5, "axes.spines.top": False, "axes.spines.right": False, "axes.titlesize": 10,
             "axes.titleweight": "bold"}
    with plt.rc_context(style):
        fig, axes = plt.subplots(3, 2, figsize=(10.5, 7.4), sharex="col",
                                 gridspec_kw={"height_ratios": [1, 1, 0.36], "hspace": 0.32, "wspace": 0.16})
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
                low.annotate(name, (0.5 * (x0 + x1), -k), xytext=(0, 4.5), textcoords="offset points", ha="center",
                             va="bottom", fontsize=8, color=c, zorder=4)
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
        fig.suptitle(f"{pic.label}: {pic.title}", fontsize=12.5, fontweight="bold", y=0.99)
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
    fig.savefig(buffer, format=fmt, dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    if fmt == "png":  # a 64-colour palette (Pillow, which matplotlib needs): about 3x smaller, no visible change
        from PIL import Image

        image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB").quantize(64, Image.Quantize.MEDIANCUT)
        buffer = io.BytesIO()
        image.save(buffer, format="png", optimize=True)
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
