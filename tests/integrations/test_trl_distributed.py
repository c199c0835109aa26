"""``rlzoo.integrations.trl.GRPOTrainer`` on 2 CPU processes (torchrun, gloo): the fields and counts that span
processes.

This file is also the worker: ``python -m torch.distributed.run --standalone --nproc_per_node 2
tests/integrations/test_trl_distributed.py OUT_DIR`` trains each case of :data:`CASES` on both ranks and writes
every micro-batch each rank's loss saw (and the Normalizer it got) as JSON into OUT_DIR; the test joins the ranks.
With ``per_device_train_batch_size=3`` and ``num_generations=4`` a prompt's completions straddle the two ranks,
so its group id, its token count (prompt-mean), the positive-reward token count (VAPO) and the kept-token count
of a rollout rejection and the IS weight sums of ``rollout_is_batch_normalize`` must all be summed over processes for the micro-batch losses of both ranks to add up to
the loss of the optimizer step's whole batch (what DDP's gradient average of ``P * loss`` gives).
"""

import dataclasses
import datetime
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tolerances import REFERENCE_ATOL

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CASES = {
    "prompt_mean": {"aggregation": "prompt-mean"},
    "vapo": {},
    "rollout_rs": {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.8_1.25"},
    "rollout_is_norm": {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": True},
}
PRESETS = {"prompt_mean": "dapo", "vapo": "vapo", "rollout_rs": "dapo", "rollout_is_norm": "dapo"}
SAMPLED = ("rollout_rs", "rollout_is_norm")  # sampler log-probs from a rollout_func standing in for vLLM
# One generation batch of 2 x 18 completions (9 prompts; prompt 4 straddles the ranks) for 3 optimizer steps; old
# log-probs (an optimizer step does not end the generation cycle), which the rollout rejection needs.
SETTINGS = {"gradient_accumulation_steps": 2, "steps_per_generation": 6, "num_iterations": 1, "max_steps": 3,
            "per_device_train_batch_size": 3, "num_generations": 4}
NUM_PROMPTS = 2 * 3 * 6 // 4
# rlzoo's GRPOTrainer with its default loss against plain trl.GRPOTrainer, both on the 2 ranks: the normalisation
# over processes (TRL's num_items_in_batch / num_processes, rlzoo's all-reduced Normalizer times P) must agree.
TRL_EQUAL = {"dapo": {"loss_type": "dapo"}, "grpo_beta": {"loss_type": "grpo", "beta": 0.04}}
EQUAL_SETTINGS = {"gradient_accumulation_steps": 2, "num_iterations": 2, "max_steps": 3,
                  "per_device_train_batch_size": 4, "num_generations": 4}
_FIELDS = ("logprobs", "old_logprobs", "rollout_logprobs", "advantages", "completion_mask", "group_index", "rewards")


def _loss(name):
    import rlzoo

    return rlzoo.get_loss(PRESETS[name], **CASES[name])


def worker(out: Path) -> None:
    """One rank: train every case, dump what its loss saw."""
    import datasets
    import test_trl
    from transformers import AutoTokenizer

    from rlzoo.integrations.trl import GRPOTrainer
    from rlzoo.trainer.models import build_tiny_random

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    torch.distributed.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))  # a dead rank: fail
    model_dir = out / "tiny"
    if rank == 0:
        model, tokenizer = build_tiny_random()
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
    torch.distributed.barrier()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    results = {}
    for name in CASES:
        args = test_trl.config(out / f"{name}-{rank}", **SETTINGS)
        trainer = GRPOTrainer(
            model=str(model_dir), reward_funcs=[test_trl.vowels, test_trl.offset], args=args, loss=_loss(name),
            processing_class=tokenizer, train_dataset=datasets.Dataset.from_dict({"prompt": test_trl.PROMPTS * 4}),
            rollout_func=test_trl.sampler(tokenizer) if name in SAMPLED else None,
        )
        recorder = trainer.loss_fn = test_trl.Recorder(trainer.loss_fn)
        trainer.train()
        results[name] = [
            {
                "batch": {f: None if getattr(b, f) is None else getattr(b, f).detach().tolist() for f in _FIELDS},
                "num_tokens": float(n.num_tokens),
                "num_sequences": float(n.num_sequences),
                "group_num_tokens": None if n.group_num_tokens is None else n.group_num_tokens.tolist(),
                "num_positive_tokens": None if n.num_positive_tokens is None else float(n.num_positive_tokens),
                "is_weight_sums": None if n.is_weight_sum is None else [float(n.is_weight_sum),
                                                                        float(n.num_is_weights)],
                "loss": float(loss),
            }
            for b, n, loss in recorder.calls
        ]
    import trl

    for name, fields in TRL_EQUAL.items():
        for kind, cls in (("trl", trl.GRPOTrainer), ("rlzoo", GRPOTrainer)):
            args = test_trl.config(out / f"{name}-{kind}-{rank}", **EQUAL_SETTINGS, **fields)
            trainer = cls(model=str(model_dir), reward_funcs=test_trl.vowels, args=args, processing_class=tokenizer,
                          train_dataset=datasets.Dataset.from_dict({"prompt": test_trl.PROMPTS * 4}))
            trainer.train()
            results[f"{name}-{kind}"] = [row["loss"] for row in trainer.state.log_history if "loss" in row]
            if rank == 0:
                torch.save(torch.cat([p.detach().flatten() for p in trainer.model.parameters()]),
                           out / f"{name}-{kind}.pt")
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    torch.distributed.barrier()
    # Out without tearing down: torch 2.13 can deadlock freeing DDP's Reducer after training (the main thread,
    # holding the GIL, joins gloo's threads in ~ProcessGroupGloo while one of them frees a finished all-gather's
    # Python tensor and waits for the GIL), which hung this launch until its timeout. Both ranks' files are written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.fixture(scope="module")
def launch(tmp_path_factory) -> Path:
    """The directory the 2-rank launch wrote into (its JSON per rank, final weights of the TRL comparisons)."""
    pytest.importorskip("trl", reason="TRL (test oracle) is not installed: pip install trl==1.16.0")
    out = tmp_path_factory.mktemp("trl-two-ranks")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (ROOT, ROOT / "tests", HERE))),
           "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    # its own process group (start_new_session), killed whole with each rank's on a timeout, a failure or an
    # interruption (_kill_launch): no rank outlives the test, and communicate() does not wait on their pipes
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             __file__, str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        _kill_launch(proc)
        stdout, stderr = proc.communicate()
    finally:
        if proc.returncode != 0:  # failed or interrupted: whatever of it is left
            _kill_launch(proc)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-6000:]
    return out


@pytest.fixture(scope="module")
def two_ranks(launch) -> list[dict]:
    return [json.loads((launch / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def _kill_launch(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher ``proc`` (started with ``start_new_session``: its process group is its pid) and, while
    it runs, its ranks. Killing the launcher's group alone is not enough: torch.distributed.elastic starts each
    rank in a session of its own (``SubprocessHandler._popen``: ``start_new_session=True``), so the ranks outlived
    a killed torchrun, holding the stdout/stderr pipes that ``communicate()`` then waited on. Each rank's own
    group goes too (what it started). Processes already gone are fine."""
    import psutil  # a dependency of trl, which this test needs

    ranks = []
    if proc.poll() is None:  # not reaped: its pid is still its own
        try:
            ranks = psutil.Process(proc.pid).children(recursive=True)  # before the kill: then they are init's
        except psutil.NoSuchProcess:
            pass
    for group in (proc.pid, *(rank.pid for rank in ranks)):
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for rank in ranks:  # one that was not its group's leader
        try:
            rank.kill()
        except psutil.NoSuchProcess:
            pass


def _tensor(rows):
    return None if rows is None else torch.tensor(rows)


def _step_batch(calls):
    """One PolicyBatch of the micro-batches of both ranks (right padded)."""
    import rlzoo

    t = max(len(c["batch"]["completion_mask"][0]) for c in calls)

    def cat(field):
        values = [_tensor(c["batch"][field]) for c in calls]
        if values[0] is None:
            return None
        return torch.cat([torch.nn.functional.pad(v, (0, t - v.shape[1])) if v.ndim == 2 else v for v in values])

    return rlzoo.PolicyBatch(**{f: cat(f) for f in _FIELDS})


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_count_the_optimizer_step_over_both(two_ranks, name):
    """Every rank's Normalizer holds the counts of the step's micro-batches on both ranks (tokens the loss counts,
    per prompt, of positive rewards), group ids are TRL's groups across ranks (an id's completions, on either
    rank, have GRPO advantages summing to 0), and the micro-batch losses of both ranks sum to the loss of the
    step's whole batch (with ``rollout_is_batch_normalize``: the generation batch's mean IS weight, over both
    ranks)."""
    import rlzoo

    loss_fn = _loss(name)
    per_rank = [ranks[name] for ranks in two_ranks]
    assert len(per_rank[0]) == len(per_rank[1]) == 2 * SETTINGS["max_steps"]
    for step in range(SETTINGS["max_steps"]):
        calls = [c for rank in per_rank for c in rank[2 * step : 2 * step + 2]]
        full = _step_batch(calls)
        counted = loss_fn.loss_mask(full.completion_mask, old_logprobs=full.old_logprobs,
                                    rollout_logprobs=full.rollout_logprobs)
        for c in calls:
            assert c["num_tokens"] == counted.sum().item()
            assert c["num_sequences"] == counted.shape[0]  # every row, as TRL's grpo and verl's trainer divide
        if name == "rollout_rs":
            assert counted.sum() < full.completion_mask.sum()  # the rejection dropped tokens
        if name == "prompt_mean":
            want = torch.zeros(len(calls[0]["group_num_tokens"]), dtype=torch.long).index_add(
                0, full.group_index, counted.sum(-1))
            assert all(c["group_num_tokens"] == want.tolist() for c in calls)
        if name == "vapo":
            positive = (counted & (full.rewards > 0)[:, None]).sum().item()
            assert 0 < positive < counted.sum().item()
            assert all(c["num_positive_tokens"] == positive for c in calls)
        normalizer = dataclasses.replace(rlzoo.Normalizer.from_batch(full, loss=loss_fn),
                                         num_sequences=full.completion_mask.shape[0])
        if name == "rollout_is_norm":  # the generation batch's sums: every micro-batch of both ranks, once each
            whole = _step_batch([c for rank in per_rank for c in rank])
            sums = loss_fn.is_weight_sums(whole.completion_mask, old_logprobs=whole.old_logprobs,
                                          rollout_logprobs=whole.rollout_logprobs)
            own = loss_fn.is_weight_sums(full.completion_mask, old_logprobs=full.old_logprobs,
                                         rollout_logprobs=full.rollout_logprobs)
            assert abs(float(own[0] / own[1] - sums[0] / sums[1])) > 1e-4  # the step's own mean would differ
            for c in calls:
                assert c["is_weight_sums"][0] == pytest.approx(float(sums[0]), rel=1e-6)
                assert c["is_weight_sums"][1] == float(sums[1])
            normalizer = dataclasses.replace(normalizer, is_weight_sum=sums[0], num_is_weights=sums[1])
        total = sum(c["loss"] for c in calls)
        assert total == pytest.approx(float(loss_fn(full, normalizer).loss), abs=REFERENCE_ATOL, rel=0)
    if name == "prompt_mean":  # the generation batch: a prompt on both ranks, each id 4 times, zero-mean advantages
        ranks_of = [{i for c in rank for i in c["batch"]["group_index"]} for rank in per_rank]
        assert ranks_of[0] & ranks_of[1]
        calls = [c for rank in per_rank for c in rank]
        ids = torch.tensor([i for c in calls for i in c["batch"]["group_index"]])
        advantages = torch.tensor([a for c in calls for a in c["batch"]["advantages"]])
        assert torch.bincount(ids).tolist() == [4] * NUM_PROMPTS
        assert torch.zeros(NUM_PROMPTS).index_add(0, ids, advantages).abs().max() < 1e-3 < advantages.abs().max()


@pytest.mark.parametrize("name", list(TRL_EQUAL))
def test_two_ranks_train_exactly_like_trl(launch, two_ranks, name):
    """On 2 processes with gradient accumulation 2 and 2 iterations, rlzoo's GRPOTrainer (default loss) logs TRL's
    per-step losses and ends at TRL's weights (fp32, SGD): the loss's counts over processes and the P scaling
    reproduce TRL's num_items_in_batch normalisation and DDP's average."""
    for ranks in two_ranks:
        want, got = ranks[f"{name}-trl"], ranks[f"{name}-rlzoo"]
        assert len(want) == len(got) == EQUAL_SETTINGS["max_steps"]
        assert got == pytest.approx(want, abs=REFERENCE_ATOL, rel=0)
    want, got = torch.load(launch / f"{name}-trl.pt"), torch.load(launch / f"{name}-rlzoo.pt")
    assert (got - want).abs().max().item() <= REFERENCE_ATOL
    from transformers import AutoModelForCausalLM

    initial = torch.cat([p.detach().flatten() for p in AutoModelForCausalLM.from_pretrained(launch / "tiny").parameters()])
    assert (want - initial).abs().max().item() > 1e-3  # the comparison has power: training moved the weights


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
