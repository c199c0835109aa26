"""The "prompt-mean" aggregation: SkyRL's ``loss_reduction="prompt_mean"``, exact under any split.

SkyRL itself is called in test_skyrl_losses.py; here its documented formula (skyrl ``ppo_utils.apply_loss_reduction_to_advantages_
minibatch``: token ``t`` of completion ``i`` of prompt ``p`` weighs ``1 / (num_prompts * tokens_in_prompt_p)``)
is written out below as the oracle, in float64 with Python loops, independent of rlzoo's vectorised code.
"""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from strategies import (
    batch_options_for,
    budget,
    fresh,
    loss_and_grads,
    loss_options,
    policy_batches,
    supported_options,
)
from tolerances import tol

import rlzoo
from rlzoo import BatchError, Normalizer, PolicyBatch
from rlzoo.losses import aggregations

F64 = tol(torch.float64)
NON_COUPLED = [n for n in rlzoo.list_losses() if not rlzoo.get_loss(n).batch_coupled]


def skyrl_prompt_mean(values: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor) -> float:
    """SkyRL's prompt_mean, token by token: sum_{i,t} m l / (P * N_g(i)), P the prompts with a counted token
    (SkyRL counts every prompt of its mini-batch; the two agree when every prompt has one, which
    :func:`test_skyrl_formula` asserts; an all-masked prompt is inert in rlzoo, see
    :func:`test_fully_masked_prompt_is_inert`)."""
    counts: dict[int, int] = {}
    for i in range(mask.shape[0]):
        n = int(mask[i].sum())
        if n:
            counts[int(group_index[i])] = counts.get(int(group_index[i]), 0) + n
    prompts = len(counts)
    total = 0.0
    for i in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if mask[i, t]:
                total += float(values[i, t]) / (prompts * counts[int(group_index[i])])
    return total


@given(batch=policy_batches(groups=True), seed=st.integers(0, 2**16))
def test_skyrl_formula(batch, seed):
    """prompt-mean of any per-token values == SkyRL's weights 1 / (num_prompts * tokens_in_prompt) summed,
    with the counts of the batch itself; and, through a loss at ratio 1 (ppo: l = -A), the loss value."""
    mask, groups = batch.completion_mask, batch.group_index
    values = torch.randn(mask.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    normalizer = Normalizer.from_masks(mask, group_index=[groups])
    got = aggregations.get("prompt-mean")()(values, mask, normalizer, None, groups)
    assert float(got) == pytest.approx(skyrl_prompt_mean(values, mask, groups), abs=F64["atol"], rel=F64["rtol"])

    on_policy = fresh(batch, old_logprobs=None)
    out = rlzoo.get_loss("ppo", aggregation="prompt-mean")(on_policy)
    adv = batch.advantages if batch.advantages.ndim == 2 else batch.advantages.unsqueeze(-1).expand(mask.shape)
    want = skyrl_prompt_mean(-adv, mask, groups)
    assert float(out.loss.detach()) == pytest.approx(want, abs=F64["atol"], rel=F64["rtol"])


@budget(1.0)
@given(data=st.data())
def test_micro_batches_sum_to_the_full_batch(data):
    """Any preset (not batch-coupled) with prompt-mean and optional parts: the micro-batch losses with
    Normalizer.from_batch(*micro_batches, loss=loss_fn) sum to the full-batch loss, in value and gradient
    (with a rollout rejection too: the group counts are of the kept tokens),
    also when a split cuts a group (shuffled group ids, any micro-batch size)."""
    name = data.draw(st.sampled_from(NON_COUPLED), label="preset")
    options = supported_options(name, data.draw(loss_options(kl=True, is_correction=True, entropy_bonus=True, rollout_rs=None)))
    loss_fn = rlzoo.get_loss(name, aggregation="prompt-mean", **options)
    batch = data.draw(policy_batches(**{"groups": True, "ref": True, "rollout": True, "entropies": True,
                                        **batch_options_for(loss_fn)}))
    full, g_full, _ = loss_and_grads(loss_fn, batch)
    whole = fresh(batch)
    size = data.draw(st.integers(1, batch.shape[0]), label="micro_batch_size")
    micro = whole.split(size)
    normalizer = Normalizer.from_batch(*micro, loss=loss_fn)
    torch.manual_seed(0)
    total = sum(loss_fn(mb, normalizer=normalizer).loss for mb in micro)
    (grad,) = torch.autograd.grad(total, whole.logprobs)
    torch.testing.assert_close(total, full.loss, **F64)
    torch.testing.assert_close(grad, g_full, **F64)


def test_fully_masked_prompt_is_inert():
    """A prompt whose completions are all masked does not count in P (SkyRL would count it): adding one
    changes nothing. Two prompts: (-1, -3 | -2) and (4); loss = ((-1 - 3 - 2) / 3 + 4 / 1) / 2 = 1."""
    values = torch.tensor([[-1.0, -3.0], [-2.0, 0.0], [4.0, 0.0], [9.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False], [True, False], [False, False]])
    groups = torch.tensor([0, 0, 1, 2])
    normalizer = Normalizer.from_masks(mask, group_index=[groups])
    assert int(normalizer.num_groups) == 2
    got = aggregations.get("prompt-mean")()(values, mask, normalizer, None, groups)
    assert float(got) == pytest.approx(1.0, abs=F64["atol"])
    assert float(got) == pytest.approx(skyrl_prompt_mean(values, mask, groups), abs=F64["atol"])


def test_prompt_mean_needs_group_index():
    """Without PolicyBatch.group_index the loss raises a BatchError naming the field; group ids outside the
    normalizer's counts raise naming group_index."""
    lp = torch.full((2, 2), -0.5, dtype=torch.float64)
    common = {"logprobs": lp, "advantages": torch.ones(2, dtype=torch.float64),
              "completion_mask": torch.ones(2, 2, dtype=torch.bool)}
    loss_fn = rlzoo.get_loss("dapo", aggregation="prompt-mean")
    with pytest.raises(BatchError, match="group_index"):
        loss_fn(PolicyBatch(**common))
    batch = PolicyBatch(**common, group_index=torch.tensor([0, 5]))
    small = Normalizer.from_masks(torch.ones(1, 2, dtype=torch.bool), group_index=[torch.tensor([0])])
    with pytest.raises(ValueError, match="group_index"):
        loss_fn(batch, normalizer=small)
    assert math.isfinite(float(loss_fn(batch).loss))


def test_group_labels_instead_of_prompt_indices_are_refused():
    """verl's uids (or any label) as group_index: the counts vector is the largest id + 1 long, so id 10**12 tried to
    allocate 8 TB (and 10**9 silently took 8 GB). Above both the rows and 2**20 ids are refused, naming group_index
    and how to make dense ids; num_groups given, or ids up to the rows, are taken as before."""
    lp = torch.full((4, 2), -0.5, dtype=torch.float64)
    common = {"logprobs": lp, "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64),
              "completion_mask": torch.ones(4, 2, dtype=torch.bool)}
    loss_fn = rlzoo.get_loss("dapo", aggregation="prompt-mean")
    for labels in ([10**12, 10**12, 5, 5], [2**20, 2**20, 0, 0]):
        with pytest.raises(BatchError, match=r"^Normalizer.from_masks: group_index holds id \d+ for 4 rows; ids number "
                                             r"the step's prompts from 0 .*torch.unique\(uids, return_inverse=True\)"):
            loss_fn(PolicyBatch(**common, group_index=torch.tensor(labels)))
    dense = PolicyBatch(**common, group_index=torch.unique(torch.tensor([10**12, 10**12, 5, 5]), return_inverse=True)[1])
    offset = PolicyBatch(**common, group_index=torch.tensor([2**20 - 1, 2**20 - 1, 7, 7]))  # a large step's prompts
    assert float(loss_fn(dense).loss) == pytest.approx(float(loss_fn(offset).loss), abs=F64["atol"])
    masks = [common["completion_mask"]]
    given = Normalizer.from_masks(*masks, group_index=[torch.tensor([9, 9, 3, 3])], num_groups=10)
    assert given.group_num_tokens.shape == (10,)


def test_value_loss_takes_prompt_mean_with_the_group_index():
    """value_loss with aggregation="prompt-mean" raised for the group ids it had no argument for, though docs said
    any aggregation: it takes group_index; the loss is the prompt-mean of its per-token terms (SkyRL's weights)."""
    from rlzoo.advantages import value_loss

    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    values, old, returns = (torch.randn(4, 3, generator=g, dtype=torch.float64) for _ in range(3))
    groups = torch.tensor([0, 0, 1, 1])
    out = value_loss(values, old, returns, mask, cliprange_value=math.inf, aggregation="prompt-mean",
                     group_index=groups)
    per_token = 0.5 * (values - returns) ** 2
    assert float(out.loss) == pytest.approx(skyrl_prompt_mean(per_token, mask, groups), abs=F64["atol"])
    with pytest.raises(ValueError, match="group_index"):
        value_loss(values, old, returns, mask, cliprange_value=math.inf, aggregation="prompt-mean")
