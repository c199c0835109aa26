"""The test-time type checker is on for rlzoo (pyproject addopts), with PEP 484's numeric tower."""

import jaxtyping
import pytest
import torch

import rlzoo


def test_checker_rejects_a_wrong_shape_annotation():
    """Float[Tensor, "B T"] logprobs given as a 1-d tensor: the checker fires before rlzoo's own check."""
    with pytest.raises((jaxtyping.TypeCheckError, rlzoo.BatchError)):
        rlzoo.PolicyBatch(logprobs=torch.zeros(3), advantages=torch.zeros(3),
                          completion_mask=torch.ones(3, dtype=torch.bool))
    with pytest.raises(jaxtyping.TypeCheckError):
        rlzoo.losses.masked_mean(torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool))


def test_checker_accepts_int_for_float():
    """beta=0 (an int where float is annotated) is accepted and switches the KL penalty off (kept, inactive)."""
    assert [p.active for p in rlzoo.get_loss("grpo", beta=0).penalties] == [False]
