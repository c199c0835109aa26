"""Read a Hugging Face causal LM's output head: weight (tied or not), bias, logit scale and soft-cap.

``fused_linear_logprobs(hidden, token_ids=token_ids, **lm_head_spec(model))`` then scores tokens exactly as
``model(...).logits`` would (up to float rounding), for the model families whose logit transform is
known here; any other family that declares a logit-transform config field raises, so the caller falls
back to the plain logits path instead of silently computing the wrong distribution.
:func:`verify_lm_head_spec` checks a spec against the model's own forward on a few tokens.
"""

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from rlzoo.kernels._common import TokenLogProbs, TokenLogProbStats
from rlzoo.kernels.fused import fused_linear_logprobs
from rlzoo.kernels.logits import logprobs_and_entropy_from_logits, logprobs_from_logits

__all__ = ["LMHeadSpec", "causal_lm_logprobs", "lm_head_spec", "verify_lm_head_spec"]

# model_type -> how the logits are scaled after lm_head (transformers 4.56 - 5.x modeling code).
_MULTIPLY_BY_LOGIT_SCALE = ("cohere", "cohere2", "cohere2_moe")  # logits * config.logit_scale
_DIVIDE_BY_LOGITS_SCALING = ("granite", "granitemoe", "granitemoeshared", "granitemoehybrid", "granitemoe_swa")
# Config fields that, on a model family not listed above, mean an unknown logit transform.
_TRANSFORM_FIELDS = ("logit_scale", "logits_scaling", "output_multiplier", "lm_head_multiplier",
                     "dim_model_base", "mup_width_multiplier")


@dataclasses.dataclass(frozen=True, eq=False)
class LMHeadSpec(Mapping[str, Any]):
    """The output head of a causal LM, as keyword arguments of :func:`~rlzoo.kernels.fused_linear_logprobs`.

    A read-only mapping, so ``fused_linear_logprobs(hidden, token_ids=ids, **spec)`` works.

    Attributes:
        weight: ``Float[V, H]``, the output embedding weight (the same Parameter as the input
            embeddings when tied; gradients reach it either way).
        bias: ``Float[V]`` or None.
        logit_scale: multiplier of the logits, or None (= 1).
        logit_softcap: final-logit soft-cap ``c`` (``z = c tanh(z / c)``), or None.
    """

    weight: Float[Tensor, "V H"]
    bias: Float[Tensor, " V"] | None = None
    logit_scale: float | None = None
    logit_softcap: float | None = None

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    @staticmethod
    def _keys() -> tuple[str, ...]:
        return ("weight", "bias", "logit_scale", "logit_softcap")

    def logits(self, hidden: Float[Tensor, "*batch H"]) -> Float[Tensor, "*batch V"]:
        """The full logits ``[*batch, V]`` this head produces (the materializing reference), before temperature."""
        z = torch.nn.functional.linear(hidden, self.weight, self.bias)
        if self.logit_scale is not None:
            z = z * self.logit_scale
        if self.logit_softcap is not None:
            z = torch.tanh(z / self.logit_softcap) * self.logit_softcap
        return z


def _text_config(model: Any) -> Any:
    config = model.config
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def lm_head_spec(model: Any) -> LMHeadSpec:
    """Read the output head of a Hugging Face ``*ForCausalLM`` model.

    Known logit transforms: ``final_logit_softcapping`` (Gemma 2/3/4, VaultGemma, ... any family),
    ``logit_scale`` (Cohere, Cohere2: logits times it), ``logits_scaling`` (Granite family: logits
    divided by it). A model of another family whose config sets one of ``logit_scale``,
    ``logits_scaling``, ``output_multiplier``, ``lm_head_multiplier``, ``dim_model_base``,
    ``mup_width_multiplier`` raises ``NotImplementedError``: use the plain logits path for it.

    Args:
        model: a ``transformers.PreTrainedModel`` with ``get_output_embeddings()`` returning a module
            with a 2-D ``weight`` (``nn.Linear``), and a ``config``.

    Returns:
        :class:`LMHeadSpec` (weight, bias, logit_scale, logit_softcap).

    Raises:
        ValueError: the model has no output embeddings, or its weight is not ``[V, H]``.
        NotImplementedError: the model's family applies a logit transform this function does not know.

    Source: the ``*ForCausalLM.forward`` of transformers 5.x (Gemma2 ``final_logit_softcapping``,
    Cohere ``logit_scale``, Granite ``logits_scaling``).

    Example:
        >>> import torch, transformers
        >>> from rlzoo.kernels import lm_head_spec
        >>> cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
        ...                                num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        ...                                tie_word_embeddings=True)
        >>> model = transformers.LlamaForCausalLM(cfg)
        >>> spec = lm_head_spec(model)
        >>> spec.weight is model.get_input_embeddings().weight, spec.logit_softcap
        (True, None)
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if not isinstance(weight, Tensor) or weight.ndim != 2:
        raise ValueError(
            f"model {type(model).__name__} has no output embeddings with a [V, H] weight "
            f"(get_output_embeddings() returned {type(head).__name__})"
        )
    bias = getattr(head, "bias", None)
    bias = bias if isinstance(bias, Tensor) else None
    config = _text_config(model)
    model_type = str(getattr(config, "model_type", ""))
    softcap = getattr(config, "final_logit_softcapping", None)
    scale: float | None = None
    if model_type in _MULTIPLY_BY_LOGIT_SCALE:
        scale = float(getattr(model, "logit_scale", config.logit_scale))
    elif model_type in _DIVIDE_BY_LOGITS_SCALING:
        scale = 1.0 / float(config.logits_scaling)
    else:
        for field in _TRANSFORM_FIELDS:
            value = getattr(config, field, None)
            if value is not None and not (isinstance(value, (int, float)) and value == 1):
                raise NotImplementedError(
                    f"{type(model).__name__} (model_type={model_type!r}) sets config.{field}={value!r}, a logit "
                    "transform rlzoo.kernels.lm_head_spec does not know; use the plain logits path"
                )
    if scale == 1.0:
        scale = None
    return LMHeadSpec(weight=weight, bias=bias, logit_scale=scale,
                      logit_softcap=None if softcap is None else float(softcap))


@torch.no_grad()
def verify_lm_head_spec(
    model: Any,
    input_ids: Int[Tensor, "B T"],
    spec: LMHeadSpec | None = None,
    *,
    rtol: float | None = None,
) -> float:
    """Check that ``spec.logits(body hidden states)`` reproduces ``model(input_ids).logits``.

    Runs the model body (``model.get_decoder()``) and the full model once on ``input_ids`` (no grad).

    Args:
        model: the causal LM.
        input_ids: ``Int[B, T]``, a few tokens (e.g. one prompt).
        spec: the spec to check; default ``lm_head_spec(model)``.
        rtol: allowed max error relative to ``1 + max |logit|``; default 1e-4 for float32/float64
            models and 2e-2 for float16/bfloat16.

    Returns:
        The max absolute difference between the two logits.

    Raises:
        ValueError: the difference exceeds the tolerance (the spec does not describe this model).
        NotImplementedError: from :func:`lm_head_spec` when ``spec`` is None.
    """
    spec = lm_head_spec(model) if spec is None else spec
    body = model.get_decoder()
    hidden = body(input_ids=input_ids).last_hidden_state
    expected = model(input_ids=input_ids).logits.float()
    got = spec.logits(hidden).float()
    err = float((got - expected).abs().max())
    if rtol is None:
        rtol = 2e-2 if spec.weight.dtype in (torch.float16, torch.bfloat16) else 1e-4
    bound = rtol * (1.0 + float(expected.abs().max()))
    if not math.isfinite(err) or err > bound:
        raise ValueError(
            f"lm_head_spec does not reproduce {type(model).__name__}'s logits: max |diff| = {err:.3g} > {bound:.3g}; "
            "use the plain logits path for this model"
        )
    return err


def causal_lm_logprobs(
    model: Any,
    input_ids: Int[Tensor, "B L"],
    attention_mask: Int[Tensor, "B L"] | Bool[Tensor, "B L"] | None,
    logits_to_keep: int,
    *,
    temperature: float = 1.0,
    return_entropy: bool = True,
    return_sum_pi_squared: bool = False,
    fused: bool = True,
    chunk_size: int | None = None,
    spec: LMHeadSpec | None = None,
    **model_kwargs: Any,
) -> TokenLogProbs | TokenLogProbStats:
    """Log-probs (and entropies) of the last ``logits_to_keep`` tokens of ``input_ids`` under a causal LM.

    Position ``t`` of the result scores token ``input_ids[:, L - K + t]`` (``K = logits_to_keep``) given
    everything before it - the completion tokens of a prompt + completion batch, as TRL computes them.

    * ``fused=True`` (default): runs the model body (``model.get_decoder()``), keeps the ``K`` hidden
      states that predict those tokens and calls :func:`~rlzoo.kernels.fused_linear_logprobs` with
      :func:`lm_head_spec` - no ``[B, K, V]`` logits are ever built.
    * ``fused=False``: the plain path, ``model(..., logits_to_keep=K + 1).logits`` then
      :func:`~rlzoo.kernels.logprobs_and_entropy_from_logits`. Both paths give the same values and
      gradients (up to float rounding; tested on tiny Llama/Gemma 2/Cohere/Granite models).

    Args:
        model: a Hugging Face ``*ForCausalLM`` (a PEFT-wrapped one works: it forwards ``get_decoder``).
        input_ids: ``Int[B, L]``, prompt + completion tokens.
        attention_mask: ``Int/Bool[B, L]`` or None; passed to the model.
        logits_to_keep: ``K``, 1 <= K < L, the number of trailing tokens to score.
        temperature: > 0, divides the logits (as the sampler did).
        return_entropy: also return the entropy of each position's distribution.
        return_sum_pi_squared: also return each position's ``sum_v p_v^2`` (verl's ``sum_pi_squared``, of
            the temperature-scaled distribution; not differentiable): the result is a
            :class:`~rlzoo.kernels.TokenLogProbStats`.
        fused: use the fused path (see above) or the plain logits path.
        chunk_size: vocabulary columns per chunk on the fused path (None = automatic).
        spec: the output head (default ``lm_head_spec(model)``, read on every call; pass it to reuse it).
        **model_kwargs: extra keyword arguments for the model/body forward (e.g. ``position_ids``).

    Returns:
        :class:`~rlzoo.kernels.TokenLogProbs` of ``Float[B, K]`` tensors (nats; float32 for bf16 models), or
        :class:`~rlzoo.kernels.TokenLogProbStats` with ``return_sum_pi_squared``.

    Raises:
        ValueError: ``logits_to_keep`` outside ``[1, L)``.
        NotImplementedError: ``fused=True`` on a model whose logit transform :func:`lm_head_spec` does not
            know (use ``fused=False``).
        KernelInputError: from the kernels (bad temperature, NaN/inf in the model's output, ...).

    Source: TRL 1.16 ``GRPOTrainer._get_per_token_logps_and_entropies`` (same positions and temperature).

    Example:
        >>> import torch, transformers
        >>> from rlzoo.kernels import causal_lm_logprobs
        >>> cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
        ...                                num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
        >>> model = transformers.LlamaForCausalLM(cfg)
        >>> ids = torch.randint(0, 32, (2, 6))
        >>> fused = causal_lm_logprobs(model, ids, None, 3)
        >>> plain = causal_lm_logprobs(model, ids, None, 3, fused=False)
        >>> fused.logprobs.shape, torch.allclose(fused.logprobs, plain.logprobs, atol=1e-5)
        (torch.Size([2, 3]), True)
    """
    length = input_ids.shape[1]
    if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or not 1 <= logits_to_keep < length:
        raise ValueError(f"logits_to_keep must be an int in [1, {length}) (L = input_ids.shape[1]), got {logits_to_keep!r}")
    k = logits_to_keep
    targets = input_ids[:, -k:]
    if not fused:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=k + 1,
                       **model_kwargs).logits[:, :-1]
        if return_entropy or return_sum_pi_squared:
            out = logprobs_and_entropy_from_logits(logits, targets, temperature,
                                                   return_sum_pi_squared=return_sum_pi_squared)
            if return_entropy:
                return out
            return TokenLogProbStats(out.logprobs, None, out.sum_pi_squared)
        return TokenLogProbs(logprobs_from_logits(logits, targets, temperature), None)
    spec = lm_head_spec(model) if spec is None else spec
    body = model.get_decoder()
    hidden = body(input_ids=input_ids, attention_mask=attention_mask, **model_kwargs).last_hidden_state
    hidden = hidden[:, -k - 1 : -1]
    return fused_linear_logprobs(hidden, token_ids=targets, temperature=temperature, chunk_size=chunk_size,
                                 return_entropy=return_entropy, return_sum_pi_squared=return_sum_pi_squared, **spec)
