"""What every advantage estimator shares: the base class, the registry, the uniform call path, input validation.

An estimator is a :class:`~rlzoo.registry.Component`: a frozen keyword-only dataclass whose fields are its
options (validated in ``check``), registered by subclassing with a name
(``class GRPO(AdvantageEstimator, name="grpo")``). Every estimator is called the same way::

    estimator(rewards, group_size=G)                      # or group_ids=[N] labels
    estimator(rewards, group_size=G, completion_mask=m, values=v, ...)   # the inputs it declares

and declares what it needs, as class attributes, so a trainer checks support without special-casing names:

* ``needs`` - inputs it cannot run without, among :data:`INPUTS` (read on the class: what it needs with
  any options; on an instance: plus what its chosen alternatives need, e.g. ``reinforce_pp_baseline`` with
  ``whiten="token"`` needs ``completion_mask``);
* ``accepts`` - every input it uses (a superset of ``needs``); passing any other input raises, so a signal
  such as per-token KL rewards is never dropped silently;
* ``uses_groups`` - whether it compares the completions of one prompt (then ``group_size`` or ``group_ids`` is
  required);
* ``token_level`` - whether it returns ``Float[N, T]`` (one advantage per token) instead of ``Float[N]``.

String options that select a behaviour (GRPO's ``scale``, GPG's ``alpha``, ``whiten``) are registered
alternatives (:class:`EstimatorChoice` subclasses, :func:`rlzoo.registry.choice` options): register a new
one to add a behaviour without editing the estimator.
"""

import abc
import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.advantages.groups import GroupIds, GroupIndex
from rlzoo.losses.functional import working_dtype
from rlzoo.registry import Component, Registry

__all__ = [
    "INPUTS",
    "TOKEN_INPUTS",
    "AdvantageEstimator",
    "AdvantageInputs",
    "EstimatorChoice",
    "advantage_estimators",
    "build_inputs",
    "check_rewards",
    "get_advantage",
    "list_advantages",
]

advantage_estimators: Registry[type["AdvantageEstimator"]] = Registry("advantage estimator")

INPUTS: tuple[str, ...] = ("completion_mask", "token_rewards", "values", "baseline_rewards", "old_logprobs",
                           "sum_pi_squared", "rollout_is_weights")
"""Optional inputs an estimator may declare in ``needs`` / ``accepts``:

* ``completion_mask`` - ``Bool[N, T]``, True on counted completion tokens;
* ``token_rewards`` - ``Float[N, T]``, dense per-token rewards (e.g. ``-beta * KL`` in the reward), added to
  the outcome reward ``rewards`` that sits on each sequence's last counted token;
* ``values`` - ``Float[N, T]``, the critic's value estimate ``V(s_t)`` per token;
* ``baseline_rewards`` - ``Float[N]``, the reward of a baseline response per item (ReMax: the greedy
  response);
* ``old_logprobs`` - ``Float[N, T]``, the sampling policy's log-probs of the sampled tokens (nats, <= 0 up to a
  rounding of 1e-5), as the trainer scores them at generation time;
* ``sum_pi_squared`` - ``Float[N, T]``, ``sum_v pi(v | context)^2`` of that policy at each position, in
  ``[1/V, 1]`` (``rlzoo.kernels``' ``return_sum_pi_squared``);
* ``rollout_is_weights`` - ``Float[N, T]``, >= 0, the sampler/trainer importance weights of a rollout
  correction (verl's ``rollout_is_weights``).
"""

TOKEN_INPUTS: tuple[str, ...] = ("token_rewards", "values", "old_logprobs", "sum_pi_squared", "rollout_is_weights")
"""The inputs shaped ``[N, T]`` like ``completion_mask`` (values at masked positions are ignored)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdvantageInputs:
    """The optional inputs of one call, validated and sanitized (masked positions hold 0).

    Attributes:
        completion_mask: ``Bool[N, T]`` or None.
        lengths: ``Float[N]`` counted tokens per sequence (``completion_mask.sum(-1)``), or None.
        token_rewards, values, old_logprobs, sum_pi_squared, rollout_is_weights: ``Float[N, T]`` or None, 0 at
            masked positions (whatever they held there).
        baseline_rewards: ``Float[N]`` or None.
    """

    completion_mask: Bool[Tensor, "N T"] | None = None
    lengths: Float[Tensor, " N"] | None = None
    token_rewards: Float[Tensor, "N T"] | None = None
    values: Float[Tensor, "N T"] | None = None
    baseline_rewards: Float[Tensor, " N"] | None = None
    old_logprobs: Float[Tensor, "N T"] | None = None
    sum_pi_squared: Float[Tensor, "N T"] | None = None
    rollout_is_weights: Float[Tensor, "N T"] | None = None

    @property
    def mask(self) -> Bool[Tensor, "N T"]:
        """``completion_mask``, which the estimator declared in ``needs``."""
        if self.completion_mask is None:  # pragma: no cover - guarded by `needs`
            raise RuntimeError("completion_mask was not given")
        return self.completion_mask


def _check_floating(owner: str, name: str, x: Any, shape: tuple[int, ...], like: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise ValueError(f"{owner}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(
            f"{owner}: {name} must be a floating-point tensor, got dtype {x.dtype}; convert with .float()"
        )
    if tuple(x.shape) != shape:
        raise ValueError(f"{owner}: {name} must have shape {like}={shape}, got {tuple(x.shape)}")
    return x


def check_rewards(rewards: Any, owner: str, name: str = "rewards") -> Tensor:
    """``rewards`` if it is a finite floating-point ``[N]`` tensor with ``N >= 1``; else a ``ValueError``
    naming it."""
    if not isinstance(rewards, Tensor):
        raise ValueError(f"{owner}: {name} must be a torch.Tensor of shape [N], got {type(rewards).__name__}")
    if rewards.ndim != 1 or rewards.shape[0] < 1:
        raise ValueError(
            f"{owner}: {name} must have shape [N] with N >= 1 (one reward per completion), got shape "
            f"{tuple(rewards.shape)}"
        )
    return _check_floating(owner, name, rewards, (int(rewards.shape[0]),), "[N]")


def _raise_not_finite(owner: str, checks: list[tuple[str, Tensor]]) -> None:
    """One device sync for all finiteness flags; raise naming the first offending input."""
    if not checks:
        return
    flags = torch.stack([flag for _, flag in checks]).cpu()
    if not bool(flags.any()):
        return
    for (name, _), bad in zip(checks, flags.tolist(), strict=True):
        if bad:
            where = " at a counted position (completion_mask True)" if name in TOKEN_INPUTS else ""
            if name in _RANGES:
                raise ValueError(f"{owner}: {name} holds NaN/inf or a value outside {_RANGES[name][2]}{where}")
            hint = ("; rewards must be finite (pass only the scored completions, with their group_ids: "
                    "docs/advantages.md)"
                    if "reward" in name else "; it must be finite")
            raise ValueError(f"{owner}: {name} holds NaN/inf{where}{hint}")


_RANGES: dict[str, tuple[float, float, str]] = {
    "old_logprobs": (-math.inf, 1e-5, "(-inf, 0] (log-probs, up to a rounding of 1e-5)"),
    "sum_pi_squared": (0.0, 1.0 + 1e-5, "[0, 1] (a sum of squared probabilities)"),
    "rollout_is_weights": (0.0, math.inf, "[0, inf) (importance weights)"),
}
"""Valid ranges ``(low, high, description)`` of the inputs that are not rewards."""


def _zero_masked(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def build_inputs(owner: str, rewards: Tensor, given: Mapping[str, Any]) -> AdvantageInputs:
    """Validate ``rewards`` and the optional inputs together (shapes, dtypes, devices, finiteness; one
    sync)."""
    n = int(rewards.shape[0])
    checks: list[tuple[str, Tensor]] = [("rewards", ~torch.isfinite(rewards.detach()).all())]
    mask = given.get("completion_mask")
    fields: dict[str, Any] = {}
    if mask is not None:
        if not isinstance(mask, Tensor):
            raise ValueError(f"{owner}: completion_mask must be a torch.Tensor, got {type(mask).__name__}")
        if mask.dtype != torch.bool:
            raise ValueError(
                f"{owner}: completion_mask must have dtype torch.bool (True = token counts), got "
                f"{mask.dtype}; convert with .bool()"
            )
        if mask.ndim != 2 or mask.shape[0] != n or mask.shape[1] < 1:
            raise ValueError(
                f"{owner}: completion_mask must have shape [N, T] with N={n} like rewards and T >= 1, "
                f"got {tuple(mask.shape)}"
            )
        if mask.device != rewards.device:
            raise ValueError(
                f"{owner}: completion_mask is on {mask.device} but rewards is on {rewards.device}"
            )
        fields["completion_mask"] = mask
        fields["lengths"] = mask.sum(-1).to(rewards.dtype)
    for name in TOKEN_INPUTS:
        x = given.get(name)
        if x is None:
            continue
        if mask is None:  # pragma: no cover - every estimator accepting them needs the mask
            raise ValueError(f"{owner}: {name} needs completion_mask")
        x = _check_floating(owner, name, x, tuple(mask.shape), "[N, T] like completion_mask")
        if x.device != rewards.device:
            raise ValueError(f"{owner}: {name} is on {x.device} but rewards is on {rewards.device}")
        bad = ~torch.isfinite(x.detach())
        if name in _RANGES:
            low, high, _ = _RANGES[name]
            bad = bad | (x.detach() < low) | (x.detach() > high)
        checks.append((name, (bad & mask).any()))
        fields[name] = _zero_masked(x.to(rewards.dtype), mask)
    baseline = given.get("baseline_rewards")
    if baseline is not None:
        baseline = _check_floating(owner, "baseline_rewards", baseline, (n,), "[N] like rewards")
        if baseline.device != rewards.device:
            raise ValueError(
                f"{owner}: baseline_rewards is on {baseline.device} but rewards is on {rewards.device}"
            )
        checks.append(("baseline_rewards", ~torch.isfinite(baseline.detach()).all()))
        fields["baseline_rewards"] = baseline.to(rewards.dtype)
    _raise_not_finite(owner, checks)
    return AdvantageInputs(**fields)


class EstimatorChoice(Component, abc.ABC):
    """Base of the registered alternatives of an estimator option (advantage scale, GPG alpha, whitening).

    ``needs``: the inputs (among :data:`INPUTS`) an estimator needs when this alternative is chosen.
    """

    needs: ClassVar[frozenset[str]] = frozenset()


class AdvantageEstimator(Component, abc.ABC):
    """Base of every advantage estimator (abstract; subclass with ``name=`` to register one).

    Subclasses set the class attributes ``needs``, ``accepts``, ``uses_groups``, ``token_level`` and
    implement ``_compute(rewards, groups, inputs)``. See the module docstring for the calling convention.

    Class attributes:
        needs: inputs (among :data:`INPUTS`) it cannot run without, whatever its options; an instance's
            ``needs`` adds those of its chosen alternatives (:class:`EstimatorChoice`).
        accepts: every input it may use, a superset of ``needs`` (``needs`` is added to it on subclassing).
        uses_groups: whether ``group_size`` / ``group_ids`` is required.
        token_level: whether it returns ``Float[N, T]``.
    """

    registry: ClassVar[Registry[type["AdvantageEstimator"]]] = advantage_estimators
    needs: ClassVar[frozenset[str]] = frozenset()
    accepts: ClassVar[frozenset[str]] = frozenset()
    uses_groups: ClassVar[bool] = True
    token_level: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.accepts = frozenset(cls.accepts) | cls.needs

    def __post_init__(self) -> None:
        super().__post_init__()
        chosen = [registry.get(getattr(self, option)) for option, registry in self.choices().items()]
        needs = type(self).needs.union(*(alt.needs for alt in chosen))
        # the instance's own declarations (frozen dataclass: set once, here)
        object.__setattr__(self, "needs", needs)
        object.__setattr__(self, "accepts", type(self).accepts | needs)

    def __call__(
        self,
        rewards: Float[Tensor, " N"],
        *,
        group_size: int | None = None,
        group_ids: GroupIds | None = None,
        completion_mask: Bool[Tensor, "N T"] | None = None,
        token_rewards: Float[Tensor, "N T"] | None = None,
        values: Float[Tensor, "N T"] | None = None,
        baseline_rewards: Float[Tensor, " N"] | None = None,
        old_logprobs: Float[Tensor, "N T"] | None = None,
        sum_pi_squared: Float[Tensor, "N T"] | None = None,
        rollout_is_weights: Float[Tensor, "N T"] | None = None,
    ) -> Float[Tensor, " N"] | Float[Tensor, "N T"]:
        """Advantages of ``N`` completions.

        Args:
            rewards: ``Float[N]``, one finite scalar (outcome) reward per completion. Token-level estimators
                place it on each sequence's last counted token.
            group_size: ``G``: groups are ``G`` consecutive items (TRL's order); must divide ``N``.
            group_ids: ``[N]`` group labels instead of ``group_size`` (verl's ``index``; any order).
                Group-relative estimators need exactly one of the two; the others ignore both.
            completion_mask, token_rewards, values, baseline_rewards, old_logprobs, sum_pi_squared,
                rollout_is_weights: see :data:`INPUTS`; only those in
                :attr:`accepts` may be given, and those in :attr:`needs` must be. Values at masked positions
                are ignored (NaN included).

        Returns:
            ``Float[N]``, or ``Float[N, T]`` for token-level estimators (0 at masked positions); ``rewards``'
            dtype (bf16 / fp16 rewards are computed in float32 and rounded once at the end).

        Raises:
            ValueError: naming the field: non-finite rewards (or inputs at counted positions), wrong shape or
                dtype, a missing needed input, an input the estimator does not use, or bad grouping (see
                :meth:`GroupIndex.build`).
        """
        owner = f"advantage estimator {self.label()!r}"
        rewards = check_rewards(rewards, owner)
        given = {
            "completion_mask": completion_mask,
            "token_rewards": token_rewards,
            "values": values,
            "baseline_rewards": baseline_rewards,
            "old_logprobs": old_logprobs,
            "sum_pi_squared": sum_pi_squared,
            "rollout_is_weights": rollout_is_weights,
        }
        given = {k: v for k, v in given.items() if v is not None}
        missing = sorted(self.needs - given.keys())
        if missing:
            raise ValueError(f"{owner} needs {', '.join(missing)} (not given)")
        unused = sorted(given.keys() - self.accepts)
        if unused:
            accepted = ", ".join(sorted(self.accepts)) or "none"
            raise ValueError(
                f"{owner} does not use {', '.join(unused)} (it would be ignored); inputs it accepts: "
                f"{accepted}"
            )
        # bf16 / fp16 rewards are computed in float32 (a bf16 group sum stops growing at 256, an fp16 one
        # overflows at 65504) and returned in their dtype
        work = rewards.to(working_dtype(rewards.dtype))
        inputs = build_inputs(owner, work, given)
        groups = None
        if self.uses_groups:
            device = rewards.device
            groups = GroupIndex.build(
                int(rewards.shape[0]), group_size=group_size, group_ids=group_ids, device=device, owner=owner
            )
        return self._compute(work, groups, inputs).to(rewards.dtype)

    @abc.abstractmethod
    def _compute(self, rewards: Float[Tensor, " N"], groups: GroupIndex | None,
                 inputs: AdvantageInputs) -> Float[Tensor, " N"] | Float[Tensor, "N T"]:
        """The advantages from validated inputs (``groups`` is None unless ``uses_groups``)."""


def get_advantage(name: str, **options: Any) -> AdvantageEstimator:
    """The advantage estimator registered as ``name``, configured with ``options``.

    Args:
        name: one of :func:`list_advantages`.
        **options: the estimator's keyword options (its dataclass fields), e.g. ``scale="group"``.

    Returns:
        The configured estimator; call it as ``estimator(rewards, group_size=G, ...)``.

    Raises:
        rlzoo.UnknownNameError: (a ``KeyError`` and ``ValueError``) for an unknown name, listing the valid
        names.
        ValueError: for an option the estimator does not have (listing its options) or an invalid option value
            (naming the option and its valid values or range).

    Example:
        >>> import torch, rlzoo
        >>> estimator = rlzoo.get_advantage("grpo", scale="none")
        >>> estimator(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=2).tolist()
        [0.5, -0.5, 0.0, 0.0]
    """
    cls = advantage_estimators.get(name)
    valid = cls.option_names()
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"advantage estimator {name!r} has no option {', '.join(map(repr, unknown))}; valid options: "
            f"{', '.join(valid) or 'none'}"
        )
    return cls(**options)


def list_advantages() -> list[str]:
    """Sorted names of the registered advantage estimators."""
    return advantage_estimators.names()
