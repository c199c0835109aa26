"""Which rank holds which groups: on any pattern of kept and dropped groups (DAPO's dynamic sampling) and any
shuffle of a generation batch that spans several optimizer steps, the ranks' shares put together are what one
process selects. Ranks are simulated by threads exchanging objects (the code under test only all-gathers)."""

import threading

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rlzoo.trainer.distributed import Distributed
from rlzoo.trainer.generation import Generated
from rlzoo.trainer.group_shares import assemble, select_groups, split_generation_batch, split_globally
from rlzoo.trainer.rewards import RewardSet
from rlzoo.trainer.step_batch import OptimizerStepBatch

G = 2  # completions per prompt


class ThreadRank(Distributed):
    """Rank ``rank`` of ``world_size`` threads whose all-gather goes through a shared list and a barrier."""

    def __init__(self, rank: int, world_size: int, board: list, barrier: threading.Barrier) -> None:
        object.__setattr__(self, "rank", rank)
        object.__setattr__(self, "world_size", world_size)
        object.__setattr__(self, "local_rank", rank)
        object.__setattr__(self, "board", board)
        object.__setattr__(self, "barrier", barrier)

    def all_gather_object(self, obj):
        self.board[self.rank] = obj
        self.barrier.wait()
        out = list(self.board)
        self.barrier.wait()
        return out

    def all_gather(self, value, *, pad_value=0):
        return torch.cat(self.all_gather_object(value))

    def reduce_floats(self, values, op="sum"):
        assert op == "sum"
        shares = self.all_gather_object(values)
        return {k: sum(share[k] for share in shares) for k in values}


def on_ranks(world: int, fn) -> list:
    """``fn(dist)`` on ``world`` thread ranks; their results in rank order."""
    board, barrier, results = [None] * world, threading.Barrier(world), [None] * world

    def run(rank):
        results[rank] = fn(ThreadRank(rank, world, board, barrier))

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a rank waits for a collective the others never call"
    return results


def group(tag: int, width: int):
    """A one-prompt generation whose tokens are all ``tag`` (so the group can be recognised), ``width`` wide, with a
    ``log_extra`` column ``tag`` (the values a reward function logged for its completions)."""
    gen = Generated(prompt_ids=torch.full((1, 3), tag), prompt_mask=torch.ones(1, 3, dtype=torch.bool),
                    group_index=torch.zeros(G, dtype=torch.long), completion_ids=torch.full((G, width), tag),
                    completion_mask=torch.ones(G, width, dtype=torch.bool), is_truncated=torch.zeros(G, dtype=torch.bool),
                    texts=[str(tag)] * G, rollout_logprobs=torch.full((G, width), -float(tag)))
    extra = {"tag": [f"t{tag}-{j}" for j in range(G)]}
    return gen, 0, torch.full((G, 1), float(tag)), torch.full((G,), float(tag)), extra


@settings(max_examples=25, deadline=None)
@given(world=st.sampled_from([2, 3]), need=st.integers(1, 3), rounds=st.integers(1, 3), data=st.data())
def test_dynamic_sampling_shares_together_are_the_one_process_selection(world, need, rounds, data):
    """Every group (round k, global index i) is kept or dropped; each rank samples indices
    [rank * need, (rank + 1) * need) of every round. The ranks' shares in rank order are the first need x world kept
    groups in (round, index) order, filled with dropped ones: one process's choice."""
    total = world * need
    flags = data.draw(st.lists(st.booleans(), min_size=rounds * total, max_size=rounds * total))

    def local(rank):
        kept, dropped = [], []
        for k in range(rounds):
            for i in range(rank * need, (rank + 1) * need):
                tag = k * total + i
                (kept if flags[tag] else dropped).append(((k, i), group(tag, 1 + tag % 3)))
        return kept, dropped

    everything = [local(r) for r in range(world)]
    one_kept = sorted((entry for kept, _ in everything for entry in kept), key=lambda e: e[0])
    one_dropped = sorted((entry for _, dropped in everything for entry in dropped), key=lambda e: e[0])
    one = select_groups(one_kept, one_dropped, need=total, dist=Distributed())
    shares = on_ranks(world, lambda d: select_groups(*local(d.rank), need=need, dist=d))
    assert [key for share in shares for key, *_ in share] == [key for key, *_ in one]
    for rank, share in enumerate(shares):  # the groups' tensors and log_extra values travelled intact
        for (k, i), (gen, row, values, reward, extra), here in share:
            tag = k * total + i
            assert here == (rank * need <= i < (rank + 1) * need)
            assert bool((gen.completion_ids[row * G:(row + 1) * G] == tag).all()) and float(reward[0]) == tag
            assert gen.rollout_logprobs is not None and float(gen.rollout_logprobs[0, 0]) == -tag
            assert extra == {"tag": [f"t{tag}-{j}" for j in range(G)]}


@settings(max_examples=15, deadline=None)
@given(world=st.sampled_from([2, 4]), per_rank=st.integers(1, 3), parts=st.sampled_from([1, 2, 4]),
       seed=st.integers(0, 2**16))
def test_a_generation_batch_is_shuffled_into_micro_batches_as_one_process_does(world, per_rank, parts, seed):
    """Rank r's share is prompts [r * per_rank, (r + 1) * per_rank) of the generation batch (its prompt ids global).
    Micro-batch k of every rank together holds the completions of one process's micro-batch k, and rank r holds
    its r-th slice."""
    assume((per_rank * G) % parts == 0)

    def share(rank):
        groups = [group(rank * per_rank + i, 1 + (rank + i) % 3) for i in range(per_rank)]
        r = assemble(groups, pad_token_id=0, device=torch.device("cpu"))
        r.prompt_id = r.group_index + rank * per_rank
        r.advantages = r.reward * 10
        r.old_logprobs = r.rollout_logprobs
        return r

    whole = assemble([group(t, 1 + (t // per_rank + t % per_rank) % 3) for t in range(world * per_rank)],
                     pad_token_id=0, device=torch.device("cpu"))
    one = whole.split(parts, generator=torch.Generator().manual_seed(seed), group_size=G)
    mine = on_ranks(world, lambda d: split_globally(share(d.rank), parts, generator=torch.Generator().manual_seed(seed),
                                                     group_size=G, pad_token_id=0, dist=d))
    for k in range(parts):
        expected = one[k].completion_ids[:, 0].tolist()
        together = [t for rank in range(world) for t in mine[rank][k].completion_ids[:, 0].tolist()]
        assert together == expected
        for rank in range(world):
            mb = mine[rank][k]
            tags = mb.completion_ids[:, 0]
            assert torch.equal(mb.prompt_id, tags) and torch.equal(mb.advantages, tags.float() * 10)
            assert torch.equal(mb.prompt_ids[mb.group_index, -1], tags)  # prompts re-indexed with their completions
            assert torch.equal(mb.old_logprobs[:, 0], -tags.float())


@settings(max_examples=25, deadline=None)
@given(world=st.sampled_from([2, 3]), per_rank=st.integers(1, 3), parts=st.sampled_from([2, 4]),
       accumulation=st.sampled_from([1, 2]), seed=st.integers(0, 2**16), data=st.data())
def test_step_metrics_of_groups_split_over_ranks_are_the_one_process_metrics(world, per_rank, parts, accumulation,
                                                                            seed, data):
    """A generation batch spanning several steps is shuffled into micro-batches as one process does and each rank
    takes a slice of each, which can cut a prompt group (G completions) between ranks. The step's reward, reward_std,
    frac_reward_zero_std (the fraction of its groups whose rewards are all equal) and length metrics over the ranks
    are exactly one process's: the groups are found by their global prompt ids, not by rows taken G at a time."""
    n = world * per_rank * G
    assume(n % parts == 0 and (n // parts) % world == 0 and parts % accumulation == 0 and parts > accumulation)
    rewards = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=n, max_size=n))

    def scored(t):  # group t with its drawn rewards (some groups constant, some not)
        gen, row, _, _, extra = group(t, 1 + t % 3)
        reward = torch.tensor(rewards[t * G:(t + 1) * G])
        return gen, row, reward[:, None], reward, extra

    def share(rank):
        r = assemble([scored(rank * per_rank + i) for i in range(per_rank)], pad_token_id=0, device=torch.device("cpu"))
        r.prompt_id = r.group_index + rank * per_rank
        r.advantages = r.reward
        return r

    def steps(micro_batches):
        return [OptimizerStepBatch(micro_batches=micro_batches[k:k + accumulation], loss_masks=[], metrics={},
                                   group_offsets=[0] * accumulation, num_groups=per_rank)
                for k in range(0, parts, accumulation)]

    whole = assemble([scored(t) for t in range(world * per_rank)], pad_token_id=0, device=torch.device("cpu"))
    whole.advantages = whole.reward
    shuffled = whole.split(parts, generator=torch.Generator().manual_seed(seed), group_size=G)
    one = [b.step_metrics(dist=Distributed(), reward_names=("r",), num_tokens=0.0) for b in steps(shuffled)]

    def ranks(d):
        mine = split_globally(share(d.rank), parts, generator=torch.Generator().manual_seed(seed), group_size=G,
                              pad_token_id=0, dist=d)
        return [b.step_metrics(dist=d, reward_names=("r",), num_tokens=0.0) for b in steps(mine)]

    for metrics in on_ranks(world, ranks):
        assert metrics == one


def test_reward_function_metrics_average_every_ranks_values():
    """TRL's log_metric: a metric is the mean of the values every rank logged (TRL sums them over the processes
    and divides by their count), so 2 ranks that each score half the completions log what one process logs when
    it scores them in two calls; a metric only some ranks logged averages their values."""
    def logged(d):
        rewards = RewardSet([lambda prompts, completions, **kw: [0.0] * len(completions)], names=["zero"])
        for value in ([1.0, 2.0], [4.0])[d.rank]:
            rewards.log_metric("m", value)
        if d.rank == 1:
            rewards.log_metric("only_rank_1", 3.0)
        rewards.log_extra("column", [d.rank])
        return rewards.take_logged(d)

    one = RewardSet([lambda prompts, completions, **kw: [0.0] * len(completions)], names=["zero"])
    for value in (1.0, 2.0, 4.0):
        one.log_metric("m", value)
    one.log_metric("only_rank_1", 3.0)
    expected = one.take_logged()[0]
    for rank, (metrics, extra) in enumerate(on_ranks(2, logged)):
        assert metrics == expected == {"m": 7.0 / 3, "only_rank_1": 3.0}
        assert extra == {"column": [rank]}  # the completions table's columns stay with this rank's completions


@settings(max_examples=15, deadline=None)
@given(world=st.sampled_from([2, 3]), per_rank=st.integers(1, 3), spg=st.sampled_from([2, 4]),
       accumulation=st.sampled_from([1, 2, 3, 4, 6]), seed=st.integers(0, 2**16))
def test_a_generation_batch_whose_pass_ends_inside_a_step_is_split_as_one_process_splits_it(
        world, per_rank, spg, accumulation, seed):
    """With gradient_accumulation_steps not a multiple of steps_per_generation (e.g. 3 and 2: a step takes a whole
    batch and half of the next one), which completions share a step depends on the shuffle: the ranks take slices of
    one process's micro-batches. When it is a multiple, each pass lies in one step and each rank shuffles its own
    share (rank-invariant steps either way)."""
    n = world * per_rank * G
    assume(n % spg == 0 and (n // spg) % world == 0)

    def share(rank):
        r = assemble([group(rank * per_rank + i, 1) for i in range(per_rank)], pad_token_id=0,
                     device=torch.device("cpu"))
        r.prompt_id = r.group_index + rank * per_rank
        r.advantages = r.reward
        return r

    def split(rollout, dist):
        return split_generation_batch(rollout, spg, gradient_accumulation_steps=accumulation,
                                      generator=torch.Generator().manual_seed(seed), group_size=G, pad_token_id=0,
                                      dist=dist)

    whole = assemble([group(t, 1) for t in range(world * per_rank)], pad_token_id=0, device=torch.device("cpu"))
    whole.advantages = whole.reward
    one = split(whole, Distributed())
    mine = on_ranks(world, lambda d: split(share(d.rank), d))
    steps = range(0, 2 * spg - accumulation + 1, accumulation)  # two passes over the batch (num_iterations 2)
    for start in steps:
        indices = [k % spg for k in range(start, start + accumulation)]
        expected = sorted(t for k in indices for t in one[k].completion_ids[:, 0].tolist())
        together = sorted(t for rank in range(world) for k in indices for t in mine[rank][k].completion_ids[:, 0].tolist())
        assert together == expected
