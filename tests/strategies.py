"""Shared hypothesis strategies for the loss-zoo tests, and the independent reference math they compare with.

Strategies
----------
* :func:`masks` - ``Bool[B, T]`` completion masks: right-padded rows of any length (0 and 1 included),
  optionally with holes inside a completion (tool masks).
* :func:`policy_batches` - valid :class:`rlzoo.PolicyBatch` objects (log-probs <= 0, bool masks, advantages
  of both signs and exact zeros, optional fields on demand), with ``logprobs`` a leaf that requires grad.
* :func:`loss_options` - keyword options for the optional parts (KL, IS correction, OPSM, entropy bonus, verl's
  rollout correction).

Helpers
-------
* :func:`fresh` - the same batch with new leaf tensors (so each loss call gets its own gradient).
* :func:`with_garbage` - the same batch with NaN/inf/huge values at every masked position of every field.
* :func:`loss_and_grads` - run a loss on a fresh copy and return the output and the gradients.
* :func:`aggregation_weights` / :func:`aggregate` - the aggregations written as explicit per-token weights
  ``c[b, t]`` (``loss = sum c * l``), independent of ``rlzoo.losses.Aggregation``.
* :func:`kl_closed_form` - value and d/dlogp of every KL estimator, from Schulman's note.
* :func:`runtime_type_checker_off` - test the error path users see, without the jaxtyping checker.
* :func:`budget` - a fraction of the profile's max_examples, for tests repeated per preset.
* :func:`batch_options_for` - the :func:`policy_batches` flags a loss needs (its ``required_fields()``).
* :func:`example_field` - a valid value of an optional PolicyBatch field, for hand-built batches.

Values are drawn from a hypothesis-drawn seed (fast, reproducible); shapes, masks, scales and the
special cases (zero advantages, empty and single-token rows, per-token advantages) are drawn by hypothesis.
"""

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import jaxtyping
import torch
from hypothesis import settings
from hypothesis import strategies as st

import rlzoo
from rlzoo import Normalizer, PolicyBatch

__all__ = [
    "AGGREGATIONS",
    "GARBAGE",
    "IS_MODES",
    "KL_ESTIMATORS",
    "aggregate",
    "aggregation_weights",
    "batch_options_for",
    "budget",
    "example_field",
    "fresh",
    "kl_closed_form",
    "loss_and_grads",
    "loss_options",
    "masks",
    "policy_batches",
    "runtime_type_checker_off",
    "supported_options",
    "with_garbage",
]

AGGREGATIONS = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3", "abs", "k1+", "k3+", "low_var_kl", "low_var_kl+")
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
# rollout_rs criteria with thresholds that reject some, not all, of policy_batches' tokens
RS_EXAMPLES = (("token_k1", "0.7_1.4"), ("token_k2", "0.05"), ("token_k3", "0.05"), ("seq_sum_k1", "0.5_2.0"),
               ("seq_sum_k2", "0.2"), ("seq_sum_k3", "0.2"), ("seq_mean_k1", "0.85_1.15"), ("seq_mean_k2", "0.03"),
               ("seq_mean_k3", "0.03"), ("seq_max_k2", "0.1"), ("seq_max_k3", "0.1"))  # every verl rollout_rs level
# What padding may hold: anything.
GARBAGE = (math.nan, math.inf, -math.inf, 1e300, -1e300, 7.0, 0.0, -3.0)

_TENSOR_FIELDS = ("logprobs", "old_logprobs", "ref_logprobs", "rollout_logprobs", "entropies", "advantages", "rewards",
                  "teacher_logprobs")
# policy_batches flag -> the optional PolicyBatch field it adds
_FLAG_FIELDS = (("ref", "ref_logprobs"), ("rollout", "rollout_logprobs"), ("entropies", "entropies"),
                ("groups", "group_index"), ("rewards", "rewards"), ("versions", "versions"),
                ("teacher", "teacher_logprobs"))


def _maybe(draw: st.DrawFn, flag: bool | None) -> bool:
    return draw(st.booleans()) if flag is None else flag


@st.composite
def masks(
    draw: st.DrawFn,
    *,
    min_b: int = 1,
    max_b: int = 6,
    min_t: int = 1,
    max_t: int = 8,
    b: int | None = None,
    t: int | None = None,
    holes: bool | None = None,
    min_len: int = 0,
    equal_lengths: bool = False,
    min_counted: int = 0,
) -> torch.Tensor:
    """``Bool[B, T]``: row i counts its first ``len_i`` tokens (``min_len <= len_i <= T``), minus optional holes.

    Rows of length 0 (fully masked) and 1 are drawn often. ``equal_lengths`` gives every row the same length
    (and no holes). ``min_counted`` redraws until at least that many tokens count.
    """
    b = draw(st.integers(min_b, max_b)) if b is None else b
    t = draw(st.integers(max(min_t, min_len, 1), max(max_t, min_len, 1))) if t is None else t
    length = st.one_of(st.sampled_from(sorted({min_len, min(max(min_len, 1), t), t})), st.integers(min_len, t))
    if equal_lengths:
        lengths = [draw(length)] * b
    else:
        lengths = draw(st.lists(length, min_size=b, max_size=b))
    mask = torch.arange(t).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    if not equal_lengths and _maybe(draw, holes):
        drop = torch.tensor(draw(st.lists(st.booleans(), min_size=b * t, max_size=b * t))).view(b, t)
        # keep the first token of every non-empty row so that min_len still holds for rows of length <= 1
        drop[:, 0] = False
        if min_len > 1:
            drop[:] = False
        mask = mask & ~drop
    if int(mask.sum()) < min_counted:
        mask[:, : max(1, min_len)] = True
        if int(mask.sum()) < min_counted:
            mask[:] = True
    return mask


def _fill_garbage(x: torch.Tensor, where: torch.Tensor, seed: int) -> torch.Tensor:
    """``x`` with every position of ``where`` replaced by a value of :data:`GARBAGE` (cycled from ``seed``)."""
    pool = torch.tensor(GARBAGE, dtype=x.dtype)
    idx = (torch.arange(x.numel()) * 7 + seed) % len(GARBAGE)
    junk = pool[idx].view(x.shape)
    return torch.where(where, junk, x)


@st.composite
def policy_batches(
    draw: st.DrawFn,
    *,
    dtype: torch.dtype = torch.float64,
    min_b: int = 1,
    max_b: int = 6,
    min_t: int = 1,
    max_t: int = 8,
    b: int | None = None,
    t: int | None = None,
    mask: torch.Tensor | None = None,
    old: bool | str | None = None,
    ref: bool | None = None,
    rollout: bool | None = None,
    entropies: bool | None = None,
    per_token_advantages: bool | None = None,
    garbage_padding: bool = False,
    log_ratio_scale: float | None = None,
    holes: bool | None = None,
    min_len: int = 0,
    equal_lengths: bool = False,
    min_counted: int = 0,
    entropies_grad: bool = False,
    advantage_sign: int | None = None,
    certain_tokens: bool | None = None,
    groups: bool | None = None,
    rewards: bool | None = None,
    versions: bool | None = None,
    teacher: bool | None = False,
) -> PolicyBatch:
    """A valid :class:`rlzoo.PolicyBatch` with ``logprobs`` a leaf tensor requiring grad.

    Args:
        old: True (always), False (None: on-policy), ``"equal"`` (``logprobs.detach().clone()``), None (draw).
        ref, rollout, entropies, teacher: include that optional field (True / False / None = draw;
            ``teacher_logprobs`` is left out unless asked).
        per_token_advantages: ``Float[B, T]`` instead of ``Float[B]`` (None = draw).
        garbage_padding: fill every masked position of every field (and the advantages of fully masked rows)
            with NaN/inf/huge values.
        log_ratio_scale: std of ``logprobs - old_logprobs`` (None = drawn from 1e-3 .. 1).
        advantage_sign: +1 / -1 forces the sign of every advantage (0 excluded), None = any, zeros included.
        entropies_grad: make ``entropies`` a leaf that requires grad too.
        certain_tokens: some log-probs exactly 0 (probability 1; None = draw). These tie with each other, which
            matters for tests of top-k selections against an oracle with another tie order.
        groups: add ``group_index`` (groups of 1-3 rows, contiguous or shuffled; None = draw).
        rewards: add ``rewards`` (both signs and exact zeros; None = draw).
        versions: add ``versions`` (per sequence or per token, up to 4 versions stale, some negative) and
            ``current_version`` (None = draw).
        mask, b, t, holes, min_len, equal_lengths, min_counted: see :func:`masks`.
    """
    if mask is None:
        mask = draw(masks(min_b=min_b, max_b=max_b, min_t=min_t, max_t=max_t, b=b, t=t, holes=holes,
                          min_len=min_len, equal_lengths=equal_lengths, min_counted=min_counted))
    b, t = mask.shape
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    lp_scale = draw(st.sampled_from((0.05, 0.5, 2.0)))
    logprobs = -torch.empty(b, t, dtype=torch.float64).exponential_(1.0, generator=g) * lp_scale
    if _maybe(draw, certain_tokens):  # some tokens with probability exactly 1
        logprobs = torch.where(torch.rand(b, t, generator=g, dtype=torch.float64) < 0.15, 0.0, logprobs)
    scale = draw(st.sampled_from((1e-3, 0.05, 0.3, 1.0))) if log_ratio_scale is None else log_ratio_scale

    old_mode = draw(st.sampled_from((True, False, "equal"))) if old is None else old
    old_lp = None
    if old_mode == "equal":
        old_lp = logprobs.clone()
    elif old_mode:
        old_lp = torch.clamp(logprobs + scale * randn(b, t), max=0.0)
    ref_lp = torch.clamp(logprobs + 0.3 * randn(b, t), max=0.0) if _maybe(draw, ref) else None
    anchor = logprobs if old_lp is None else old_lp
    rollout_lp = torch.clamp(anchor + 0.2 * randn(b, t), max=0.0) if _maybe(draw, rollout) else None
    ent = torch.empty(b, t, dtype=torch.float64).exponential_(0.5, generator=g) if _maybe(draw, entropies) else None
    teacher_lp = torch.clamp(logprobs + 0.5 * randn(b, t), max=0.0) if _maybe(draw, teacher) else None

    per_token = _maybe(draw, per_token_advantages)
    adv_scale = draw(st.sampled_from((0.1, 1.0, 3.0)))
    adv = randn(b, t) if per_token else randn(b)
    adv = adv * adv_scale
    if advantage_sign is None:
        zero_rate = draw(st.sampled_from((0.0, 0.25)))
        adv = torch.where(torch.rand(adv.shape, generator=g, dtype=torch.float64) < zero_rate, 0.0, adv)
    else:
        adv = advantage_sign * (adv.abs() + 0.05)

    reward = None
    if _maybe(draw, rewards):
        reward = torch.where(torch.rand(b, generator=g, dtype=torch.float64) < 0.3, 0.0, randn(b))
    extra: dict[str, Any] = {}
    if _maybe(draw, groups):
        size = draw(st.integers(1, 3), label="group size")
        index = torch.arange(b) // size
        if draw(st.booleans(), label="shuffled groups"):
            index = index[torch.randperm(b, generator=g)]
        extra["group_index"] = index
    if _maybe(draw, versions):
        current = draw(st.integers(1, 6), label="current_version")
        shape = (b, t) if draw(st.booleans(), label="token versions") else (b,)
        extra["versions"] = torch.randint(-1, current + 1, shape, generator=g)
        extra["current_version"] = current

    fields: dict[str, Any] = {
        "logprobs": logprobs,
        "old_logprobs": old_lp,
        "ref_logprobs": ref_lp,
        "rollout_logprobs": rollout_lp,
        "entropies": ent,
        "advantages": adv,
        "rewards": reward,
        "teacher_logprobs": teacher_lp,
    }
    fields = {k: (None if v is None else v.to(dtype)) for k, v in fields.items()}
    if garbage_padding:
        for i, name in enumerate(_TENSOR_FIELDS):
            v = fields[name]
            if v is None:
                continue
            where = ~mask if v.ndim == 2 else ~mask.any(dim=-1)
            fields[name] = _fill_garbage(v, where, seed + i)
    fields["logprobs"] = fields["logprobs"].requires_grad_(True)
    if entropies_grad and fields["entropies"] is not None:
        fields["entropies"] = fields["entropies"].requires_grad_(True)
    return PolicyBatch(completion_mask=mask, **fields, **extra)


def batch_options_for(loss: Any) -> dict[str, Any]:
    """:func:`policy_batches` flags for a loss: its ``required_fields()`` on (the others drawn), and no
    ``old_logprobs`` when the loss derives them itself (bypass mode, the log-linear proximal policy)."""
    need = loss.required_fields()
    out: dict[str, Any] = {flag: True for flag, field in _FLAG_FIELDS if field in need}
    if loss.bypass_mode or loss.prox_logp_method != "recompute":
        out["old"] = False
    return out


def example_field(name: str, b: int, t: int, *, dtype: torch.dtype = torch.float64, seed: int = 0) -> Any:
    """A valid value of the optional PolicyBatch field ``name`` for a ``[b, t]`` batch (hand-built tests)."""
    g = torch.Generator().manual_seed(seed)
    if name in ("old_logprobs", "ref_logprobs", "rollout_logprobs", "teacher_logprobs"):
        return -torch.rand(b, t, generator=g, dtype=torch.float64).to(dtype) - 0.01
    if name == "entropies":
        return torch.rand(b, t, generator=g, dtype=torch.float64).to(dtype)
    if name == "group_index":
        return torch.arange(b) // 2
    if name == "rewards":
        return torch.tensor([1.0, 0.0] * b, dtype=dtype)[:b]
    if name == "versions":
        return torch.full((b,), 1, dtype=torch.long)
    if name == "current_version":
        return 3
    raise AssertionError(f"no example for PolicyBatch.{name}")


def budget(fraction: float) -> settings:
    """Hypothesis settings with ``fraction`` of the loaded profile's ``max_examples`` (at least 1).

    Zoo-wide tests run one property per preset (19+ presets), so they take a fraction of the budget; the
    ``thorough`` profile (``HYPOTHESIS_PROFILE=thorough``) scales them up with everything else.
    """
    return settings(max_examples=max(1, round(settings().max_examples * fraction)))


@contextlib.contextmanager
def runtime_type_checker_off() -> Iterator[None]:
    """Turn off the jaxtyping + beartype checker that pytest installs on rlzoo (pyproject ``addopts``).

    Under the checker a mistyped argument raises ``jaxtyping.TypeCheckError`` in the generated ``__init__``
    before rlzoo's own validation runs; users run without it, so error-contract tests (BatchError /
    ValueError naming the field) turn it off.
    """
    previous = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", previous)


def fresh(batch: PolicyBatch, **changes: Any) -> PolicyBatch:
    """A copy of ``batch`` with new leaf ``logprobs`` (and ``entropies`` if they required grad), plus ``changes``."""
    fields = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    fields.update(changes)
    if "logprobs" not in changes:
        fields["logprobs"] = batch.logprobs.detach().clone().requires_grad_(True)
    ent = fields["entropies"]
    if "entropies" not in changes and ent is not None and ent.requires_grad:
        fields["entropies"] = ent.detach().clone().requires_grad_(True)
    return PolicyBatch(**fields)


def with_garbage(batch: PolicyBatch, seed: int = 0) -> PolicyBatch:
    """``batch`` with NaN/inf/huge values at every masked position of every tensor field.

    Counted positions keep their values; ``advantages`` and ``rewards`` of shape ``[B]`` get garbage on fully
    masked rows, ``group_index`` any id there, ``versions`` huge values at masked positions.
    """
    mask = batch.completion_mask
    changes: dict[str, Any] = {}
    for i, name in enumerate(_TENSOR_FIELDS):
        v = getattr(batch, name)
        if v is None:
            continue
        where = ~mask if v.ndim == 2 else ~mask.any(dim=-1)
        new = _fill_garbage(v.detach(), where, seed + i)
        if v.requires_grad:
            new = new.requires_grad_(True)
        changes[name] = new
    rows = mask.any(dim=-1)
    if batch.group_index is not None:  # any id for a fully masked row (negative, huge)
        junk = torch.where(torch.arange(rows.numel()) % 2 == 0, -7, 10**6)
        changes["group_index"] = torch.where(rows, batch.group_index, junk)
    if batch.versions is not None:
        where = ~mask if batch.versions.ndim == 2 else ~rows
        changes["versions"] = torch.where(where, 10**6 + seed, batch.versions)
    fields = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    fields.update(changes)
    return PolicyBatch(**fields)


def loss_and_grads(
    loss_fn: Any, batch: PolicyBatch, normalizer: Normalizer | None = None, *, seed: int = 0
) -> tuple[rlzoo.LossOutput, torch.Tensor, torch.Tensor | None]:
    """``(out, d loss / d logprobs, d loss / d entropies or None)`` on a fresh copy of ``batch``.

    ``torch.manual_seed(seed)`` is set first, so randomised parts (clip_cov) draw the same subset each call.
    """
    batch = fresh(batch)
    torch.manual_seed(seed)
    out = loss_fn(batch, normalizer=normalizer)
    inputs = [batch.logprobs]
    ent = batch.entropies if batch.entropies is not None and batch.entropies.requires_grad else None
    if ent is not None:
        inputs.append(ent)
    grads = torch.autograd.grad(out.loss, inputs, allow_unused=True)
    g_lp = torch.zeros_like(batch.logprobs) if grads[0] is None else grads[0]
    g_ent = None
    if ent is not None:
        g_ent = torch.zeros_like(ent) if grads[1] is None else grads[1]
    return out, g_lp, g_ent


def aggregation_weights(
    mask: torch.Tensor,
    aggregation: str,
    *,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
    max_completion_length: int | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Per-token weights ``c[b, t]`` with ``aggregation(l) == sum_bt c[b, t] * l[b, t]`` (0 at masked positions).

    With ``n_i`` the counted tokens of row i, ``N`` (``num_tokens``, default ``sum n_i``) and ``S``
    (``num_sequences``, default the rows with ``n_i > 0``), both clamped to >= 1, and ``L`` the
    ``max_completion_length``::

        token-mean               c = 1 / N
        token-sum                c = 1
        seq-mean-token-mean      c = 1 / (S n_i)
        seq-mean-token-sum       c = 1 / S
        seq-mean-token-sum-norm  c = 1 / (S L)
    """
    m = mask.to(dtype)
    n_i = m.sum(-1, keepdim=True)
    n = float(m.sum()) if num_tokens is None else float(num_tokens)
    s = float((n_i > 0).sum()) if num_sequences is None else float(num_sequences)
    n, s = max(n, 1.0), max(s, 1.0)
    if aggregation == "token-mean":
        c = m / n
    elif aggregation == "token-sum":
        c = m
    elif aggregation == "seq-mean-token-mean":
        c = m / (s * n_i.clamp(min=1.0))
    elif aggregation == "seq-mean-token-sum":
        c = m / s
    elif aggregation == "seq-mean-token-sum-norm":
        assert max_completion_length is not None
        c = m / (s * max_completion_length)
    else:
        raise AssertionError(f"unknown aggregation {aggregation!r}")
    return c


def aggregate(values: torch.Tensor, mask: torch.Tensor, aggregation: str, **kw: Any) -> torch.Tensor:
    """``sum_bt c[b, t] * values[b, t]`` over counted positions (masked values are never read)."""
    c = aggregation_weights(mask, aggregation, dtype=values.dtype, **kw)
    return (c * torch.where(mask, values, torch.zeros((), dtype=values.dtype))).sum()


def kl_closed_form(logp: torch.Tensor, ref: torch.Tensor, estimator: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(value, d value / d logp)`` of a per-token KL estimator, with ``d = logp - ref`` (Schulman's note).

    k1 = d (grad 1); k2 = d^2 / 2 (grad d); k3 = e^-d + d - 1 (grad 1 - e^-d); abs = |d| (grad sgn d);
    k1+ / k3+ = value of k1 / k3, gradient of k2 (d); low_var_kl = k3 of clamp(-d, -20, 20), clamped to
    [-10, 10] (verl's; grad 1 - e^-d where neither clamp binds, else 0); low_var_kl+ = its value, k2's gradient.
    """
    d = logp - ref
    k1, k2, k3 = d, 0.5 * d * d, torch.exp(-d) + d - 1.0
    u = torch.clamp(-d, -20.0, 20.0)
    raw = torch.exp(u) - u - 1.0
    low_var = torch.clamp(raw, -10.0, 10.0)
    free = ((-d).abs() <= 20.0) & (raw <= 10.0)
    table = {
        "low_var_kl": (low_var, torch.where(free, 1.0 - torch.exp(-d), torch.zeros_like(d))),
        "low_var_kl+": (low_var, d),
        "k1": (k1, torch.ones_like(d)),
        "k2": (k2, d),
        "k3": (k3, 1.0 - torch.exp(-d)),
        "abs": (d.abs(), torch.sign(d)),
        "k1+": (k1, d),
        "k3+": (k3, d),
    }
    return table[estimator]


def supported_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with a sequence-level IS mode replaced by its token-level twin when preset ``name``'s surrogate
    only takes token-level IS weights (``sequence_is_weight`` False: VESPO folds token IS weights into its
    sequence weight, as TRL requires)."""
    mode = options.get("is_correction")
    if mode is not None and not rlzoo.get_loss(name).surrogate.sequence_is_weight:
        options = {**options, "is_correction": mode.replace("sequence", "token")}
    return options


@st.composite
def loss_options(
    draw: st.DrawFn,
    *,
    kl: bool | None = None,
    is_correction: bool | None = None,
    off_policy_mask: bool | None = None,
    entropy_bonus: bool | None = None,
    rollout_rs: bool | None = False,
) -> dict[str, Any]:
    """Keyword options that add the optional (not batch-coupled) parts: KL, IS correction, OPSM, entropy bonus,
    verl's rollout rejection (``rollout_rs``, off unless asked).

    The batch then needs ``ref_logprobs`` (KL), ``rollout_logprobs`` (IS, rejection) and ``entropies`` (bonus).
    """
    opts: dict[str, Any] = {}
    if _maybe(draw, rollout_rs):
        criteria = draw(st.lists(st.sampled_from(RS_EXAMPLES), min_size=1, max_size=2, unique=True))
        opts["rollout_rs"] = ",".join(name for name, _ in criteria)
        opts["rollout_rs_threshold"] = ",".join(spec for _, spec in criteria)
    if _maybe(draw, kl):
        opts["beta"] = draw(st.sampled_from((0.04, 0.5)))
        opts["kl_estimator"] = draw(st.sampled_from(KL_ESTIMATORS))
    if _maybe(draw, is_correction):
        mode = draw(st.sampled_from(IS_MODES))
        opts["is_correction"] = mode
        lo = draw(st.sampled_from((None, 0.5, 0.9)))
        hi = draw(st.sampled_from((1.1, 2.0, 3.0) if lo is not None or mode.endswith("truncate") else (None, 1.1, 2.0)))
        opts["is_min"], opts["is_max"] = lo, hi
    if _maybe(draw, off_policy_mask):
        opts["off_policy_mask_threshold"] = draw(st.sampled_from((0.0, 0.05, 0.5)))
    if _maybe(draw, entropy_bonus):
        opts["entropy_coef"] = draw(st.sampled_from((0.01, -0.3)))
    return opts
