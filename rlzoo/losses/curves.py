r"""The numbers behind ``rlzoo plot``: the per-token objective and its gradient as functions of the ratio ``r``,
computed by calling the loss on one-token batches with autograd (:func:`objective_curves`). What they show and
the conventions they follow are in :mod:`rlzoo.losses.pictures`, which draws them.

Example:
    >>> from rlzoo.losses.curves import objective_curves
    >>> up, down = objective_curves("ppo", num=41).curves  # A = +1, A = -1
    >>> [round(b, 9) for b in up.breakpoints], [round(b, 9) for b in down.breakpoints]
    ([1.2], [0.8])
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.batch import PolicyBatch
from rlzoo.losses.policy_loss import PolicyLoss
from rlzoo.losses.presets import get_loss, presets

__all__ = ["RATIO_OPTIONS", "ObjectiveCurve", "ObjectivePicture", "objective_curves"]

RATIO_OPTIONS = ("dual_clip", "delta", "clip_ratio_c", "distillation_clip_ratio_c")
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
        drawn: ``repr`` of the loss as given (a preset with its overrides, before any convention): every option of
            every part, stored in the picture's PNG so that a stale picture can be told from a current one.
    """

    label: str
    title: str
    loss: PolicyLoss
    old_prob: float
    curves: tuple[ObjectiveCurve, ObjectiveCurve]
    notes: tuple[str, ...]
    drawn: str = ""


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
            elif name in ("group_index", "versions"):  # its own group; sampled by version 0, one update behind
                self.fields[name] = torch.zeros(1, dtype=torch.long)
            elif name == "current_version":
                self.fields[name] = 1  # type: ignore[assignment]  # an int field of PolicyBatch
            else:
                raise ValueError(f"rlzoo plot: the loss needs PolicyBatch.{name}, which has no picture convention; "
                                 f"pass it in fields= of rlzoo.losses.curves.objective_curves (PolicyBatch fields: "
                                 f"{', '.join(sorted(known))})")

    def __call__(self, r: float) -> tuple[float, float, dict[str, float]]:
        logprob = min(0.0, math.log(r) + self.log_old)  # r * p_old <= 1: only rounding is clamped
        lp = torch.tensor([[logprob]], dtype=torch.float64, requires_grad=True)
        if self.loss.bypass_mode or self.loss.prox_logp_method != "recompute":  # the old policy is the sampler's
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
    notes, drawn = [], repr(built)
    if built.aggregation.needs_max_completion_length and built.max_completion_length is None:
        built = built.with_options(max_completion_length=1)
        notes.append("max_completion_length = 1")
    r_max = _ratio_range(built) if r_max is None else float(r_max)
    if not (math.isfinite(r_max) and r_max > max(1.0, r_min)):
        raise ValueError(f"objective_curves: r_max must be finite and > max(1, r_min), got {r_max!r}")
    if old_prob > 1.0 / r_max:  # r * p_old is a probability
        old_prob = 1.0 / r_max
        notes.append(f"p_old = 1/r_max = {old_prob:.3g}")
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
    if built.coupled_parts(is_weight_sums=False):  # the IS weights' batch mean too: 1 for this one token
        notes.append("batch-coupled part: a batch of this one token")
    return ObjectivePicture(label=label, title=title, loss=built, old_prob=old_prob,
                            curves=curves, notes=tuple(notes), drawn=drawn)  # type: ignore[arg-type]
