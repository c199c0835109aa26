"""Log-probs and entropies of sampled tokens: from logits, or from hidden states + the lm_head weight.

The dominant cost of a policy-gradient step is turning the last hidden states ``[N, H]`` into
per-token log-probs over a vocabulary of 49k-152k tokens. These functions never materialize the
``[N, V]`` log-softmax (and :func:`fused_linear_logprobs` never the ``[N, V]`` logits), accumulate in
float32 for bf16 inputs, and use Triton kernels on CUDA (torch elsewhere; Triton is optional).

* :func:`logprobs_from_logits`, :func:`entropy_from_logits`, :func:`logprobs_and_entropy_from_logits`,
  :func:`sum_pi_squared_from_logits` - from logits you already have (the plain path);
* :func:`fused_linear_logprobs` - from hidden states and the lm_head weight (the fast path);
* :func:`lm_head_spec` / :class:`LMHeadSpec` / :func:`verify_lm_head_spec` - read a Hugging Face
  model's head so that ``fused_linear_logprobs(hidden, token_ids=ids, **lm_head_spec(model))`` works;
* :func:`causal_lm_logprobs` - completion-token log-probs of a Hugging Face causal LM, fused (default)
  or through the plain logits path (``fused=False``), same values;
* :mod:`rlzoo.kernels.reference` - the materializing reference (tests and benchmarks).

``return_sum_pi_squared=True`` (:func:`fused_linear_logprobs`, :func:`logprobs_and_entropy_from_logits`,
:func:`causal_lm_logprobs`) also returns the per-token sum of squared probabilities ``sum_v p_v^2`` of the
same (temperature-scaled) distribution, verl's ``sum_pi_squared``, as a :class:`TokenLogProbStats`; it is
a detached statistic (no gradient).
"""

from rlzoo.kernels._common import KernelInputError, TokenLogProbs, TokenLogProbStats
from rlzoo.kernels.fused import default_chunk_size, fused_linear_logprobs
from rlzoo.kernels.lm_head import LMHeadSpec, causal_lm_logprobs, lm_head_spec, verify_lm_head_spec
from rlzoo.kernels.logits import (
    entropy_from_logits,
    logprobs_and_entropy_from_logits,
    logprobs_from_logits,
    sum_pi_squared_from_logits,
)

__all__ = [
    "KernelInputError",
    "LMHeadSpec",
    "TokenLogProbStats",
    "TokenLogProbs",
    "causal_lm_logprobs",
    "default_chunk_size",
    "entropy_from_logits",
    "fused_linear_logprobs",
    "lm_head_spec",
    "logprobs_and_entropy_from_logits",
    "logprobs_from_logits",
    "sum_pi_squared_from_logits",
    "verify_lm_head_spec",
]
