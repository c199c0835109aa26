r"""Rollout correction with verl 0.9.1's names, for any loss: importance weights (``rollout_is``), rejection
(``rollout_rs``). SkyRL's outlier-token veto and geometric sequence mask are token weights
(:mod:`rlzoo.losses.weights`).

Three policies meet in an off-policy update: the sampler that generated the tokens (``rollout_logprobs``, e.g.
vLLM: :math:`\pi_{rollout}`), the old policy as the trainer scores it (``old_logprobs``: :math:`\pi_{old}`), and the
trained policy :math:`\pi_\theta`. With :math:`\log\rho_t = \log\pi_{old}(o_t) - \log\pi_{rollout}(o_t)` (verl's
"decoupled" mode, the default):

==========================================  ==============================================================
verl option (``algorithm.rollout_correction``)  rlzoo (``rlzoo.get_loss(name, **options)``)
==========================================  ==============================================================
``rollout_is``: None / "token" / "sequence"  ``rollout_is`` (:class:`RolloutCorrection`): per-token
                                             :math:`\rho_t`, or the sequence's :math:`\prod_t\rho_t`
                                             broadcast; detached; multiplies the per-token loss
``rollout_is_threshold``: 2.0 / "0.5_5.0"    a number: truncate (TIS, ``min(w, upper)``); a string
                                             ``"lower_upper"``: IcePop, ``w = 0`` outside ``[lower, upper]``
                                             (the token still counts in the denominators)
``rollout_is_batch_normalize``: False        divide the weights by their mean over the batch's tokens
                                             ("token") or sequences ("sequence"): those the Normalizer's
                                             ``is_weight_sum`` counts
``rollout_rs``: "token_k1,seq_mean_k3"       ``rollout_rs`` (:class:`RolloutRejection`): reject tokens or
                                             whole sequences; comma-combined criteria must all pass
``rollout_rs_threshold``: "0.5_2.0,0.01"     one threshold per criterion (or one for all): ``*_k1``
                                             takes ``"lower_upper"`` ratio bounds (a single number ``u``
                                             means ``1/u .. u``), ``*_k2`` / ``*_k3`` an upper bound
``bypass_mode``: True                        ``bypass_mode=True`` (a loss option): ``old_logprobs`` :=
                                             ``rollout_logprobs``; IS weight and rejection compare
                                             :math:`\pi_\theta` (detached) with :math:`\pi_{rollout}`
``loss_type``: "ppo_clip" / "reinforce"      the surrogate: ``get_loss("ppo", bypass_mode=True, ...)``
                                             (the ratio is the IS weight: ``rollout_is`` is reported, not
                                             applied) or ``get_loss("gpg", bypass_mode=True, rollout_is=
                                             ...)`` (REINFORCE times the IS weight)
==========================================  ==============================================================

Rejected tokens leave the loss: in the decoupled mode they leave the loss mask of every term and its counts,
exactly as verl's modified ``response_mask`` (computed in the trainer before the update, it also masks the KL
and entropy terms and sets ``batch_num_tokens``): build the :class:`~rlzoo.Normalizer` of a split batch from
:meth:`~rlzoo.losses.PolicyLoss.loss_mask` (``Normalizer.from_batch(*micro_batches, loss=loss_fn)``). In bypass
mode the rejection compares with the current policy, unknown before the forward pass: rejected tokens leave
the policy term only and the counts stay those of the completion mask, as verl's ``bypass_mode`` policy loss
(its ``global_batch_info`` counts the unmodified mask; its KL and entropy terms use it too).

Geo-RS (verl's ``decoupled_geo_rs`` / ``bypass_*_geo_rs`` presets) is ``rollout_rs="seq_mean_k1"``: the geometric
mean of the sequence's ratios :math:`\exp(\mathrm{mean}_t \log\rho_t)` within ``[1/upper, 1/lower]`` (verl's k1 is
:math:`-\log\rho`; its ``"0.999_1.001"`` bounds are symmetric). SkyRL implements the same two ideas differently:
its masks are weights of the policy term (the denominators keep the masked tokens) and its bounds are on
:math:`\rho` itself; :class:`~rlzoo.losses.GeometricSequenceMask` and :class:`~rlzoo.losses.OutlierTokenVeto`
(:mod:`rlzoo.losses.weights`) are SkyRL's.

References:
    Liu, Li, Fu, Wang, Liu, Shen 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
    Training-Inference Mismatch" (sequence-level IS, masking, Geo-RS); Yao et al. 2025, "Your Efficient RL
    Framework Secretly Brings You Off-Policy RL Training" (truncated IS); verl 0.9.1
    ``verl/trainer/ppo/rollout_corr_helper.py`` and ``core_algos.compute_policy_loss_bypass_mode``; SkyRL
    ``skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py``.
"""

import math
from types import MappingProxyType

import torch
from jaxtyping import Float
from torch import Tensor

from rlzoo.losses.base import LossInputs, PartOutput
from rlzoo.losses.correction import SAFETY_BOUND, Correction
from rlzoo.losses.functional import masked_max, masked_mean, masked_min
from rlzoo.losses.off_policy import Rejection
from rlzoo.registry import check_choice

__all__ = [
    "RS_CRITERIA",
    "RolloutCorrection",
    "RolloutRejection",
    "parse_is_threshold",
    "parse_rs_thresholds",
]


RS_CRITERIA = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
               "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
"""The ``rollout_rs`` criteria of verl 0.9.1 (``SUPPORTED_ROLLOUT_RS_OPTIONS``)."""


def _positive(owner: str, option: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{owner}: {option} must hold numbers, got {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise ValueError(f"{owner}: {option} bounds must be finite and > 0, got {text}")
    return value


def parse_is_threshold(threshold: float | str) -> tuple[float, float | None]:
    """``(upper, lower or None)`` of verl's ``rollout_is_threshold``: a number (or a number as a string) is the
    truncation bound (lower None: TIS); ``"lower_upper"`` the IcePop interval.

    Raises:
        ValueError: naming rollout_is_threshold: not a number or string, empty, not numeric, a bound <= 0 or
            infinite, or lower > upper.
    """
    owner, option = "rollout_is", "rollout_is_threshold"
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, str)):
        raise ValueError(f"{owner}: {option} must be a number (truncate) or a 'lower_upper' string (IcePop), got "
                         f"{type(threshold).__name__} {threshold!r}")
    if isinstance(threshold, str):
        spec = threshold.strip()
        if not spec:
            raise ValueError(f"{owner}: {option} must not be empty")
        if "_" in spec:
            low_text, high_text = spec.split("_", 1)
            lower, upper = _positive(owner, option, low_text), _positive(owner, option, high_text)
            if lower > upper:
                raise ValueError(f"{owner}: {option} lower bound ({lower}) must be <= the upper bound ({upper})")
            return upper, lower
        return _positive(owner, option, spec), None
    return _positive(owner, option, str(float(threshold))), None


def parse_rs_thresholds(criteria: tuple[str, ...], threshold: float | str | None) -> tuple[tuple[float | None, float], ...]:
    """``(lower or None, upper)`` per criterion from verl's ``rollout_rs_threshold``.

    One comma-separated entry per criterion, or one entry for all. A ``*_k1`` criterion bounds the ratio:
    ``"lower_upper"``, or a single ``u`` meaning ``1/u .. u``; a ``*_k2`` / ``*_k3`` criterion takes one upper
    bound on the divergence.

    Raises:
        ValueError: naming rollout_rs_threshold: missing, not a number or string, the wrong number of entries,
            a non-numeric or non-positive bound, lower > upper, or a ``lower_upper`` pair for a k2/k3 criterion.
    """
    owner, option = "rollout_rs", "rollout_rs_threshold"
    if threshold is None:
        raise ValueError(f"{owner}: {option} must be given when rollout_rs is set: for a *_k1 criterion "
                         "'lower_upper' or one u >= 1 meaning 1/u..u (e.g. '0.5_2.0' or 2.0), for *_k2 / *_k3 an "
                         "upper bound on the divergence (e.g. 0.01)")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, str)):
        raise ValueError(f"{owner}: {option} must be a number or a string, got {type(threshold).__name__}")
    specs = [str(float(threshold))] if not isinstance(threshold, str) else [
        p.strip() for p in threshold.split(",") if p.strip()]
    if not specs:
        raise ValueError(f"{owner}: {option} must hold at least one threshold")
    if len(specs) not in (1, len(criteria)):
        raise ValueError(f"{owner}: {option} needs one threshold for all criteria or one per criterion "
                         f"({len(criteria)}: {', '.join(criteria)}), got {len(specs)}")
    if len(specs) == 1:
        specs = specs * len(criteria)
    out: list[tuple[float | None, float]] = []
    for criterion, spec in zip(criteria, specs, strict=True):
        if criterion.endswith("k1"):
            if "_" in spec:
                low_text, high_text = spec.split("_", 1)
                lower, upper = _positive(owner, option, low_text), _positive(owner, option, high_text)
            else:
                upper = _positive(owner, option, spec)
                lower = 1.0 / upper
            if lower > upper:
                single = "" if "_" in spec else " (one u stands for 1/u..u, so it needs u >= 1)"
                raise ValueError(f"{owner}: {option} for {criterion} needs lower <= upper{single}, got {spec!r}")
            out.append((lower, upper))
        else:
            if "_" in spec:
                raise ValueError(f"{owner}: {option} for {criterion} takes one upper bound (no '_'), got {spec!r}")
            out.append((None, _positive(owner, option, spec)))
    return tuple(out)


def _criteria(rollout_rs: str) -> tuple[str, ...]:
    """The distinct criteria of a comma-combined ``rollout_rs``, in order."""
    names: list[str] = []
    for name in (p.strip() for p in rollout_rs.split(",")):
        if not name:
            continue
        check_choice("rollout_rs", "rollout_rs", name, RS_CRITERIA)
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError(f"rollout_rs: rollout_rs must name at least one of {', '.join(RS_CRITERIA)}; got {rollout_rs!r}")
    return tuple(names)


# ------------------------------------------------------------------------------------------ IS weights
class RolloutCorrection(Correction, name="rollout_is"):
    r"""verl's rollout importance weights: truncated (TIS) or IcePop-masked, per token or per sequence.

    .. math::
        \rho_t = \exp\big(\mathrm{clip}(\log\pi_{old}(o_t) - \log\pi_{rollout}(o_t), \pm 20)\big), \qquad
        \rho_i = \exp\big(\mathrm{clip}(\textstyle\sum_t \log\pi_{old}(o_t) - \log\pi_{rollout}(o_t), \pm 20)\big)

    then ``min(rho, upper)`` (a number threshold) or ``rho * 1[lower <= rho <= upper]`` (``"lower_upper"``), and
    with ``rollout_is_batch_normalize`` divided by its mean (over the batch's counted tokens for "token", over
    its sequences with a counted token for "sequence"; skipped when the mean is <= 1e-8). The weight is detached
    and multiplies the per-token loss. In bypass mode :math:`\pi_{old}` is the current policy (detached).

    Args:
        rollout_is: None (off, default), "token" or "sequence".
        rollout_is_threshold: a number > 0 (truncation bound, default 2.0, verl's) or a string
            ``"lower_upper"`` with ``0 < lower <= upper`` (IcePop).
        rollout_is_batch_normalize: a bool (default False). The mean is the one the :class:`~rlzoo.Normalizer`'s
            ``is_weight_sum`` / ``num_is_weights`` give when it holds them (``Normalizer.from_batch(
            *micro_batches, loss=loss_fn)``: those batches'; the trainer: the whole generation batch's over every
            rank, verl's training batch, in the decoupled mode), else the batch's the loss is called with (bypass
            mode or ``prox_logp_method="loglinear"``, where the weights need the current policy and
            :class:`~rlzoo.losses.PolicyLoss` drops the normalizer's sums: per micro-batch, as verl's bypass mode).

    Metrics (verl's names, prefixed ``rollout_corr/``): ``rollout_is_mean`` (before batch normalisation),
    ``rollout_is_max``, ``rollout_is_min`` (of the applied weights per token; for "sequence" of the raw
    sequence weights of the sequences with a counted token, verl includes empty rows at 1),
    ``rollout_is_ratio_fraction_high`` / ``_low`` (raw weights above ``upper`` / below ``lower``, or
    ``1/upper`` for a truncation; per sequence for "sequence"), ``rollout_is_batch_norm_factor``.

    Raises:
        ValueError: on construction, naming the option: an unknown rollout_is level, an invalid threshold
            (see :func:`parse_is_threshold`), a non-bool rollout_is_batch_normalize.
        BatchError: when called with ``PolicyBatch.rollout_logprobs`` None while rollout_is is set.

    References:
        Matches verl 0.9.1 ``rollout_corr_helper.compute_rollout_correction_weights`` (``rollout_is``,
        ``rollout_is_threshold``, ``rollout_is_batch_normalize``), whose weights verl's policy losses multiply
        (``rollout_is_weights``); Yao et al. 2025 (TIS); Liu et al. 2025 "When Speed Kills Stability" (IcePop /
        masked IS).
    """

    example_options = MappingProxyType({"rollout_is": "token", "rollout_is_threshold": 2.0})
    rollout_is: str | None = None
    rollout_is_threshold: float | str = 2.0
    rollout_is_batch_normalize: bool = False

    def check(self) -> None:
        if self.rollout_is is not None:
            check_choice("rollout_is", "rollout_is", self.rollout_is, ("token", "sequence"))
        parse_is_threshold(self.rollout_is_threshold)
        if not isinstance(self.rollout_is_batch_normalize, bool):
            raise ValueError(f"rollout_is: rollout_is_batch_normalize must be a bool, got {self.rollout_is_batch_normalize!r}")

    @property
    def active(self) -> bool:
        return self.rollout_is is not None

    @property
    def sequence_level(self) -> bool:
        return self.rollout_is == "sequence"

    @property
    def normalizes_over_batch(self) -> bool:
        return self.active and self.rollout_is_batch_normalize

    def token_level_hint(self) -> str:
        return "use rollout_is='token'"

    def required_fields(self) -> frozenset[str]:
        return frozenset({"rollout_logprobs"}) if self.active else frozenset()

    def _weights(self, x: LossInputs) -> tuple[Float[Tensor, "B T"], Float[Tensor, "B T"]]:
        """``(raw, weight)``: the weights before and after the threshold, 0 at masked positions."""
        upper, lower = parse_is_threshold(self.rollout_is_threshold)
        log_ratio = x.sampler_log_ratio(f"rollout_is={self.rollout_is!r}")
        zero = torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)
        if self.rollout_is == "token":
            raw = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
        else:
            seq = x.seq_sum(log_ratio)  # [B, 1]
            raw = torch.exp(torch.clamp(seq, -SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
        raw = torch.where(x.mask, raw, zero)
        if lower is None:
            return raw, torch.clamp(raw, max=upper)
        return raw, torch.where((raw >= lower) & (raw <= upper), raw, zero)

    def _sums(self, x: LossInputs, weight: Float[Tensor, "B T"]) -> tuple[Float[Tensor, ""], Float[Tensor, ""]]:
        """``(sum, number)`` of the weights the batch normalisation averages: per counted token ("token"), per
        sequence with a counted token ("sequence"); in float32 at least (a bf16 count is inexact above 256)."""
        acc = torch.promote_types(weight.dtype, torch.float32)
        if self.rollout_is == "token":
            return torch.where(x.mask, weight, 0.0).to(acc).sum(), x.mask.sum().to(acc)
        rows = x.lengths > 0
        per_seq = x.seq_sum(weight.to(acc)) / x.lengths.clamp(min=1).to(acc).unsqueeze(-1)  # x.seq_mean, in acc
        return torch.where(rows, per_seq.squeeze(-1), 0.0).sum(), rows.sum().to(acc)

    def batch_sums(self, x: LossInputs) -> Float[Tensor, "2"] | None:
        if not self.normalizes_over_batch:
            return None
        return torch.stack(self._sums(x, self._weights(x)[1]))

    def __call__(self, x: LossInputs) -> PartOutput:
        upper, lower = parse_is_threshold(self.rollout_is_threshold)
        raw, weight = self._weights(x)
        rows = x.lengths > 0
        low_bound = 1.0 / upper if lower is None else lower
        metrics = {"rollout_corr/rollout_is_mean": masked_mean(weight, x.mask)}
        if self.rollout_is == "token":
            metrics["rollout_corr/rollout_is_max"] = masked_max(weight, x.mask)
            metrics["rollout_corr/rollout_is_min"] = masked_min(weight, x.mask)
            high = masked_mean((raw > upper).to(raw.dtype), x.mask)
            low = masked_mean((raw < low_bound).to(raw.dtype), x.mask)
        else:
            seq_weight = raw.amax(dim=-1, keepdim=True)  # the row's raw weight (raw >= 0, 0 at masked slots)
            row_mask = rows.unsqueeze(-1)
            metrics["rollout_corr/rollout_is_max"] = masked_max(seq_weight, row_mask)
            metrics["rollout_corr/rollout_is_min"] = masked_min(seq_weight, row_mask)
            high = masked_mean((seq_weight > upper).to(raw.dtype), row_mask)
            low = masked_mean((seq_weight < low_bound).to(raw.dtype), row_mask)
        metrics["rollout_corr/rollout_is_ratio_fraction_high"] = high
        metrics["rollout_corr/rollout_is_ratio_fraction_low"] = low
        if self.rollout_is_batch_normalize:
            n = x.normalizer  # the batch's sums (PolicyLoss drops them where the weights need the current policy)
            if n is not None and n.is_weight_sum is not None and n.num_is_weights is not None:
                total, number = (torch.as_tensor(v, device=weight.device) for v in (n.is_weight_sum, n.num_is_weights))
            else:  # this batch's
                total, number = self._sums(x, weight)
            mean = (total / number.clamp(min=1)).to(weight.dtype)
            factor = torch.where(mean > 1e-8, mean, torch.ones_like(mean))
            weight = weight / factor
            metrics["rollout_corr/rollout_is_batch_norm_factor"] = factor
        return PartOutput(weight.detach(), metrics)


# ------------------------------------------------------------------------------------------- rejection
class RolloutRejection(Rejection, name="rollout_rs"):
    r"""verl's rollout rejection sampling: drop tokens or whole sequences whose sampler/trainer divergence is
    out of bounds.

    With :math:`\ell_t = \mathrm{clip}(\log\pi_{old}(o_t) - \log\pi_{rollout}(o_t), \pm 20)` the per-token
    divergences are :math:`k_1 = -\ell_t`, :math:`k_2 = \ell_t^2/2`, :math:`k_3 = e^{\ell_t} - 1 - \ell_t`.
    ``token_k*`` judge each token; ``seq_sum_k*`` / ``seq_mean_k*`` / ``seq_max_k*`` the sum / mean / max over the
    sequence's counted tokens (a fully masked row: 0), keeping or dropping the whole sequence. A ``*_k1``
    criterion keeps :math:`\log(\mathrm{lower}) \le k_1 \le \log(\mathrm{upper})` (``seq_mean_k1`` is Geo-RS: the
    geometric mean ratio :math:`\pi_{rollout}/\pi_{old}` within ``[lower, upper]``); a k2 / k3 criterion keeps
    ``stat <= upper``. A token is kept when every criterion keeps it.

    Args:
        rollout_rs: None (off, default) or comma-separated criteria from ``RS_CRITERIA``: "token_k1",
            "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1", "seq_mean_k2",
            "seq_mean_k3", "seq_max_k2", "seq_max_k3" (duplicates ignored).
        rollout_rs_threshold: required with rollout_rs: one entry per criterion or one for all, comma-separated
            in a string (see :func:`parse_rs_thresholds`): ``"lower_upper"`` or ``u`` (= ``1/u .. u``) for
            k1, an upper bound for k2 / k3 (verl has no other lower bound).

    Metrics (``rollout_corr/``): ``rollout_rs_masked_fraction`` (counted tokens rejected),
    ``rollout_rs_seq_masked_fraction`` (sequences with a counted token that lost at least one),
    ``rollout_rs_<criterion>_masked_fraction`` per criterion.

    Raises:
        ValueError: on construction, naming the option: an unknown criterion (listing them), a missing or
            invalid threshold.
        BatchError: when called with ``PolicyBatch.rollout_logprobs`` None while rollout_rs is set.

    A sequence whose every token is rejected leaves the loss-level counts altogether (``Normalizer.from_batch``,
    a call without a normalizer), ``num_sequences`` included, as verl's ``agg_loss`` does when it counts the
    sequences itself. verl's engine-based trainer (``ray_trainer``, 0.9.1) passes ``global_batch_size`` = every
    row of the mini-batch instead, and so does ``rlzoo train`` (its ``num_sequences`` is every row): with a
    ``seq_*`` criterion and a ``seq-mean-*`` aggregation both divide by the rejected rows too (the token-mean
    aggregations agree either way).

    References:
        Matches verl 0.9.1 ``rollout_corr_helper.compute_rollout_rejection_mask`` (verl's mean divides by
        ``n + 1e-8``, here by ``n``: a decision can differ only for a statistic within 1e-8 relative of its
        bound); Liu et al. 2025, "When Speed Kills Stability" (sequence masking, Geo-RS).
    """

    example_options = MappingProxyType({"rollout_rs": "token_k1", "rollout_rs_threshold": "0.8_1.25"})
    rollout_rs: str | None = None
    rollout_rs_threshold: float | str | None = None

    def check(self) -> None:
        if self.rollout_rs is None:
            return
        if not isinstance(self.rollout_rs, str):
            raise ValueError(f"rollout_rs: rollout_rs must be a string of criteria, got {self.rollout_rs!r}")
        parse_rs_thresholds(_criteria(self.rollout_rs), self.rollout_rs_threshold)

    @property
    def active(self) -> bool:
        return self.rollout_rs is not None

    def required_fields(self) -> frozenset[str]:
        return frozenset({"rollout_logprobs"}) if self.active else frozenset()

    def criteria(self) -> tuple[tuple[str, float | None, float], ...]:
        """``(criterion, lower or None, upper)`` for each criterion, bounds as written (ratios for k1)."""
        assert self.rollout_rs is not None
        names = _criteria(self.rollout_rs)
        return tuple((n, lo, hi) for n, (lo, hi) in zip(names, parse_rs_thresholds(names, self.rollout_rs_threshold),
                                                         strict=True))

    def __call__(self, x: LossInputs) -> PartOutput:
        log_ratio = torch.clamp(x.sampler_log_ratio(f"rollout_rs={self.rollout_rs!r}"), -SAFETY_BOUND, SAFETY_BOUND)
        divergence = {"k1": -log_ratio, "k2": 0.5 * log_ratio.square(), "k3": torch.expm1(log_ratio) - log_ratio}
        lowest = torch.finfo(log_ratio.dtype).min
        keep = torch.ones_like(x.mask)
        metrics: dict[str, Tensor] = {}
        for criterion, lower, upper in self.criteria():
            level, estimator = criterion.rsplit("_", 1)
            stat = divergence[estimator]
            if level == "seq_sum":
                stat = x.seq_sum(stat)
            elif level == "seq_mean":
                stat = x.seq_mean(stat)
            elif level == "seq_max":
                top = torch.where(x.mask, stat, torch.full((), lowest, dtype=stat.dtype, device=stat.device))
                stat = torch.where(x.lengths.unsqueeze(-1) > 0, top.amax(dim=-1, keepdim=True), 0.0)
            if lower is None:
                ok = stat <= upper
            else:
                ok = (stat >= math.log(lower)) & (stat <= math.log(upper))
            ok = ok.expand_as(x.mask)
            keep = keep & ok
            metrics[f"rollout_corr/rollout_rs_{criterion}_masked_fraction"] = x.mean((~ok).to(log_ratio.dtype))
        rejected = (~keep) & x.mask
        rows = x.lengths > 0
        metrics["rollout_corr/rollout_rs_masked_fraction"] = x.mean(rejected.to(log_ratio.dtype))
        metrics["rollout_corr/rollout_rs_seq_masked_fraction"] = (
            rejected.any(dim=-1).to(log_ratio.dtype).sum() / rows.sum().clamp(min=1))
        return PartOutput(keep, metrics)
