r"""Any rlzoo loss in verl 0.9.1's policy-loss registry: :func:`register`.

verl picks its actor's policy loss by name (``actor_rollout_ref.actor.policy_loss.loss_mode``) from
``verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY``. :func:`register` adds an rlzoo loss there, wrapped in a
:class:`VerlPolicyLoss` with verl's signature::

    from rlzoo.integrations.verl import register

    register("rlzoo_gmpo", "gmpo", follow_loss_agg_mode=False)  # then: ...policy_loss.loss_mode=rlzoo_gmpo

(``follow_loss_agg_mode=False`` keeps the loss's own aggregation, GMPO's per-sequence mean, as verl's ``geo_mean``
does; by default the loss takes verl's ``loss_agg_mode``, ``token-mean`` unless configured.)

verl builds its workers in other processes (Ray), so the registration must run in each of them: put it in a
module and name that module in ``actor_rollout_ref.model.external_lib`` (verl imports it in every worker) or in
the ``VERL_USE_EXTERNAL_MODULES`` environment variable. docs/integrations.md has the recipe.

What the wrapper does with verl's arguments (``verl/workers/utils/losses.py::ppo_loss`` sets them):

* ``old_log_prob``, ``log_prob``, ``advantages`` (``[B, T]``), ``response_mask`` -> a
  :class:`~rlzoo.PolicyBatch` (validated: a NaN or positive log-prob at a counted position raises).
* ``config.global_batch_info``: ``batch_num_tokens`` and ``global_batch_size`` (the mini-batch's counts on all
  data-parallel ranks) -> :class:`~rlzoo.Normalizer`; the loss is multiplied by ``dp_size`` (DDP/FSDP average
  gradients over ranks), as verl's ``agg_loss``. Without them (and ``dp_size == 1``) the micro-batch's own counts
  are used, as verl does. ``loss_scale_factor`` -> ``max_completion_length`` of "seq-mean-token-sum-norm" (then
  the loss's own, then the padded length ``T``, verl's fallback).
* ``loss_agg_mode`` -> the loss's aggregation (``follow_loss_agg_mode=True``, default; verl's contract), or
  the rlzoo loss keeps its own (``False``; as verl's ``sapo`` and ``geo_mean``, which ignore the argument).
* ``rollout_is_weights`` (verl's ``algorithm.rollout_correction`` weights, detached, ``[B, T]``) multiply the
  per-token loss exactly where rlzoo applies its sampler/trainer correction weight (the surrogate's choice:
  per token for PPO-clip, CISPO, SAPO, DRO, DPPO, GPG; the per-sequence geometric mean for GMPO, as verl's
  ``geo_mean``). They enter as a ``token_truncate`` IS correction without bounds whose sampler log-probs are
  ``old_log_prob - log(w)``, so ``exp(old - sampler) = w`` up to one rounding (relative 1e-7 in float32).
* ``config``'s own loss options (``clip_ratio*``, ``tau_*``, ``policy_loss.*``) are not read: the rlzoo loss
  carries its options (``rlzoo.get_loss("dapo", epsilon_high=0.28)``).

verl passes no reference log-probs, entropies or sampler log-probs to a policy loss (its KL loss, entropy bonus
and rollout correction live outside it), so :func:`register` refuses a loss that needs them and names verl's
option that does the job.
"""

import dataclasses
import math
from typing import Any

import torch
from jaxtyping import Float, Shaped
from torch import Tensor

from rlzoo.algorithms.cov import KLCov
from rlzoo.batch import BatchError, Normalizer, PolicyBatch
from rlzoo.losses import OffPolicySequenceMask, PolicyLoss, PPOClip, get_loss
from rlzoo.losses.functional import working_dtype

__all__ = ["VerlPolicyLoss", "register"]

# What verl does instead, for each PolicyBatch field a registered loss cannot get.
_VERL_INSTEAD = {
    "ref_logprobs": "verl adds the KL loss itself: actor_rollout_ref.actor.use_kl_loss=True, kl_loss_coef=..., "
    "kl_loss_type=low_var_kl (= k3); register the loss with beta=0",
    "entropies": "verl adds the entropy bonus itself (actor_rollout_ref.actor.entropy_coeff); an entropy mask "
    "(top_entropy_quantile) is not available in verl",
    "rollout_logprobs": "verl applies the sampler/trainer correction itself (rollout_is_weights) and its rejection "
    "(a modified response mask): set algorithm.rollout_correction.rollout_is=token|sequence (rollout_is_threshold) "
    "or rollout_rs=... (rollout_rs_threshold), and register the loss without them; verl's bypass_mode=True "
    "replaces policy_loss.loss_mode with its own loss, so no registered loss runs under it",
}
_AGG_COUNT = {"token-mean": "batch_num_tokens", "seq-mean-token-mean": "global_batch_size",
              "seq-mean-token-sum": "global_batch_size", "seq-mean-token-sum-norm": "global_batch_size"}
VERL_LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""verl 0.9.1's ``loss_agg_mode`` names (its ``agg_loss``), spelt exactly as verl takes them."""
# rlzoo metric -> verl's name for the same statistic, for a PPO-clip surrogate (verl's vanilla and gspo losses:
# pg_clipfrac, pg_clipfrac_lower). verl's other losses give pg_clipfrac meanings of their own (cispo: ratio !=
# its clip, whatever the advantage's sign), so a loss with another surrogate reports its clip metrics under
# rlzoo's names only.
_VERL_METRIC_NAMES = {"clip_ratio/region_mean": "actor/pg_clipfrac", "clip_ratio/dual_mean": "actor/pg_clipfrac_lower"}


@dataclasses.dataclass(frozen=True, eq=False)
class VerlPolicyLoss:
    """An rlzoo loss with verl 0.9.1's policy-loss signature (what :func:`register` puts in verl's registry).

    Args:
        loss: the rlzoo :class:`~rlzoo.losses.PolicyLoss` (no KL penalty, entropy term or IS correction: see
            :func:`register`).
        follow_loss_agg_mode: True: verl's ``loss_agg_mode`` argument sets the aggregation; False: the loss's own.
    """

    loss: PolicyLoss
    follow_loss_agg_mode: bool = True
    _variants: dict = dataclasses.field(default_factory=dict, init=False, repr=False)

    def _variant(self, aggregation: str, max_completion_length: int | None, weighted: bool) -> PolicyLoss:
        """The loss with that aggregation / length / weight input (built once per combination)."""
        key = (aggregation, max_completion_length, weighted)
        if key not in self._variants:
            options: dict[str, Any] = {"aggregation": aggregation, "max_completion_length": max_completion_length}
            if weighted:
                options.update(is_correction="token_truncate", is_min=None, is_max=math.inf)
            self._variants[key] = self.loss.with_options(**options)
        return self._variants[key]

    def __call__(
        self,
        old_log_prob: Float[Tensor, "B T"],
        log_prob: Float[Tensor, "B T"],
        advantages: Float[Tensor, "B T"],
        response_mask: Shaped[Tensor, "B T"],
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Float[Tensor, "B T"] | None = None,
    ) -> tuple[Float[Tensor, ""], dict[str, float]]:
        """verl's ``PolicyLossFn``: the rlzoo loss of one micro-batch, scaled for verl's data parallelism.

        Args:
            old_log_prob: ``Float[B, T]`` log-probs of the policy that sampled (verl's ``old_log_probs``), <= 0.
            log_prob: ``Float[B, T]`` current log-probs (carry the gradient), <= 0.
            advantages: ``Float[B, T]`` (verl broadcasts sequence advantages over tokens).
            response_mask: ``[B, T]`` bool or 0/1: the tokens that count.
            loss_agg_mode: verl's aggregation name (used when ``follow_loss_agg_mode``).
            config: verl's ``ActorConfig`` (or a DictConfig); only ``config.global_batch_info`` is read: ``dp_size``
                (default 1), ``batch_num_tokens``, ``global_batch_size``, ``loss_scale_factor``.
            rollout_is_weights: ``Float[B, T]`` detached sampler/trainer weights >= 0, or None.

        Returns:
            ``(loss, metrics)``: the 0-d loss, ``dp_size * loss_fn(batch, Normalizer(batch_num_tokens,
            global_batch_size))``, and floats named ``actor/<rlzoo metric>``, plus verl's ``actor/ppo_kl`` (mean of
            ``old - log_prob``), and for a PPO-clip surrogate (verl's vanilla and gspo losses) ``actor/pg_clipfrac``
            (``clip_ratio/region_mean``) and ``actor/pg_clipfrac_lower`` (``clip_ratio/dual_mean``) where the loss
            has them.

        Raises:
            ValueError: ``rollout_is_weights`` with an active off-policy sequence mask (the weights cannot give
                back the sampler log-probs it needs), ``dp_size > 1`` without the global count the aggregation
                divides by (as verl), a global count below the micro-batch's own, or a ``loss_agg_mode`` (followed) that is not verl's, as verl spells it
                (lists :data:`VERL_LOSS_AGG_MODES`: ``token_mean`` or ``prompt-mean`` are not).
            BatchError: NaN/inf or a positive log-prob at a counted position, or a negative/NaN/inf
                ``rollout_is_weights`` value there.
        """
        if self.follow_loss_agg_mode and loss_agg_mode not in VERL_LOSS_AGG_MODES:  # verl's agg_loss would raise
            raise ValueError(f"loss_agg_mode {loss_agg_mode!r} is not one of verl's: {', '.join(VERL_LOSS_AGG_MODES)}")
        info = dict(getattr(config, "global_batch_info", None) or {})
        dp_size = int(info.get("dp_size") or 1)
        aggregation = loss_agg_mode if self.follow_loss_agg_mode else self.loss.aggregation.registered_name()
        length = self.loss.max_completion_length
        if aggregation == "seq-mean-token-sum-norm":
            length = int(info.get("loss_scale_factor") or length or response_mask.shape[-1])
        loss_fn = self._variant(aggregation, length, rollout_is_weights is not None)

        if rollout_is_weights is not None and any(isinstance(p, OffPolicySequenceMask) and p.active
                                                  for p in self.loss.weights):
            raise ValueError(
                f"loss {self.loss.name or ''!s}: its off-policy sequence mask (off_policy_mask_threshold) measures the "
                "drift from the sampler's log-probs, which verl does not pass and rollout_is_weights cannot give back "
                "(verl truncates them, or gives one per sequence): turn algorithm.rollout_correction.rollout_is off "
                "(the mask then measures the drift from old_log_prob), or register the loss without the mask")
        mask = response_mask.bool()
        batch = PolicyBatch(logprobs=log_prob, old_logprobs=old_log_prob, advantages=advantages, completion_mask=mask)
        if rollout_is_weights is not None:
            work = working_dtype(old_log_prob.dtype)  # as the loss computes (a bf16 log(1.01) next to -5 is lost)
            weights = rollout_is_weights.detach().to(work)
            sampler = old_log_prob.detach().to(work) - torch.log(weights)  # exp(old - sampler) == weights
            batch = dataclasses.replace(batch, rollout_logprobs=sampler, check_values=False)  # checked above
        local = Normalizer.from_masks(mask)
        out = loss_fn(batch, _normalizer(info, aggregation, local, dp_size))

        with torch.no_grad():
            metrics = {f"actor/{k}": v for k, v in out.metrics.items() if not k.startswith("sampling/")}
            if isinstance(loss_fn.surrogate, PPOClip):
                metrics.update({verl: out.metrics[k] for k, verl in _VERL_METRIC_NAMES.items() if k in out.metrics})
            work = working_dtype(old_log_prob.dtype)
            old = torch.where(mask, old_log_prob.detach().to(work), 0.0)
            kl = old - torch.where(mask, log_prob.detach().to(work), 0.0)
            if isinstance(loss_fn.surrogate, KLCov):  # verl's kl_cov reports the mean |log-ratio| under this name
                kl = kl.abs()
            metrics["actor/ppo_kl"] = kl.sum() / mask.sum().clamp(min=1)
            bad = torch.zeros((), dtype=torch.bool, device=mask.device)
            if rollout_is_weights is not None:
                bad = ((~torch.isfinite(weights) | (weights < 0)) & mask).any()
            names = sorted(metrics)
            counts = [torch.as_tensor(c, dtype=torch.float64, device=mask.device)  # checked against verl's, below
                      for c in (local.num_tokens, local.num_sequences)]
            values = torch.stack([metrics[k].to(torch.float64).reshape(()) for k in names] + counts + [bad.double()])
            values = values.tolist()  # the one device sync
        for key, mine in zip(("batch_num_tokens", "global_batch_size"), values[-3:-1], strict=True):
            if info.get(key) is not None and info[key] < mine:  # a global count covers the micro-batch (0 read as 1)
                raise ValueError(f"config.global_batch_info[{key!r}] is {info[key]}, fewer than this micro-batch's "
                                 f"own {int(mine)}: it must count the whole mini-batch on all data-parallel ranks")
        if values[-1]:
            raise BatchError("rollout_is_weights holds a NaN/inf or negative value at a counted position")
        return out.loss * dp_size, dict(zip(names, values[:-3], strict=True))


def _normalizer(info: dict[str, Any], aggregation: str, local: Normalizer, dp_size: int) -> Normalizer:
    """verl's global counts (``batch_num_tokens``, ``global_batch_size``) or, without them, the micro-batch's
    (``local``)."""
    needed = _AGG_COUNT.get(aggregation)
    if dp_size > 1 and needed is not None and info.get(needed) is None:
        raise ValueError(
            f"config.global_batch_info[{needed!r}] is required when dp_size > 1 (loss_agg_mode={aggregation!r}), as "
            "in verl's agg_loss"
        )
    tokens, sequences = info.get("batch_num_tokens"), info.get("global_batch_size")
    return Normalizer(
        num_tokens=local.num_tokens if tokens is None else tokens,
        num_sequences=local.num_sequences if sequences is None else sequences,
    )


def register(
    name: str, loss: PolicyLoss | str, *, follow_loss_agg_mode: bool = True, overwrite: bool = False
) -> VerlPolicyLoss:
    """Register an rlzoo loss as verl 0.9.1 policy loss ``name`` (``policy_loss.loss_mode=<name>``).

    Args:
        name: the verl ``loss_mode`` name; must be new unless ``overwrite`` (registering an equal loss again under
            the same name is a no-op, so a module that registers can be imported twice).
        loss: an rlzoo :class:`~rlzoo.losses.PolicyLoss` or a preset name (``rlzoo.list_losses()``).
        follow_loss_agg_mode: True (default): verl's ``actor.loss_agg_mode`` sets the aggregation (verl's
            contract); False: the rlzoo loss keeps its own aggregation (e.g. gmpo's "seq-mean-token-mean").
        overwrite: replace an existing entry, verl's own included.

    Returns:
        The registered :class:`VerlPolicyLoss`.

    Raises:
        TypeError: ``name`` is not a non-empty str; ``loss`` is neither a PolicyLoss nor a str.
        UnknownNameError: an unknown preset (lists the presets).
        ValueError: ``name`` is taken (and ``overwrite`` is False), or the loss needs a field verl does not pass
            to policy losses (reference log-probs, entropies, sampler log-probs); the message names the verl option
            that does that job.
        ImportError: verl is not installed.

    Example (in the module named by ``actor_rollout_ref.model.external_lib``; see examples/verl_losses.py)::

        from rlzoo.integrations.verl import register

        register("rlzoo_gmpo", "gmpo", follow_loss_agg_mode=False)  # loss_mode=rlzoo_gmpo
    """
    if not isinstance(name, str):
        raise TypeError(f"register(name, loss): name must be a non-empty str (verl's loss_mode), got {name!r}")
    if not name.strip() or name != name.strip():  # a config's unquoted loss_mode is trimmed: it could not be selected
        raise ValueError(f"register(name, loss): name must be a non-empty str (verl's loss_mode) without surrounding "
                         f"spaces, got {name!r}")
    if isinstance(loss, str):
        loss = get_loss(loss)
    if not isinstance(loss, PolicyLoss):
        raise TypeError(f"register(name, loss): loss must be an rlzoo PolicyLoss or a preset name, got {type(loss).__name__}")
    # under follow_loss_agg_mode verl's loss_agg_mode replaces the loss's own aggregation (prompt-mean's group_index)
    called = loss.with_options(aggregation="token-mean") if follow_loss_agg_mode else loss
    missing = sorted(called.required_fields())
    if missing:
        reason = _VERL_INSTEAD.get(missing[0], "verl passes only old_log_prob, log_prob, advantages, response_mask")
        raise ValueError(f"{loss.called} given as {name!r} needs "
                         f"PolicyBatch.{missing[0]} (for "
                         f"{', '.join(loss.needed_by(missing[0]))}), which verl does not pass to a policy loss: {reason}")
    from verl.trainer.ppo import core_algos

    fn = VerlPolicyLoss(loss=loss, follow_loss_agg_mode=follow_loss_agg_mode)
    existing = core_algos.POLICY_LOSS_REGISTRY.get(name)
    if existing is not None and not overwrite:
        if (isinstance(existing, VerlPolicyLoss) and existing.loss == loss
                and existing.follow_loss_agg_mode == follow_loss_agg_mode):
            return existing
        raise ValueError(
            f"verl policy loss {name!r} is already registered ({getattr(existing, '__name__', type(existing).__name__)}"
            "); pick another name or pass overwrite=True"
        )
    core_algos.register_policy_loss(name)(fn)
    return fn
