"""The scorer: per-token log-probs (and entropies) of completions under the policy or the reference model.

Notation: ``Np`` unique prompts, ``P`` padded prompt length (left padded), ``N = Np * G`` completions,
``C`` padded completion length (right padded), ``H`` hidden size, ``V`` vocabulary.

The log-probs of a completion are computed from the model body's hidden states at the positions that
predict each completion token, then ``rlzoo.kernels.fused_linear_logprobs`` with the lm_head weight (no
``[N, C, V]`` logits). With ``share_prefix``, each prompt is run once and its KV cache is indexed out to
its ``G`` completions: the same computation as running every (prompt, completion) pair, with the prompt's
forward and backward done once per group.
"""

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from einops import rearrange
from jaxtyping import Bool, Float, Int
from torch import Tensor

from rlzoo.batch import PolicyBatch
from rlzoo.trainer.adapters import causal_lm, scoring_model
from rlzoo.trainer.config import ScorerConfig
from rlzoo.trainer.models import kv_cache_keyword, kv_cache_of
from rlzoo.trainer.precision import Precision
from rlzoo.trainer.rollout import Rollout, position_ids_for

__all__ = ["LogProbModule", "Scorer", "completion_logprobs", "enable_activation_checkpointing", "model_logits"]


def _hidden_states(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    group_index: Tensor,
    completion_ids: Tensor,
    share_prefix: bool,
) -> Tensor:
    """``[N, C, H]`` final hidden states at the positions that predict each completion token."""
    body = causal_lm(model).base_model  # the transformer body (under a PEFT wrapper too: its adapters are in place)
    p = prompt_ids.shape[1]
    full = _full_sequence_inputs(prompt_ids, prompt_mask, group_index, completion_ids)
    if not share_prefix:
        return body(**full, use_cache=False).last_hidden_state[:, p - 1:]
    out = body(input_ids=prompt_ids, attention_mask=prompt_mask.long(), position_ids=position_ids_for(prompt_mask),
               use_cache=True)
    cache = kv_cache_of(out)
    cache.batch_select_indices(group_index)
    last = out.last_hidden_state[:, -1][group_index]
    if completion_ids.shape[1] == 1:
        return last[:, None]
    cont = body(input_ids=full["input_ids"][:, p:], attention_mask=full["attention_mask"],
                position_ids=full["position_ids"][:, p:], use_cache=True, **{kv_cache_keyword(body): cache})
    return torch.cat([last[:, None], cont.last_hidden_state], dim=1)


def _full_sequence_inputs(prompt_ids: Tensor, prompt_mask: Tensor, group_index: Tensor,
                          completion_ids: Tensor) -> dict[str, Tensor]:
    """Model inputs of every row's prompt + completion (all but its last token), with generate's positions."""
    prompt_pos = position_ids_for(prompt_mask)
    c = completion_ids.shape[1]
    completion_pos = prompt_mask.sum(-1)[group_index, None] + torch.arange(c, device=completion_ids.device)[None, :]
    ids = torch.cat([prompt_ids[group_index], completion_ids[:, :-1]], dim=1)
    mask = torch.cat([prompt_mask[group_index], torch.ones_like(completion_ids[:, :-1], dtype=torch.bool)], dim=1)
    pos = torch.cat([prompt_pos[group_index], completion_pos[:, :-1]], dim=1)
    return {"input_ids": ids, "attention_mask": mask.long(), "position_ids": pos}


def model_logits(
    model: torch.nn.Module,
    prompt_ids: Int[Tensor, "Np P"],
    prompt_mask: Bool[Tensor, "Np P"],
    group_index: Int[Tensor, " N"],
    completion_ids: Int[Tensor, "N C"],
) -> Float[Tensor, "N C V"]:
    """The model's own ``logits`` (its full forward, whatever its head does) at the positions that predict
    each completion token: the path for heads ``rlzoo.kernels.lm_head_spec`` does not know, and the
    independent reference of the tests. Holds ``[N, C, V]`` logits (unnormalised, the model's dtype).

    Args: as :func:`completion_logprobs` (positions follow ``generate``: left-padded prompts count from 0).

    Raises:
        whatever the model's forward raises (e.g. a sequence longer than its maximum positions).

    Source: ``model(input_ids, attention_mask, position_ids).logits`` sliced as TRL 1.16's
    ``_get_per_token_logps_and_entropies`` slices it (the logit at position t predicts token t + 1).
    """
    inputs = _full_sequence_inputs(prompt_ids, prompt_mask, group_index, completion_ids)
    return model(**inputs, use_cache=False, logits_to_keep=completion_ids.shape[1]).logits


def completion_logprobs(
    model: torch.nn.Module,
    *,
    prompt_ids: Int[Tensor, "Np P"],
    prompt_mask: Bool[Tensor, "Np P"],
    group_index: Int[Tensor, " N"],
    completion_ids: Int[Tensor, "N C"],
    completion_mask: Bool[Tensor, "N C"],
    temperature: float = 1.0,
    share_prefix: bool = True,
    fused: bool = True,
    with_entropy: bool = False,
    with_sum_pi_squared: bool = False,
) -> (tuple[Float[Tensor, "N C"], Float[Tensor, "N C"] | None]
      | tuple[Float[Tensor, "N C"], Float[Tensor, "N C"] | None, Float[Tensor, "N C"]]):
    """Per-token log-probs (and entropies) of the completion tokens under ``model``, temperature-scaled.

    Only positions where ``completion_mask`` is True are scored; the others hold 0. Gradients flow to the
    model when grad mode is on.

    Args:
        model: a Hugging Face causal LM, or a PEFT model wrapping one (the body of
            :func:`~rlzoo.trainer.adapters.causal_lm` gives final hidden states; its lm_head is read by
            ``rlzoo.kernels.lm_head_spec``).
        prompt_ids, prompt_mask: ``[Np, P]`` left-padded unique prompts and their attention mask.
        group_index: ``[N]`` the prompt row (in ``[0, Np)``) of each completion.
        completion_ids, completion_mask: ``[N, C]`` right-padded completion tokens and the counted ones.
        temperature: > 0; logits are divided by it (the sampling distribution's log-probs, as TRL).
        share_prefix: run each prompt once and reuse its KV cache for its completions (exact).
        fused: log-probs through ``fused_linear_logprobs`` (chunked, no [M, V] logits); False: plain logits
            from the final hidden states and the lm_head. A model whose logit transform
            ``rlzoo.kernels.lm_head_spec`` does not know is scored through its own forward
            (:func:`model_logits`, no prefix sharing) either way.
        with_entropy: also return the per-token entropy (nats) of the temperature-scaled distribution.
        with_sum_pi_squared: also return ``sum_v pi(v)^2`` of the temperature-scaled distribution (``[1/V, 1]``,
            no gradient; ``return_sum_pi_squared`` of ``rlzoo.kernels``, for the optimal token baseline).

    Returns:
        ``(logprobs, entropies)``, each ``Float[N, C]`` in nats (entropies None unless asked), and with
        ``with_sum_pi_squared`` a third ``Float[N, C]``: ``(logprobs, entropies, sum_pi_squared)``.

    Source: the per-token log-probs of TRL 1.16's ``GRPOTrainer._get_per_token_logps_and_entropies``
    (logits divided by the temperature, then ``log_softmax`` and gather), computed without the ``[N, C, V]``
    logits.
    """
    from rlzoo.kernels import (
        fused_linear_logprobs,
        lm_head_spec,
        logprobs_and_entropy_from_logits,
        logprobs_from_logits,
    )

    flat_index = rearrange(completion_mask, "n c -> (n c)").nonzero().squeeze(-1)
    targets = rearrange(completion_ids, "n c -> (n c)").index_select(0, flat_index)
    try:
        spec = lm_head_spec(causal_lm(model))
    except NotImplementedError:  # a logit transform rlzoo's kernels do not know: the model's own forward
        spec = None
    if spec is None:
        logits = model_logits(model, prompt_ids, prompt_mask, group_index, completion_ids)
        logits = rearrange(logits, "n c v -> (n c) v").index_select(0, flat_index)
    else:
        hidden = _hidden_states(model, prompt_ids, prompt_mask, group_index, completion_ids, share_prefix)
        h = rearrange(hidden, "n c h -> (n c) h").index_select(0, flat_index)  # counted positions only
        if fused:
            stats = fused_linear_logprobs(h, **spec, token_ids=targets, temperature=temperature,
                                          return_entropy=with_entropy, return_sum_pi_squared=with_sum_pi_squared)
        else:
            logits = spec.logits(h)
    if spec is None or not fused:
        if with_entropy or with_sum_pi_squared:
            stats = logprobs_and_entropy_from_logits(logits, targets, temperature=temperature,
                                                     return_sum_pi_squared=with_sum_pi_squared)
        else:
            stats = (logprobs_from_logits(logits, targets, temperature=temperature), None)
    lp, ent = stats[0], (stats[1] if with_entropy else None)
    shape = completion_ids.shape

    def scatter(x: Tensor) -> Tensor:
        full = torch.zeros(shape[0] * shape[1], dtype=torch.float32 if x.dtype != torch.float64 else x.dtype,
                           device=x.device)
        return full.index_copy(0, flat_index, x.to(full.dtype)).view(shape)

    if with_sum_pi_squared:
        return scatter(lp), (scatter(ent) if ent is not None else None), scatter(stats.sum_pi_squared)
    return scatter(lp), (scatter(ent) if ent is not None else None)



def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Turn on transformers' activation (gradient) checkpointing, non-reentrant, and zero every dropout.

    transformers checkpoints a layer only in train mode, so :class:`Scorer` switches the model to train mode
    for the differentiated forward pass; dropout must then be zero for the log-probs to equal the eval-mode
    ones (ratio exactly 1 on the first iteration). TRL does the same with ``disable_dropout``; attention
    dropout rates held as module attributes (``attention_dropout``) are zeroed too.
    """
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:  # transformers < 5.2x
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


class LogProbModule(torch.nn.Module):
    """:func:`completion_logprobs` as a module, so that DDP and FSDP2 can wrap it as their root: its forward is the
    whole differentiated computation (prefix, continuation, fused log-probs from the lm_head weight), so the
    wrappers' hooks see every parameter it uses.

    Args:
        model: the causal LM (``self.model``).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, prompt_ids: Tensor, prompt_mask: Tensor, group_index: Tensor, completion_ids: Tensor,
                completion_mask: Tensor, *, temperature: float, share_prefix: bool, fused: bool,
                with_entropy: bool, with_sum_pi_squared: bool = False) -> tuple[Tensor | None, ...]:
        """See :func:`completion_logprobs`. The outputs are fresh tensors, not views (FSDP2 hooks its backward on
        a module's outputs, and in-place ops on a view would bypass the hook)."""
        out = completion_logprobs(
            self.model, prompt_ids=prompt_ids, prompt_mask=prompt_mask, group_index=group_index,
            completion_ids=completion_ids, completion_mask=completion_mask, temperature=temperature,
            share_prefix=share_prefix, fused=fused, with_entropy=with_entropy,
            **({"with_sum_pi_squared": True} if with_sum_pi_squared else {}))
        return tuple(x.clone() if x is not None else None for x in out)


class Scorer:
    """Log-probs and entropies of a rollout's completions: with gradients for the loss, without for old and
    reference log-probs.

    The models are given as :class:`LogProbModule` s (possibly wrapped by DDP or FSDP2).

    Args:
        config: the scorer section (backend, entropy logging).
        precision: device and autocast of the forward passes.
        temperature: > 0; the sampling temperature (logits are divided by it, as TRL).
        micro_batch_size: completions per forward pass when scoring a whole generation batch without
            gradients (the run's ``per_device_train_batch_size``).
        gradient_checkpointing: the model checkpoints activations (it is put in train mode for the
            differentiated forward).
        share_prefix: run each prompt once per group (``share_prompt_prefix``, off under gradient checkpointing,
            whose recomputation does not cover the KV cache, and under FSDP, whose collectives need the same
            forward calls on every rank).
        with_entropy: the loss needs entropies (they are computed anyway when ``config.log_entropy``).
    """

    def __init__(self, config: ScorerConfig, *, precision: Precision, temperature: float, micro_batch_size: int,
                 gradient_checkpointing: bool, share_prefix: bool, with_entropy: bool) -> None:
        self.config = config
        self.precision = precision
        self.temperature = temperature
        self.micro_batch_size = micro_batch_size
        self.gradient_checkpointing = gradient_checkpointing
        self.share_prefix = share_prefix
        self.with_entropy = with_entropy or config.log_entropy

    def logprobs(self, module: torch.nn.Module, rollout: Rollout, *, with_entropy: bool = False,
                 with_sum_pi_squared: bool = False) -> tuple[Float[Tensor, "N C"] | None, ...]:
        """:func:`completion_logprobs` of every completion of ``rollout`` through ``module`` (a
        :class:`LogProbModule`, possibly wrapped), with gradients as the grad mode says; ``(logprobs, entropies
        or None)``, and ``sum_pi_squared`` third when asked."""
        extra = {"with_sum_pi_squared": True} if with_sum_pi_squared else {}
        return module(rollout.prompt_ids, rollout.prompt_mask, rollout.group_index, rollout.completion_ids,
                      rollout.completion_mask, temperature=self.temperature, share_prefix=self.share_prefix,
                      fused=self.config.logprobs_backend == "fused", with_entropy=with_entropy, **extra)

    def policy_batch(self, module: torch.nn.Module, micro_batch: Rollout, loss_mask: Bool[Tensor, "N C"],
                     **fields: Any) -> PolicyBatch:
        """The :class:`~rlzoo.PolicyBatch` of one micro-batch: the policy's log-probs with gradients (and
        entropies), the micro-batch's advantages and stored log-probs, ``loss_mask`` as completion mask, and
        ``fields`` (``group_index``, ``rewards``, ``versions``, ``current_version``: :meth:`OptimizerStepBatch.loss_fields`)."""
        with self.precision.autocast(), self._training_mode(module):
            logprobs, entropies = self.logprobs(module, micro_batch, with_entropy=self.with_entropy)
        return PolicyBatch(
            logprobs=logprobs, advantages=micro_batch.advantages, completion_mask=loss_mask,
            old_logprobs=micro_batch.old_logprobs, ref_logprobs=micro_batch.ref_logprobs,
            rollout_logprobs=micro_batch.rollout_logprobs, entropies=entropies,
            teacher_logprobs=micro_batch.teacher_logprobs, **fields,
        )

    @torch.no_grad()
    def generation_logprobs(self, module: Any, rollout: Rollout) -> Float[Tensor, "N C"]:
        """Log-probs of a whole generation batch without gradients (old or reference log-probs), one
        micro-batch at a time, padded to the rollout's width. ``module``: a :class:`LogProbModule` (possibly
        wrapped), or an :class:`~rlzoo.trainer.adapters.AdapterDisabled` reference (scored with the adapter off)."""
        return self._generation_scores(module, rollout, with_sum_pi_squared=False)[0]

    @torch.no_grad()
    def generation_stats(self, module: Any, rollout: Rollout) -> tuple[Float[Tensor, "N C"], Float[Tensor, "N C"]]:
        """As :meth:`generation_logprobs`, with ``sum_pi_squared`` of the same distribution from the same pass
        (the fused kernel's ``return_sum_pi_squared``): ``(logprobs, sum_pi_squared)``, 0 at masked positions."""
        logprobs, sum_pi_squared = self._generation_scores(module, rollout, with_sum_pi_squared=True)
        return logprobs, sum_pi_squared

    def _generation_scores(self, module: Any, rollout: Rollout, *, with_sum_pi_squared: bool) -> list[Tensor]:
        size, n = self.micro_batch_size, rollout.num_completions
        with self.precision.autocast(), scoring_model(module) as scored:
            parts = [self.logprobs(scored, rollout.select(torch.arange(i, min(i + size, n))),
                                   with_sum_pi_squared=with_sum_pi_squared) for i in range(0, n, size)]
        width = rollout.completion_ids.shape[1]
        keep = (0, 2) if with_sum_pi_squared else (0,)
        return [torch.cat([torch.nn.functional.pad(p[k], (0, width - p[k].shape[1])) for p in parts]) for k in keep]

    @contextlib.contextmanager
    def _training_mode(self, module: torch.nn.Module) -> Iterator[None]:
        """With gradient checkpointing, train mode for the differentiated forward (transformers only
        checkpoints in train mode; dropout was zeroed by :func:`enable_activation_checkpointing`)."""
        if not self.gradient_checkpointing:
            yield
            return
        module.train()
        try:
            yield
        finally:
            module.eval()
