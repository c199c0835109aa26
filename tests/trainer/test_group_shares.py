"""Which rank holds which groups: on any pattern of kept and dropped groups (DAPO's dynamic sampling) and any
shuffle of a generation batch that spans several optimizer steps, the ranks' shares put together are what one
process selects. Ranks are simulated by threads exchanging objects (the code under test only all-gathers)."""

import threading

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rlzoo.trainer.distributed import Distributed
from rlzoo.trainer.generation import Generated
from rlzoo.trainer.group_shares import assemble, select_groups, split_globally

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
    """A one-prompt generation whose tokens are all ``tag`` (so the group can be recognised), ``width`` wide."""
    gen = Generated(prompt_ids=torch.full((1, 3), tag), prompt_mask=torch.ones(1, 3, dtype=torch.bool),
                    group_index=torch.zeros(G, dtype=torch.long), completion_ids=torch.full((G, width), tag),
                    completion_mask=torch.ones(G, width, dtype=torch.bool), is_truncated=torch.zeros(G, dtype=torch.bool),
                    texts=[str(tag)] * G, rollout_logprobs=torch.full((G, width), -float(tag)))
    return gen, 0, torch.full((G, 1), float(tag)), torch.full((G,), float(tag))


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
    for rank, share in enumerate(shares):  # the groups' tensors travelled intact
        for (k, i), (gen, row, values, reward), here in share:
            tag = k * total + i
            assert here == (rank * need <= i < (rank + 1) * need)
            assert bool((gen.completion_ids[row * G:(row + 1) * G] == tag).all()) and float(reward[0]) == tag
            assert gen.rollout_logprobs is not None and float(gen.rollout_logprobs[0, 0]) == -tag


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
