"""Your own data and rewards: data sets that ``datasets`` loads in TRL's two prompt formats, and TRL 1.16's whole
reward-function contract (message-list completions, trainer_state, log_extra / log_metric, async functions, TRL's
spellings, trl.rewards unchanged, reward models). Tiny random model, 2 steps."""

import asyncio
import dataclasses
import json
import os
import re
from pathlib import Path

import datasets
import pytest
import torch
from trl.data_utils import maybe_apply_chat_template

from rlzoo.cli import main, parse_train_args
from rlzoo.trainer import TrainConfig, Trainer
from rlzoo.trainer.models import build_tiny_random
from rlzoo.trainer.rewards import RewardModel, RewardSet
from rlzoo.trainer.run_config import absolute_paths
from rlzoo.trainer.tasks import DatasetTask, TaskStream, dataset_task_name, load_task, render_prompt

TINY_FLAGS = ["--model", "tiny-random", "--num-generations", "4", "--per-device-train-batch-size", "8",
              "--max-completion-length", "5", "--eval-size", "2", "--eval-batch-size", "2", "--no-progress",
              "--save-steps", "0"]
TINY = {"model": "tiny-random", "num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 5,
        "eval_size": 2, "eval_batch_size": 2, "progress": False, "save_steps": 0}


def _conversational_rows(n: int) -> list[dict]:
    return [{"prompt": [{"role": "system", "content": "Think in <think> tags."},
                        {"role": "user", "content": f"What is {i} + {i}?"}],
             "solution": str(2 * i), "level": i % 3} for i in range(n)]


def test_parquet_conversational_data_with_trls_own_reward_trains(tmp_path):
    """The issue's first check: a parquet file in TRL's conversational format with a `solution` column, rewarded by
    trl.rewards.think_format_reward (TRL's dotted spelling), 2 steps; functions get TRL's arguments."""
    path = tmp_path / "math.parquet"
    rows = [{**row, "completion": "<think>", "completion_ids": [7, 7, 7]} for row in _conversational_rows(40)]
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    calls = []

    def spy(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, solution, level, **kw):
        assert "completion" not in kw and [7, 7, 7] not in completion_ids  # TRL drops both columns of the data
        assert len(completion_ids) == len(completions) and all(len(ids) <= 5 for ids in completion_ids)
        calls.append((prompts, completions, solution, trainer_state.global_step, trainer_state.epoch))
        log_metric("spy/len", sum(len(c[0]["content"]) for c in completions) / len(completions))
        log_extra("solution_seen", list(solution))
        return [0.0] * len(completions)

    config = TrainConfig(**TINY, task=str(path), task_kwargs={"answer_column": "solution"}, max_steps=2,
                         reward_funcs=("trl.rewards.think_format_reward", "accuracy"), log_completions=True,
                         output_dir=str(tmp_path / "run"))
    history = Trainer(config, reward_funcs=[spy]).train()
    assert [r["step"] for r in history] == [0, 1, 2]
    for key in ("rewards/think_format_reward/mean", "rewards/think_format_reward/std", "rewards/accuracy/mean",
                "spy/len", "num_tokens", "completions/mean_terminated_length", "eval/accuracy"):
        assert key in history[-1] or key in history[0], key
    prompts, completions, solution, _, _ = [c for c in calls if len(c[1]) == 8][-1]
    by_text = {r["prompt"][-1]["content"]: r for r in rows}
    assert all(p == by_text[p[-1]["content"]]["prompt"] for p in prompts)  # the data set's messages, as TRL
    assert all(isinstance(c, list) and c[0]["role"] == "assistant" for c in completions)
    assert solution == [by_text[p[-1]["content"]]["solution"] for p in prompts]
    generations = [c for c in calls if len(c[1]) == 8]  # not the reward check's (1), nor the evaluations' (2 each)
    assert [c[3] for c in generations] == [0, 1]  # trainer_state.global_step at each generation
    assert [c[3] for c in calls if len(c[1]) == 2] == [0, 2]  # and at the step-0 and final evaluations
    # epoch: rows drawn / training rows (38: 40 minus 2 held out); an evaluation's is the run's at its step (it
    # kept the last generation's, 2 / 38, at the final one: helper trial)
    assert [c[4] for c in generations] == [0.0, 2 / 38] and [c[4] for c in calls if len(c[1]) == 2] == [0.0, 4 / 38]
    table = datasets.Dataset.from_parquet(str(tmp_path / "run" / "completions" / "step-000002.parquet"))
    assert {"step", "prompt", "completion", "think_format_reward", "accuracy", "spy", "solution_seen",
            "advantage"} <= set(table.column_names) and len(table) == 8
    assert table["solution_seen"] == [by_text[p.split("user\n")[1].split("<|im_end|>")[0]]["solution"]
                                      for p in table["prompt"]]  # log_extra rows follow the completions


@pytest.mark.parametrize("system_prompt", [None, "Be brief."])
def test_prompts_render_as_trl_renders_them(system_prompt):
    _, tok = build_tiny_random()
    user = [{"role": "user", "content": "2 + 2?"}]
    prefilled = [*user, {"role": "assistant", "content": "<think>"}]
    for messages in (user, prefilled):
        expected = [{"role": "system", "content": system_prompt}, *messages] if system_prompt else messages
        assert render_prompt(tok, messages, system_prompt) == maybe_apply_chat_template({"prompt": expected},
                                                                                         tok)["prompt"]
    assert render_prompt(tok, "The sky is") == "The sky is"  # standard format: the string as it is
    with pytest.raises(ValueError, match="system_prompt applies to conversational prompts"):
        render_prompt(tok, "The sky is", "Be brief.")


def test_hub_style_directory_and_save_to_disk_and_csv(tmp_path, caplog):
    """A directory laid out as a hub data set repository (data/SPLIT-*.parquet), with its test split as the held-out
    set, trains 2 steps; a save_to_disk directory and a CSV file load the same rows."""
    hub = tmp_path / "org-math"
    (hub / "data").mkdir(parents=True)
    rows = [{"question": f"{i} + 1 =", "answer": i + 1} for i in range(30)]
    datasets.Dataset.from_list(rows[:24]).to_parquet(str(hub / "data" / "train-00000-of-00001.parquet"))
    datasets.Dataset.from_list(rows[24:]).to_parquet(str(hub / "data" / "test-00000-of-00001.parquet"))
    config = TrainConfig(**{**TINY, "eval_size": 3}, task=str(hub), output_dir=str(tmp_path / "run"), max_steps=2,
                         task_kwargs={"prompt_column": "question", "eval_split": "test"})
    trainer = Trainer(config)
    assert [item.question for item in trainer.evaluator.task.eval_items] == ["24 + 1 =", "25 + 1 =", "26 + 1 ="]
    assert trainer.logger.title.endswith(" on org-math - tiny-random")  # the directory's name, not its whole path
    assert trainer.train()[-1]["step"] == 2
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "disk"))
    (tmp_path / "rows.csv").write_text("question,answer\n" + "".join(f"{r['question']},{r['answer']}\n" for r in rows))
    (tmp_path / "rows.tsv").write_text("question\tanswer\n" + "".join(f"{r['question']}\t{r['answer']}\n" for r in rows))
    for spec in (tmp_path / "disk", tmp_path / "rows.csv", tmp_path / "rows.tsv"):
        task = load_task(str(spec), kwargs={"prompt_column": "question"}, eval_size=0)
        assert sorted(task.dataset["question"]) == sorted(r["question"] for r in rows)
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "rows.tsv.parquet"))  # parquet, whatever its stem
    assert len(load_task(str(tmp_path / "rows.tsv.parquet"), kwargs={"prompt_column": "question"}, eval_size=0).dataset) == 30
    (tmp_path / "semi.csv").write_text("question;answer\n1 + 1 =;2\n")  # another separator: said, with the way out
    with pytest.raises(ValueError, match=r"no column 'question'; its columns: 'question;answer'; choose one with "
                                         r"--task.prompt_column; a \.csv file is read comma-separated: write it with "
                                         r"commas, or tab-separated as \.tsv$"):
        load_task(str(tmp_path / "semi.csv"), kwargs={"prompt_column": "question"}, eval_size=0)
    with pytest.raises(ValueError, match="has no split 'validation'; its splits: train"):
        load_task(str(tmp_path / "disk"), kwargs={"prompt_column": "question", "split": "validation"})
    import logging

    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        load_task(str(tmp_path / "disk"), kwargs={"prompt_column": "question", "eval_split": "train"})
    assert "--task.eval_split train is the training split: the held-out accuracy is measured on training" in caplog.text
    # one saved Dataset (no DatasetDict) has no named splits: a split asked of it was ignored, silently
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "one"))
    assert len(load_task(str(tmp_path / "one"), kwargs={"prompt_column": "question"}, eval_size=0).dataset) == 30
    for option in ({"split": "nope"}, {"eval_split": "test"}):
        with pytest.raises(ValueError, match=rf"is one saved Dataset \(save_to_disk\), without named splits: drop "
                                             rf"--task.{next(iter(option))} "):
            load_task(str(tmp_path / "one"), kwargs={"prompt_column": "question", **option})


def test_an_uncached_hub_data_set_offline_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot load data set 'rlzoo-test-org/no-such-data'.*HF_HUB_OFFLINE"):
        load_task("rlzoo-test-org/no-such-data")


def test_python_api_takes_datasets_and_iterable_datasets(tmp_path, caplog):
    train = datasets.Dataset.from_list([{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(16)])
    held_out = datasets.Dataset.from_list([{"prompt": "1 + 1 =", "answer": "2"}])
    config = TrainConfig(**TINY, max_steps=1, output_dir=str(tmp_path / "run"))
    trainer = Trainer(config, train_dataset=train, eval_dataset=held_out)
    assert [i.question for i in trainer.evaluator.task.eval_items] == ["1 + 1 ="]
    import logging

    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):  # an eval_dataset nothing evaluates: said
        Trainer(TrainConfig(**{**TINY, "eval_size": 0}, output_dir=str(tmp_path / "none")), train_dataset=train,
                eval_dataset=held_out)
    assert "eval_dataset is not used: eval_size is 0" in caplog.text
    assert trainer.train()[-1]["step"] == 1
    stream = TaskStream(DatasetTask(name="s", dataset=train.to_iterable_dataset(), eval_size=2))
    assert [i.question for i in stream.eval_items] == ["0 + 0 =", "1 + 1 ="]
    first = stream.next_train(3)
    assert [i.question for i in first] == ["2 + 2 =", "3 + 3 =", "4 + 4 ="] and stream.position == 3
    second = [i.question for i in stream.next_train(15)]  # rows 5..15, then a second epoch from row 2
    assert second[10:] == ["15 + 15 =", "2 + 2 =", "3 + 3 =", "4 + 4 =", "5 + 5 ="]


def test_a_dataset_trains_with_an_iterable_dataset_held_out(tmp_path):
    """Trainer(config, train_dataset=Dataset, eval_dataset=IterableDataset) failed with "object of type
    'IterableDataset' has no len()"; the held-out set is the stream's first eval_size rows."""
    train = datasets.Dataset.from_list([{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(16)])
    held_out = datasets.Dataset.from_list([{"prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(5)])
    config = TrainConfig(**{**TINY, "eval_size": 3}, max_steps=1, output_dir=str(tmp_path / "run"))
    trainer = Trainer(config, train_dataset=train, eval_dataset=held_out.to_iterable_dataset())
    assert [i.question for i in trainer.evaluator.task.eval_items] == ["0 + 1 =", "1 + 1 =", "2 + 1 ="]
    history = trainer.train()
    assert history[-1]["step"] == 1 and "eval/accuracy" in history[0]
    bad = datasets.Dataset.from_list([{"prompt": "1 + 1 =", "answer": "2"}, {"prompt": "", "answer": "1"}])
    with pytest.raises(ValueError, match=r"^eval_dataset row 1: the prompt column 'prompt' is empty"):
        Trainer(dataclasses.replace(config, output_dir=str(tmp_path / "bad")), train_dataset=train,
                eval_dataset=bad.to_iterable_dataset())


def test_a_replaced_task_and_a_small_held_out_set_are_said(tmp_path, caplog):
    """TrainConfig(task="d.jsonl") with train_dataset=ds trained on ds without a word about the task; an eval_dataset
    smaller than eval_size was used in full silently (the held-out split cut from the training rows warns): one
    warning line each. The default task, and a resume's recorded train_dataset:... name, say nothing."""
    from rlzoo.trainer.config import TaskConfig
    from rlzoo.trainer.tasks import build_task

    train = datasets.Dataset.from_list([{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(16)])
    held_out = datasets.Dataset.from_list([{"prompt": "1 + 1 =", "answer": "2"}] * 3)
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in train))
    config = TrainConfig(**{**TINY, "eval_size": 5}, task=str(path))
    for data in (held_out, held_out.to_iterable_dataset()):
        caplog.clear()
        with caplog.at_level("WARNING", logger="rlzoo.train"):
            task = build_task(config.section(TaskConfig), train_dataset=train, eval_dataset=data)
        assert task.task.dataset is train and len(task.eval_items) == 3
        assert [r.getMessage() for r in caplog.records] == [
            (f"train_dataset replaces task {str(path)!r}: the run trains on train_dataset (drop task, or drop "
            "train_dataset to train on the task)"),
            (f"task {dataset_task_name(train)}: the held-out set (eval_dataset) has 3 rows, fewer than eval_size=5: "
            "all 3 are evaluated")]
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlzoo.train"):
        for task in ("chain_sum", dataset_task_name(train)):
            build_task(dataclasses.replace(config, task=task, eval_size=3).section(TaskConfig), train_dataset=train,
                       eval_dataset=held_out)
    assert not caplog.records
    # through the Trainer, which records the data set's name as the task before building it: said once (not at all
    # before: the task was replaced by then)
    with caplog.at_level("WARNING", logger="rlzoo.train"):
        Trainer(dataclasses.replace(config, output_dir=str(tmp_path / "run"), eval_size=2), train_dataset=train)
    assert [r.getMessage() for r in caplog.records if "replaces task" in r.getMessage()] == [
        (f"train_dataset replaces task {str(path)!r}: the run trains on train_dataset (drop task, or drop "
        "train_dataset to train on the task)")]


def test_a_small_stream_holds_out_at_most_a_fifth_and_an_empty_one_fails_at_once(caplog):
    """An IterableDataset without eval_dataset gets the map-style cap: 30 rows and eval_size 200 hold out 6 rows
    (with the warning), not all 30 (which left an empty training stream, found only after the model loaded)."""
    rows = datasets.Dataset.from_list([{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(30)])
    with caplog.at_level("WARNING", logger="rlzoo.train"):
        stream = TaskStream(DatasetTask(name="s", dataset=rows.to_iterable_dataset(), eval_size=200))
    assert len(stream.eval_items) == 6 and "capped at 6 rows" in caplog.text
    assert [i.question for i in stream.next_train(2)] == ["6 + 6 =", "7 + 7 ="]  # the held-out rows are skipped
    empty = datasets.IterableDataset.from_generator(lambda: iter(()), features=rows.features)
    for held_out in (None, rows):
        with pytest.raises(ValueError, match=r"the training stream has no row left for training"):
            DatasetTask(name="s", dataset=empty, eval_dataset=held_out, eval_size=4)
    # without features its columns are read from its first row: an empty one was "has no column 'prompt'"
    unknown = datasets.IterableDataset.from_generator(lambda: iter(()))
    with pytest.raises(ValueError, match=r"^task 's': the training stream has no row left for training$"):
        DatasetTask(name="s", dataset=unknown, eval_size=4)
    with pytest.raises(ValueError, match=r"^task 's': the held-out stream has no row$"):
        DatasetTask(name="s", dataset=rows, eval_dataset=unknown, eval_size=4)


def test_trl_reward_functions_run_unchanged():
    """trl.rewards' own functions through a RewardSet on conversational items (TRL's names and dotted paths)."""
    from rlzoo.trainer.tasks import TaskItem

    items = [TaskItem(question="q", answer="", columns={"solution": s}, index=0,
                      prompt=[{"role": "user", "content": "q"}]) for s in (r"\frac{1}{3}", r"\frac{1}{3}", "2")]
    completions = [r"<think>x</think> My answer is \boxed{\frac{1}{3}}", r"My answer is \boxed{\frac{1}{2}}",
                   "<think>2</think>"]
    rewards = RewardSet(["think_format_reward", "trl.rewards.accuracy_reward"])
    values = rewards.compute(["unused"] * 3, completions, items)
    assert values.tolist() == [[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]]
    assert rewards.names == ("think_format_reward", "accuracy_reward")
    _, extra = rewards.take_logged()  # accuracy_reward logs its parsed answers with log_extra
    assert {"gold_parsed", "answer_parsed"} <= set(extra) and len(extra["gold_parsed"]) == 3


def test_async_rewards_run_concurrently_on_one_loop():
    started, loops = [], set()

    async def slow(prompts, completions, **kw):
        started.append(len(started))
        loops.add(id(asyncio.get_running_loop()))
        await asyncio.sleep(0.2)
        return [1.0] * len(completions)

    async def fast(prompts, completions, **kw):
        loops.add(id(asyncio.get_running_loop()))
        await asyncio.sleep(0.2)
        return [2.0] * len(completions)

    rewards = RewardSet([slow, fast, lambda prompts, completions, **kw: [3.0] * len(completions)])
    import time

    t0 = time.perf_counter()
    out = rewards(["p", "p"], ["a", "b"])
    assert time.perf_counter() - t0 < 0.35  # gathered, not one after the other
    assert out.per_function.tolist() == [[1.0, 2.0, 3.0]] * 2
    rewards(["p"], ["a"])
    assert len(loops) == 1  # TRL's daemon loop: async clients keep working across calls


def test_a_reward_model_scores_prompt_and_completion(tmp_path):
    """A sequence-classification checkpoint in --reward-funcs is a reward model: logits[:, 0] of the text TRL
    builds (prompt + completion; the chat template of the messages for conversational data)."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    _, tok = build_tiny_random()
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                                       num_hidden_layers=1, num_attention_heads=2,
                                                       num_key_value_heads=2, num_labels=1, pad_token_id=2))
    model.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    rewards = RewardSet([str(tmp_path / "rm")])
    out = rewards(["1 + 1 =", "1 + 1 ="], [" 2", " 3"])
    ids = tok(["1 + 1 = 2", "1 + 1 = 3"], return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        expected = model.eval()(**ids).logits[:, 0]
    torch.testing.assert_close(out.per_function[:, 0], expected)
    assert rewards.names == ("rm",)
    # a loaded model object, as TRL's reward_funcs takes it (its tokenizer from config._name_or_path), and with the
    # tokenizer given; a module that is not a PreTrainedModel is refused rather than called with the prompts
    loaded = LlamaForSequenceClassification.from_pretrained(tmp_path / "rm")
    for spec in (loaded, RewardModel(loaded, tokenizer=tok)):
        by_object = RewardSet(spec)  # one function, not a list, as TRL takes it
        torch.testing.assert_close(by_object(["1 + 1 =", "1 + 1 ="], [" 2", " 3"]).per_function[:, 0], expected)
        assert by_object.names == ("rm",)
    with pytest.raises(TypeError, match=r"^a reward model must be a directory, a hub id or a PreTrainedModel, got Linear"):
        RewardSet([torch.nn.Linear(2, 1)])
    messages = [[{"role": "user", "content": "hi"}]]
    assert rewards.functions[0].texts(messages, [[{"role": "assistant", "content": "yo"}]]) == [
        tok.apply_chat_template([*messages[0], {"role": "assistant", "content": "yo"}], tokenize=False)]


def test_config_json_of_a_data_set_run_records_the_columns(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(20)))
    config = TrainConfig(**TINY, task=str(path), max_steps=1, output_dir=str(tmp_path / "run"))
    Trainer(config).train()
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["task"] == str(path) and saved["report_to"] == "none"


def test_rlzoo_eval_of_a_file_evaluates_eval_size_rows_and_a_run_its_own_held_out_set(tmp_path, capsys, caplog):
    """rlzoo eval --task d.jsonl --eval-size 20 on a 20-row file evaluated n=4: the cap that keeps training rows
    applied though nothing trains. It evaluates all 20 now, without the warning; `--run RUN` on the run's own task
    still evaluates the held-out set the run was trained with (capped: the other rows were trained on)."""
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"What is {i}+1?", "answer": str(i + 1)}) + "\n" for i in range(20)))
    with caplog.at_level("WARNING", logger="rlzoo.train"):
        assert main(["eval", "--model", "tiny-random", "--task", str(path), "--eval-size", "20",
                     "--max-completion-length", "2", "--output", str(tmp_path / "all.json")]) == 0
    assert json.loads((tmp_path / "all.json").read_text())["n"] == 20 and "capped" not in caplog.text
    run = tmp_path / "run"
    Trainer(TrainConfig(**{**TINY, "eval_size": 200}, task=str(path), max_steps=1, output_dir=str(run))).train()
    assert main(["eval", "--run", str(run), "--max-completion-length", "2", "--output", str(tmp_path / "run.json")]) == 0
    assert json.loads((tmp_path / "run.json").read_text())["n"] == 4  # the run's held-out set: 20 % of the rows
    # another --eval-seed draws rows the run trained on: said (a user trial read them as held-out accuracy); the
    # run's own settings say nothing, nor a larger --eval-size (this run's split was capped: the same rows)
    assert "the accuracy is not a held-out one" not in caplog.text
    with caplog.at_level("WARNING", logger="rlzoo.train"):
        assert main(["eval", "--run", str(run), "--eval-seed", "7", "--max-completion-length", "2"]) == 0
    assert f"--eval-seed 7 (the run's: 1000) on --run {run}: the rows drawn from {str(path)!r} include rows the run " \
           "trained on (its held-out rows, if any, were cut by eval_size and eval_seed): the accuracy is not a " \
           "held-out one" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlzoo.train"):  # more than its held-out rows, capped to the same 4 rows
        assert main(["eval", "--run", str(run), "--eval-size", "300", "--max-completion-length", "2"]) == 0
    assert "the accuracy is not a held-out one" not in caplog.text
    caplog.clear()
    # a run without a held-out set (eval_size 0): the --eval-size N rows its error asks for, uncapped (it
    # evaluated 4 of 20, and 0 of a 3-row file: "nan%", exit 0, NaN in the JSON)
    for rows in (20, 3):
        data = tmp_path / f"d{rows}.jsonl"
        data.write_text("".join(json.dumps({"prompt": f"{i}+1?", "answer": str(i + 1)}) + "\n" for i in range(rows)))
        bare = tmp_path / f"bare{rows}"
        Trainer(TrainConfig(**{**TINY, "eval_size": 0, "save_steps": 1}, task=str(data), max_steps=1,
                            output_dir=str(bare))).train()
        assert main(["eval", "--run", str(bare), "--eval-size", "2", "--max-completion-length", "2", "--output",
                     str(tmp_path / "bare.json")]) == 0
        assert json.loads((tmp_path / "bare.json").read_text())["n"] == 2
        assert f"--eval-size 2 (the run's: 0) on --run {bare}" in caplog.text
    tiny = tmp_path / "tiny_run"  # a held-out split capped to 0 rows (3 rows: 20 % is 0): an error, not n=0
    Trainer(TrainConfig(**{**TINY, "eval_size": 5}, task=str(tmp_path / "d3.jsonl"), max_steps=1,
                        output_dir=str(tiny))).train()
    with pytest.raises(ValueError, match=r"has no held-out rows to evaluate \(eval_size 5; a run's held-out split "
                                         r"takes at most 20 % of its data set's rows\): pass --eval-size N"):
        main(["eval", "--run", str(tiny), "--max-completion-length", "2"])


def test_a_python_data_set_is_what_its_run_records(tmp_path, monkeypatch):
    """A run of Trainer(config, train_dataset=...) used to record the default task (chain_sum): `rlzoo eval --run`
    evaluated on chain_sum, `--config RUN/config.json` trained on it, and a resume failed inside the task stream."""
    rows = [{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(16)]
    train = datasets.Dataset.from_list(rows)
    run = tmp_path / "run"
    config = TrainConfig(**TINY, max_steps=1, output_dir=str(run))
    Trainer(config, train_dataset=train).train()
    saved = json.loads((run / "config.json").read_text())
    assert saved["task"] == saved["segments"][-1]["settings"]["task"] == dataset_task_name(train)
    assert saved["task"] == f"train_dataset:{train._fingerprint}"

    with monkeypatch.context() as patch:  # refused before any model loads, saying what to pass
        def no_model(*args, **kwargs):
            raise AssertionError("a model loaded")

        patch.setattr("rlzoo.trainer.models.load_model", no_model)
        patch.setattr("rlzoo.trainer.adapters.build_policy", no_model)
        with pytest.raises(ValueError, match=r"^--run .*'train_dataset:[0-9a-f]+' is a data set that was given from "
                                             r"Python.*--task"):
            main(["eval", "--run", str(run)])
        with pytest.raises(ValueError, match=r"^task 'train_dataset:[0-9a-f]+' is a data set .*--task"):
            main(["train", "--config", str(run / "config.json"), "--output-dir", str(tmp_path / "copy")])
    with pytest.raises(ValueError, match=r"task 'train_dataset:[0-9a-f]+' is a data set that was given from Python.*"
                                         r"a resume: Trainer\(resume_config\(RUN\), train_dataset=\.\.\.\)") as refused:
        main(["train", *TINY_FLAGS, "--max-steps", "2", "--output-dir", str(run), "--resume", "latest"])
    assert "task state is from a different training stream" not in str(refused.value)

    path = tmp_path / "rows.jsonl"  # with --task, eval --run evaluates the checkpoint on that data
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["eval", "--run", str(run), "--task", str(path), "--max-completion-length", "4"]) == 0
    # and from Python, with the same data set, the run resumes
    resumed = Trainer(dataclasses.replace(config, max_steps=2, resume="latest"), train_dataset=train).train()
    assert resumed[-1]["step"] == 2


def test_the_default_output_dir_is_named_after_the_data(tmp_path, monkeypatch):
    """A run on Trainer(config, train_dataset=ds) was named after the built-in task it does not train on
    (runs/grpo-chain_sum-TIMESTAMP); it is named after its data: `dataset`, or a data file's stem."""
    monkeypatch.chdir(tmp_path)
    rows = [{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(16)]
    path = tmp_path / "sums.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = TrainConfig(**TINY, max_steps=1)
    names = [Trainer(config, train_dataset=datasets.Dataset.from_list(rows)).output_dir,
             Trainer(dataclasses.replace(config, task=str(path))).output_dir, Trainer(config).output_dir]
    assert [(p.parent.name, p.name.rsplit("-", 3)[0]) for p in names] == [
        ("runs", "grpo-dataset"), ("runs", "grpo-sums"), ("runs", "grpo-chain_sum")]
    # the process id ends the name: runs started in the same second (a sweep's seeds) got one directory
    assert {p.name.rsplit("-", 1)[1] for p in names} == {str(os.getpid())}


def test_config_json_records_local_paths_absolute(tmp_path, monkeypatch, capsys):
    """config.json used to keep the paths as typed: from another directory `rlzoo eval --run /abs/RUN` failed with
    "task file 'data.jsonl' does not exist" (and so did reward files and model directories)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    work = Path.cwd()
    Path("data.jsonl").write_text("".join(json.dumps({"prompt": f"{i} + {i} =", "answer": str(2 * i)}) + "\n"
                                          for i in range(16)))
    Path("myrew.py").write_text("def f(prompts, completions, **columns):\n    return [0.0] * len(completions)\n")
    model, tokenizer = build_tiny_random()
    model.save_pretrained("model")
    tokenizer.save_pretrained("model")
    assert main(["train", *TINY_FLAGS, "--model", "model", "--task", "data.jsonl", "--reward-funcs", "accuracy",
                 "myrew.py:f", "--max-steps", "1", "--output-dir", "run"]) == 0
    saved = json.loads(Path("run/config.json").read_text())
    expected = {"model": str(work / "model"), "task": str(work / "data.jsonl"),
                "reward_funcs": ["accuracy", f"{work / 'myrew.py'}:f"]}
    assert {k: saved[k] for k in expected} == expected
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["eval", "--run", str(work / "run"), "--max-completion-length", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["task"] == str(work / "data.jsonl")
    config = parse_train_args(["--config", str(work / "run" / "config.json")])
    assert {k: getattr(config, k) for k in expected} == {**expected, "reward_funcs": tuple(expected["reward_funcs"])}


def test_paths_recorded_relative_by_older_runs_still_match(tmp_path, monkeypatch):
    """Checkpoints written before paths were recorded absolute hold them as typed; a resume from the same directory
    compares them as the paths they name (the settings and the task stream's name)."""
    monkeypatch.chdir(tmp_path)
    Path("data.jsonl").write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(8)))
    old = {"task": "data.jsonl", "model": "tiny-random", "reward_funcs": ["accuracy"], "teacher": None}
    assert absolute_paths(old) == {**old, "task": str(Path.cwd() / "data.jsonl")}
    stream = TaskStream(load_task(str(Path.cwd() / "data.jsonl"), eval_size=2))
    stream.load_state_dict({**stream.state_dict(), "name": "data.jsonl", "position": 3})
    assert stream.position == 3
    with pytest.raises(ValueError, match="different training stream: name='other.jsonl'"):
        stream.load_state_dict({**stream.state_dict(), "name": "other.jsonl"})


def test_an_empty_task_file_says_so(tmp_path):
    """It used to say "cannot read task file empty.jsonl: StopIteration:"."""
    for name, content in (("empty.jsonl", ""), ("blank.csv", "\n\n")):
        (tmp_path / name).write_text(content)
        with pytest.raises(ValueError, match=f"^task file '.*{name}' is empty: it has no rows$"):
            load_task(str(tmp_path / name))
    datasets.Dataset.from_dict({"prompt": [], "answer": []}).to_parquet(str(tmp_path / "none.parquet"))  # valid
    with pytest.raises(ValueError, match="^task file '.*none.parquet' is empty: it has no rows$"):  # ArrowInvalid
        load_task(str(tmp_path / "none.parquet"))
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="bad.parquet"):
        load_task(str(tmp_path / "bad.parquet"))


def test_hub_options_for_local_data_are_said_to_be_ignored(tmp_path, caplog):
    """--task.name, --task.data_dir and --task.revision reach datasets.load_dataset for hub ids (a repository's
    directory takes name and data_dir): for a data file or a save_to_disk directory (and revision for any local
    directory) they were ignored silently, and recorded in config.json as if used. A warning names them (not a
    refusal: a run that recorded one still resumes); a repository's directory takes data_dir."""
    import logging

    (tmp_path / "rows.jsonl").write_text('{"prompt": "1 + 1 =", "answer": "2"}\n' * 12)
    datasets.Dataset.from_list([{"prompt": "1 + 1 =", "answer": "2"}] * 12).save_to_disk(str(tmp_path / "disk"))
    hub = tmp_path / "repo"
    (hub / "sub").mkdir(parents=True)
    datasets.Dataset.from_list([{"prompt": "1 + 1 =", "answer": "2"}] * 12).to_parquet(str(hub / "sub" / "train.parquet"))
    for spec, label, options, said in [
            (tmp_path / "rows.jsonl", "task file", {"name": "foo"}, "--task.name"),
            (tmp_path / "disk", "data set", {"data_dir": "x", "revision": "main"}, "--task.data_dir, --task.revision"),
            (hub, "data set", {"data_dir": "sub", "revision": "main"}, "--task.revision")]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
            assert len(load_task(str(spec), kwargs=options, eval_size=0).dataset) == 12
        assert f"{label} '{spec}': {said} ignored: " in caplog.text


def test_a_local_directory_without_data_says_so_not_the_hub(tmp_path):
    """A directory holding no data files was "(HF_HUB_OFFLINE is set and it is not in the local cache) ... a
    loadable hub id": it is no hub id. The error says what the directory lacks."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.md").write_text("hi")
    with pytest.raises(ValueError, match=r"^cannot load data set directory '.*notes': it holds no data files "):
        load_task(str(tmp_path / "notes"))
    (tmp_path / "notes" / "data").mkdir()  # a data file datasets cannot read: its own error, not "no data files"
    (tmp_path / "notes" / "data" / "train.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match=r"^cannot load data set directory '.*notes' \(") as err:
        load_task(str(tmp_path / "notes"))
    assert "holds no data files" not in str(err.value)


def test_a_run_or_model_directory_as_task_says_what_it_is(tmp_path):
    """--task RUN_DIR said "cannot load data set directory ... (DatasetGenerationError: ...)"; a run's directory
    is named as one, with the commands that take it, and a model's directory points to --model."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"model": "tiny-random", "max_steps": 2, "task": "basic_arithmetic"}))
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(ValueError, match=rf"^'{re.escape(str(run))}' is an rlzoo run directory, not a data set: "
                                         rf"rlzoo eval --run {re.escape(str(run))} evaluates"):
        load_task(str(run))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match=r"is a model directory, not a data set: give it as --model$"):
        load_task(str(model))


def test_a_data_directory_of_mixed_file_types_is_refused_not_read_in_part(tmp_path):
    """A directory holding x.jsonl and y.csv trained on one of them: datasets reads one file type per directory,
    and half the rows were left out without a word (user trial). It is refused, naming the types; a --task.data_dir
    of one type, or a hub layout whose README.md declares its configs, loads."""
    rows = [{"prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(12)]
    (tmp_path / "d" / "only").mkdir(parents=True)
    (tmp_path / "d" / "x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    datasets.Dataset.from_list(rows).to_csv(tmp_path / "d" / "y.csv", index=False)
    with pytest.raises(ValueError, match=r"data set directory '.*d' holds data files of 2 types: y.csv \(csv\), "
                                         r"x.jsonl \(json\); datasets reads one type per directory"):
        load_task(str(tmp_path / "d"), eval_size=0)
    (tmp_path / "d" / "only" / "z.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert len(load_task(str(tmp_path / "d"), kwargs={"data_dir": "only"}, eval_size=0).dataset) == 12
    (tmp_path / "d" / "README.md").write_text("---\nconfigs:\n- config_name: default\n  data_files: y.csv\n---\n")
    assert len(load_task(str(tmp_path / "d"), eval_size=0).dataset) == 12
    hub = tmp_path / "hub"  # the files datasets' split patterns pick are of one type: a hub layout with extras loads
    (hub / "data").mkdir(parents=True)
    (hub / "scripts").mkdir()
    datasets.Dataset.from_list(rows).to_parquet(hub / "data" / "train-00000-of-00001.parquet")
    (hub / "dataset_infos.json").write_text("{}")
    datasets.Dataset.from_list(rows).to_csv(hub / "scripts" / "make.csv", index=False)
    assert len(load_task(str(hub), eval_size=0).dataset) == 12


def test_a_conversation_ending_in_another_role_is_refused_naming_the_row(tmp_path):
    """A last message of role 'usr' failed at the first generation naming no file or row; it is refused as the
    data loads, naming the row; a system-then-user or assistant-prefill conversation loads."""
    rows = [{"prompt": [{"role": "user", "content": f"{i} + 1 ="}], "answer": str(i + 1)} for i in range(12)]
    rows[5]["prompt"] = [{"role": "system", "content": "Be brief."}, {"role": "usr", "content": "6 + 1 ="}]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"^task file '.*chat.jsonl' row 5 \(line 6\): the prompt column 'prompt' is "
                                         r"a conversation whose last message's role is 'usr', not user, tool or "
                                         r"assistant"):
        load_task(str(path), eval_size=0)
    rows[5]["prompt"] = [{"role": "user", "content": "6 + 1 ="}, {"role": "assistant", "content": "It is"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert len(load_task(str(path), eval_size=0).dataset) == 12


def test_a_tool_call_conversation_from_a_json_file_loads_and_its_bad_row_is_named(tmp_path):
    """datasets types a messages column whose turns differ in keys (a tool call's ``tool_calls``, a tool turn) as a
    list of Json: its rows were checked as raw JSON strings and every row was refused (user trial). They are checked
    decoded, as the same rows given as a Dataset are."""
    def conversation(i: int, role: str = "tool") -> list[dict]:
        return [{"role": "user", "content": f"What is {i}+1?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "add", "arguments": {"a": i, "b": 1}}}]},
                {"role": role, "content": str(i + 1)}]

    path = tmp_path / "tools.jsonl"
    rows = [{"prompt": conversation(i), "answer": str(i + 1)} for i in range(12)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = load_task(str(path), eval_size=0)
    assert task.dataset.features["prompt"] != datasets.Value("string")  # (datasets' List(Json) here)
    assert task.dataset[3]["prompt"] == conversation(3)
    rows[7]["prompt"] = conversation(7, role="tools")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"row 7 \(line 8\): the prompt column 'prompt' is a conversation whose last "
                                         r"message's role is 'tools'"):
        load_task(str(path), eval_size=0)


def test_trl_rewards_without_trl_name_the_extra(monkeypatch):
    """TRL's reward functions need trl and math-verify (the `trl` extra): a missing one says what to install."""
    import sys

    from trl.rewards import accuracy_rewards

    from rlzoo.trainer.reward_loading import load_reward_function

    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "trl", None)
        patch.delitem(sys.modules, "trl.rewards", raising=False)
        for spec in ("trl.rewards.think_format_reward", "think_format_reward", "trl.rewards:accuracy_reward"):
            with pytest.raises(ImportError, match=r"^reward function .*: no module named 'trl[.a-z]*': "
                                                  r"pip install \"rlzoo\[trl\]\"$"):
                load_reward_function(spec)
    monkeypatch.setattr(accuracy_rewards, "is_math_verify_available", lambda: False)
    rewards = RewardSet(["trl.rewards.accuracy_reward"])
    with pytest.raises(ValueError, match=r"^reward function 'accuracy_reward' raised ImportError: .*math_verify.*: "
                                         r"pip install \"rlzoo\[trl\]\""):
        rewards(["q"], [[{"role": "assistant", "content": "1"}]], columns={"solution": ["1"]})


def test_trl_rewards_on_the_wrong_data_shape_say_what_is_wrong():
    """accuracy_reward needs a `solution` column; think_format_reward needs conversational completions: the error
    names the reward, the missing column and the columns present, or the data shape it expects (one line)."""
    data = datasets.Dataset.from_dict({"prompt": ["q", "r"], "answer": ["1", "2"], "level": [0, 1]})
    task = DatasetTask(name="data.jsonl", dataset=data, eval_size=0)
    with pytest.raises(ValueError, match=r"^reward function 'accuracy_reward' needs the data set column\(s\) "
                                         r"'solution', which the data set does not have; its columns: 'answer', "
                                         r"'level' \(.*: rename the column holding it to 'solution'; if that is the "
                                         r"answer column 'answer', also pass --task.answer_column solution\)$") as missing:
        RewardSet(["trl.rewards.accuracy_reward"], task=task)(["q"], ["1"], columns={"answer": ["1"], "level": [0]})
    with pytest.raises(ValueError, match=r"^reward function 'think_format_reward' raised TypeError: string indices"
                                         r".*; it expects conversational data \(completions as message lists") as shape:
        RewardSet(["think_format_reward"])(["q"], ["<think>x</think>"])
    assert "\n" not in str(missing.value) + str(shape.value)


def test_reference_answers_no_completion_can_match_under_the_extraction_warn(tmp_path, caplog):
    """Text answers under the default last_number (or LaTeX "$4$", whose number is no match for the text) scored 0
    for every completion: no accuracy, no reward, no gradient, and not a word. The start-up check gives each held-out
    reference answer as the completion and warns when none scores; an extraction that fits says nothing."""
    import logging

    for answers, extraction, warned in [(["Paris", "Rome"], "last_number", "('Paris' -> None; 2 tried)"),
                                        (["$4$", "$5$"], "last_number", "('$4$' -> '4'; 2 tried)"),
                                        (["Paris", "Rome"], "full", None), (["Paris", "Rome"], "tag", None),
                                        (["4", "5"], "last_number", None)]:
        rows = [{"prompt": f"question {i}?", "answer": answers[i % 2]} for i in range(20)]
        config = TrainConfig(**{**TINY, "eval_size": 2, "max_steps": 0}, answer_extraction=extraction,
                             output_dir=str(tmp_path / f"{extraction}-{answers[0]}"))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
            Trainer(config, train_dataset=datasets.Dataset.from_list(rows)).train()
        messages = [r.getMessage() for r in caplog.records if "no reference answer scores" in r.getMessage()]
        if warned is None:
            assert messages == [], (answers, extraction)
        else:
            assert messages == [(f"task 'train_dataset:{datasets.Dataset.from_list(rows)._fingerprint}': no reference "
                                f"answer scores as the completion with answer_extraction {extraction!r} {warned}: the "
                                "accuracy and the accuracy reward cannot exceed 0; choose --answer-extraction (full, "
                                "first_line, first_number, last_number, tag) or --reward-funcs of your own")]


def test_a_column_named_as_a_reward_function_argument_is_refused_when_the_data_loads():
    """TRL hands every column but the prompt and completion ones to reward functions as keywords, so a column named
    `completions` or `trainer_state` would collide with the arguments (TRL: a TypeError in the first reward call);
    rlzoo refuses it as the data loads, naming the task (its file) and the column. A prompt column so named, and a
    `completion_ids` column TRL drops, are not passed on and stay allowed."""
    for column in ("prompts", "completions", "trainer_state", "log_extra", "log_metric"):
        data = datasets.Dataset.from_dict({"prompt": ["q", "r"], "answer": ["1", "2"], column: ["a", "b"]})
        with pytest.raises(ValueError, match=rf"^task 'data.jsonl': the training data has a column named "
                                             rf"'{column}', which reward functions receive as their own argument; "
                                             r"rename the column$"):
            DatasetTask(name="data.jsonl", dataset=data, eval_size=0)
        held_out = datasets.Dataset.from_dict({"prompt": ["q"], "answer": ["1"], column: ["a"]})
        with pytest.raises(ValueError, match=rf"held-out data has a column named '{column}'"):
            DatasetTask(name="data.jsonl", dataset=data.remove_columns(column), eval_dataset=held_out, eval_size=0)
    allowed = datasets.Dataset.from_dict({"prompts": ["q", "r"], "answer": ["1", "2"], "completion_ids": [[1], [2]]})
    task = DatasetTask(name="data.jsonl", dataset=allowed, prompt_column="prompts", eval_size=0)
    assert set(next(task.train_items()).columns) == {"answer"}
    with pytest.raises(ValueError, match="column named 'completion_ids'"):  # the answer column is passed on
        DatasetTask(name="data.jsonl", dataset=allowed, prompt_column="prompts", answer_column="completion_ids",
                    eval_size=0)


def test_one_column_as_prompt_and_answer_is_refused_naming_both_options():
    """User trial: --task.answer_column prompt ended in pyarrow's 'Field "prompt" exists 2 times in schema'."""
    data = datasets.Dataset.from_dict({"prompt": ["q", "r"], "answer": ["1", "2"]})
    for columns in ({"answer_column": "prompt"}, {"prompt_column": "answer"}):
        with pytest.raises(ValueError, match=r"^task 'd.jsonl': --task.prompt_column and --task.answer_column both "
                                             r"name the column '(prompt|answer)'; the answer is another column"):
            DatasetTask(name="d.jsonl", dataset=data, eval_size=0, **columns)


def test_a_column_named_1_or_yes_is_that_text_on_the_command_line_and_a_config_files_number_says_to_quote():
    """--task.answer_column 1 (or yes, on) was read as YAML's 1 (True): 'the training data has no column 1; its
    columns: ..., '1''. A data set's --task options are text (or null); a number from a config file is refused
    saying to quote it."""
    from rlzoo.cli import _TEXT_TASK_OPTIONS, parse_train_args
    from rlzoo.trainer.tasks.datasets_source import DATASET_OPTIONS

    assert set(_TEXT_TASK_OPTIONS) == set(DATASET_OPTIONS)
    for value in ("1", "yes", "on", "1e3"):
        assert parse_train_args(["--task.answer_column", value]).task_kwargs == {"answer_column": value}
    assert parse_train_args(["--task.answer_column", "null"]).task_kwargs == {"answer_column": None}
    assert parse_train_args(["--task.min_terms", "2"]).task_kwargs == {"min_terms": 2}  # a task's own options: YAML
    data = datasets.Dataset.from_dict({"prompt": ["q", "r"], "1": ["1", "2"], "True": ["a", "b"]})
    assert DatasetTask(name="d.csv", dataset=data, eval_size=0, answer_column="1").answer_column == "1"
    from strategies import runtime_type_checker_off

    for column in (1, True):
        with runtime_type_checker_off(), pytest.raises(ValueError, match=rf"^task 'd.csv': --task.answer_column must be a column name \(text\), "
                                             rf"got {type(column).__name__} {column!r}; .*quote it \('1'\)$"):
            DatasetTask(name="d.csv", dataset=data, eval_size=0, answer_column=column)


def test_a_missing_column_mentions_task_answer_column_only_where_it_applies():
    """--task.answer_column used to be named for any missing column: also for a reasoning-gym task (which has no
    such option), for a data set without an answer column, and for columns given from Python without a task."""
    from rlzoo.trainer.tasks import ReasoningGymTask

    accuracy = ["trl.rewards.accuracy_reward"]
    columns = {"answer": ["1"], "level": [0]}
    data = datasets.Dataset.from_dict({"prompt": ["q", "r"], "label": ["1", "2"], "level": [0, 1]})
    no_answers = DatasetTask(name="data.jsonl", dataset=data, answer_column=None, eval_size=0)
    with pytest.raises(ValueError, match=r"^reward function 'accuracy_reward' needs the data set column\(s\) "
                                         r"'solution', .*its columns: 'label', 'level' \(.*rename the column holding "
                                         r"it to 'solution'\)$") as dataset_error:
        RewardSet(accuracy, task=no_answers)(["q"], ["1"], columns={"label": ["1"], "level": [0]})
    gym = ReasoningGymTask(name="leg_counting", kwargs={}, eval_size=0)
    with pytest.raises(ValueError, match=r"^reward function 'accuracy_reward' needs the column\(s\) 'solution', "
                                         r"which task 'leg_counting' does not give reward functions; its columns: "
                                         r"'answer', 'level' \(choose a reward function") as gym_error:
        RewardSet(accuracy, task=gym)(["q"], ["1"], columns=columns)
    with pytest.raises(ValueError, match=r"^reward function 'accuracy_reward' needs the column\(s\) 'solution', "
                                         r"which were not given; the columns given: 'answer', 'level'") as no_task:
        RewardSet(accuracy)(["q"], ["1"], columns=columns)
    for error in (dataset_error, gym_error, no_task):
        assert "answer_column" not in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match=r"task 'data.jsonl' has none \(set --task.answer_column, or choose other"):
        RewardSet(["accuracy"], task=no_answers)

    class Unanswered(ReasoningGymTask):  # a task of one's own without reference answers
        has_answers = property(lambda self: False)

    with pytest.raises(ValueError, match=r"task 'leg_counting' has none \(choose other --reward-funcs\)$"):
        RewardSet(["accuracy"], task=Unanswered(name="leg_counting", eval_size=0))


def test_one_reward_function_is_taken_as_trls_reward_funcs_takes_it(tmp_path):
    """Trainer(config, reward_funcs=fn) without a list, as TRL's GRPOTrainer accepts it (a raw TypeError before)."""

    def length(prompts, completions, **kw):
        return [float(len(c)) for c in completions]

    trainer = Trainer(TrainConfig(**TINY, max_steps=1, output_dir=str(tmp_path / "run")), reward_funcs=length)
    assert trainer.rollouts.rewards.names == ("accuracy", "length")


def test_python_data_that_is_not_a_dataset_says_how_to_make_one(tmp_path):
    """A DatasetDict passed as train_dataset said "has no column 'prompt'; its columns: 'train'; choose one with
    --task.prompt_column" (the wrong fix); a list of rows raised AttributeError 'column_names'."""
    from rlzoo.trainer.config import TaskConfig
    from rlzoo.trainer.tasks import build_task

    rows = [{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(16)]
    with pytest.raises(TypeError, match=r"^train_dataset is a DatasetDict with the splits 'train', 'test': pass one "
                                        r"split, e.g. train_dataset=data\['train'\]"):
        build_task(TaskConfig(), train_dataset=datasets.DatasetDict(
            {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows)}))
    with pytest.raises(TypeError, match=r"^train_dataset must be a datasets.Dataset or IterableDataset, got list: "
                                        r"pass datasets.Dataset.from_list\(rows\)"):
        build_task(TaskConfig(), train_dataset=rows)
    with pytest.raises(TypeError, match=r"^eval_dataset must be .* got dict: pass datasets.Dataset.from_dict"):
        build_task(TaskConfig(), train_dataset=datasets.Dataset.from_list(rows), eval_dataset={"prompt": ["1 + 1 ="]})


def test_a_class_label_answer_is_compared_by_its_name():
    """A hub classification set's ``ClassLabel`` answer column holds ids: the held-out answer and the accuracy
    use the label's name (compared as the id's text, "positive" never matched "1"), while reward functions get the
    row's id as TRL passes it; training and held-out data labelled with other names are refused."""
    features = datasets.Features({"prompt": datasets.Value("string"),
                                  "answer": datasets.ClassLabel(names=["negative", "positive"])})
    data = datasets.Dataset.from_dict({"prompt": [f"review {i}" for i in range(10)], "answer": [0, 1] * 5},
                                      features=features)
    task = DatasetTask(name="reviews", dataset=data, eval_size=2)
    items = task.eval_items()
    assert {item.answer for item in items} <= {"negative", "positive"}
    for item in items:
        assert isinstance(item.columns["answer"], int)
        assert task.score(item.answer, item.columns) == 1.0 and task.score(str(item.columns["answer"]), item.columns) == 0.0
    other = datasets.Dataset.from_dict({"prompt": ["a"], "answer": [0]}, features=datasets.Features(
        {"prompt": datasets.Value("string"), "answer": datasets.ClassLabel(names=["bad", "good"])}))
    with pytest.raises(ValueError, match=r"^task 'reviews': the answer column 'answer' has different class labels"):
        DatasetTask(name="reviews", dataset=data, eval_dataset=other, eval_size=1)


def test_a_float32_answer_is_its_own_shortest_text():
    """A parquet file's float32 answer column reads as Python floats (float64): 0.9 became "0.8999999761581421",
    so the completion "0.9" scored 0. The answer is the text the column's dtype writes; float64 stays as it is."""
    features = datasets.Features({"prompt": datasets.Value("string"), "answer": datasets.Value("float32")})
    data = datasets.Dataset.from_dict({"prompt": [f"q{i}" for i in range(12)], "answer": [0.9, 1.5, 2.1, 0.1] * 3},
                                      features=features)
    items = DatasetTask(name="floats", dataset=data, eval_size=4).eval_items()
    assert items and {item.answer for item in items} <= {"0.1", "0.9", "1.5", "2.1"}
    big = datasets.Dataset.from_dict({"prompt": [f"q{i}" for i in range(12)], "answer": [1234567.0] * 12},
                                     features=features)
    assert {i.answer for i in DatasetTask(name="big", dataset=big, eval_size=2).eval_items()} == {"1234567.0"}
    # a float64 training split beside a float32 held-out one keeps its own text (123456789 is no float32)
    wide64 = datasets.Dataset.from_dict({"prompt": [f"t{i}" for i in range(8)], "answer": [123456789.0] * 8})
    mixed = DatasetTask(name="mixed", dataset=wide64, eval_dataset=big, eval_size=2)
    assert next(mixed.train_items()).answer == "123456789.0"
    wide = datasets.Dataset.from_dict({"prompt": [f"q{i}" for i in range(12)], "answer": [0.1 + 0.2] * 12})
    assert {item.answer for item in DatasetTask(name="f64", dataset=wide, eval_size=4).eval_items()} == {
        "0.30000000000000004"}  # float64: Python's own text


def test_reward_functions_score_the_held_out_set_as_trls_eval_reward(tmp_path):
    """A held-out set given to a task without an answer column was dropped with a warning, and reward functions never
    scored any held-out set (TRL 1.16 logs eval_reward and eval_rewards/NAME/mean). Now the run's reward functions
    score the greedy completions of the held-out set at every evaluation: ``eval/reward`` is the mean combined
    reward, ``eval/rewards/NAME/mean`` each function's (None ignored), a ``log_metric`` during the evaluation is
    ``eval/NAME`` and stays out of the training rows. Without answers no split is cut from the training rows."""
    import itertools

    train = datasets.Dataset.from_list([{"prompt": f"{i} + {i} =", "score": 0.5} for i in range(16)])
    held_out = datasets.Dataset.from_list([{"prompt": f"{i} - {i} =", "score": float(i)} for i in range(5)])

    def by_row(prompts, completions, score, log_metric, **kw):  # the row's own score: a known mean
        log_metric("seen", len(prompts))
        return [s if s != 3.0 else None for s in score]  # held-out row 3 unscored

    config = TrainConfig(**{**TINY, "eval_size": 5}, task_kwargs={"answer_column": None}, max_steps=2, eval_steps=1,
                         reward_funcs=("format",), output_dir=str(tmp_path / "run"))
    trainer = Trainer(config, train_dataset=train, eval_dataset=held_out, reward_funcs=[by_row])
    assert len(trainer.evaluator.task.eval_items) == 5 and trainer.evaluator.enabled
    history = trainer.train()
    assert [r["step"] for r in history] == [0, 1, 2]
    for row in history:
        assert "eval/accuracy" not in row
        assert row["eval/rewards/by_row/mean"] == pytest.approx((0 + 1 + 2 + 4) / 4)
        fmt = row["eval/rewards/format/mean"]  # 0 or 1 for each of the 5 completions
        assert row["eval/reward"] == pytest.approx((0 + 1 + 2 + 4 + 5 * fmt) / 5)  # row 3: format's alone
        assert row["eval/seen"] == pytest.approx(5 / 3)  # batches of 2, 2, 1 (eval_batch_size 2)
    for row in history[1:]:  # a training row's log_metric is its own generation's (8 completions), not the eval's
        assert row["seen"] == 8 and row["rewards/by_row/mean"] == 0.5
    assert "seen" not in history[0]
    without = DatasetTask(name="data.jsonl", dataset=train, answer_column=None, eval_size=3)
    assert without.eval_items() == []  # no split cut from the training rows without answers
    assert {i.question for i in itertools.islice(without.train_items(), 16)} == set(train["prompt"])


def test_the_reward_check_runs_on_a_training_row_and_a_held_out_set_lacking_a_column_is_said(tmp_path, caplog):
    """The start-up reward check ran on the first held-out row (helper trial): a held-out set without a column the
    training rows have (a test split without the metadata a reward reads) stopped a valid run, with an error saying
    the data set lacks it. The check runs on a training row; the held-out set is checked too, since the functions
    score it: with answers its reward is then not logged (a warning; accuracy is), without them it is an error."""
    import logging

    from rlzoo.trainer.reward_functions import RewardFunctionError

    train = datasets.Dataset.from_list([{"prompt": f"{i} + {i} =", "answer": str(2 * i), "extra": 1.0}
                                        for i in range(16)])
    held_out = datasets.Dataset.from_list([{"prompt": "1 + 1 =", "answer": "2"}])

    def needs_extra(completions, extra, **kw):
        return list(extra)

    config = TrainConfig(**TINY, max_steps=1, output_dir=str(tmp_path / "run"))
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        history = Trainer(config, train_dataset=train, eval_dataset=held_out, reward_funcs=[needs_extra]).train()
    assert "eval/accuracy" in history[-1] and "eval/reward" not in history[-1]
    assert history[-1]["rewards/needs_extra/mean"] == 1.0
    assert "the held-out reward (eval/reward) is not logged: on the held-out set reward function 'needs_extra'" \
        in caplog.text
    config = TrainConfig(**TINY, max_steps=1, task_kwargs={"answer_column": None}, reward_funcs=("format",),
                         output_dir=str(tmp_path / "no_answers"))
    with pytest.raises(RewardFunctionError, match=r"^on the held-out set, which the reward functions score "
                                                  r"\(eval/reward\): reward function 'needs_extra'"):
        Trainer(config, train_dataset=train, eval_dataset=held_out, reward_funcs=[needs_extra]).train()


def test_data_files_in_any_case_and_compressed_load_and_a_missing_path_says_so(tmp_path, capsys):
    """`.JSONL` and `.jsonl.gz` were refused as "unknown data file type" though datasets reads both, `--task ./nodir`
    reported a hub download failure, and `--task.answer_colum` had no did-you-mean (helper trial). rlzoo eval's
    samples carry the reference answer."""
    import gzip

    lines = "".join(json.dumps({"prompt": f"{i}+1?", "answer": str(i + 1)}) + "\n" for i in range(10))
    (tmp_path / "D.JSONL").write_text(lines)
    with gzip.open(tmp_path / "d.jsonl.gz", "wt") as fh:
        fh.write(lines)
    for name in ("D.JSONL", "d.jsonl.gz"):
        task = load_task(str(tmp_path / name), eval_size=2)
        assert [i.answer for i in task.eval_items()] and len(task.eval_items()) == 2
        assert main(["eval", "--model", "tiny-random", "--task", str(tmp_path / name), "--eval-size", "2",
                     "--max-completion-length", "2"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["n"] == 2 and {s["answer"] for s in result["samples"]} <= {str(i + 1) for i in range(10)}
    with gzip.open(tmp_path / "bad.jsonl.gz", "wb") as fh:  # datasets stored the byte and failed mid-run
        fh.write(b'{"prompt": "a", "answer": "1"}\n{"prompt": "\xff", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl\.gz:2: not UTF-8 text \(byte 0xff at column 13\)"):
        load_task(str(tmp_path / "bad.jsonl.gz"))
    from fsspec.utils import infer_compression

    (tmp_path / "d.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd not really")
    if infer_compression(str(tmp_path / "d.jsonl.zst")) is None:  # zstandard not installed: say so, not "not UTF-8"
        with pytest.raises(ValueError, match=r"reading \.zst files needs the zstandard package"):
            load_task(str(tmp_path / "d.jsonl.zst"))
    with pytest.raises(FileNotFoundError, match=r"^task path '\./no_such_dir' does not exist$"):
        load_task("./no_such_dir")
    with pytest.raises(ValueError, match=r"unknown data file type '\.txt'"):
        (tmp_path / "d.txt").write_text(lines)
        load_task(str(tmp_path / "d.txt"))
    with pytest.raises(ValueError, match=r"\['answer_colum'\] for data set task .* \(did you mean 'answer_column'\?\)"):
        load_task(str(tmp_path / "D.JSONL"), kwargs={"answer_colum": "answer"})


def test_a_chat_template_failure_is_one_line_saying_a_list_content_is_the_cause():
    """A conversational prompt whose content is a list of parts ({"type": "text", ...}, the multimodal format) ended
    in a Jinja traceback from the chat template (helper trial); it is one ValueError naming the likely cause."""
    _, tok = build_tiny_random()
    parts = [{"role": "user", "content": [{"type": "text", "text": "2 + 2?"}]}]
    with pytest.raises(ValueError, match=r"^the model's chat template failed on a conversational prompt \(TypeError: "
                                         r".*\); a message's content is not a string \(a list of parts"):
        render_prompt(tok, parts)


def test_a_template_without_a_system_role_and_system_prompt_is_one_line():
    """--system-prompt with a template that refuses a system role (Gemma's raise_exception) ended in a Jinja
    traceback on the built-in tasks' path (the data sets' path already said it in one line)."""
    from rlzoo.trainer.tasks.prompts import format_prompt

    _, tok = build_tiny_random()
    tok.chat_template = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
                         "{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert format_prompt(tok, "2 + 2?") == "2 + 2?"
    with pytest.raises(ValueError, match=r"^the model's chat template failed on the task's prompt \(TemplateError: "
                                         r"System role not supported\); --system-prompt adds a system message, which "
                                         r"this template may not take$"):
        format_prompt(tok, "2 + 2?", system_prompt="be brief")
    with pytest.raises(ValueError, match=r"failed on a conversational prompt \(TemplateError: System role not "
                                         r"supported\); --system-prompt added a system message"):
        render_prompt(tok, [{"role": "user", "content": "2 + 2?"}], "be brief")  # a data set's prompt, the same


def test_held_out_rewards_keep_the_evaluators_names_and_a_failure_drops_them_not_the_run(tmp_path, caplog):
    """Review findings: a reward's log_metric("accuracy") during an evaluation became eval/accuracy, posing as the
    held-out accuracy (or silently replaced); it stops the run naming the function, as training's clashes do. A
    function failing on a later held-out row (after the start-up check passed on the first) killed the training run
    though accuracy is its main result: for a task with answers eval/reward is dropped with a warning."""
    import logging

    from rlzoo.trainer.reward_functions import RewardFunctionError

    train = datasets.Dataset.from_list([{"prompt": f"{i} + {i} =", "answer": str(2 * i), "extra": 1.0}
                                        for i in range(16)])
    held_out = datasets.Dataset.from_list([{"prompt": f"{i} - 0 =", "answer": str(i),
                                            "extra": None if i == 3 else 1.0} for i in range(5)])

    def poser(completions, log_metric, **kw):
        log_metric("accuracy", 0.9)
        return [0.0] * len(completions)

    config = TrainConfig(**{**TINY, "eval_size": 5}, max_steps=1, task_kwargs={"answer_column": None},
                         reward_funcs=("format",), output_dir=str(tmp_path / "poser"))
    with pytest.raises(RewardFunctionError, match=r"reward function 'poser' logged the metric 'accuracy' with "
                                                  r"log_metric, but during an evaluation it is logged as eval/NAME"):
        Trainer(config, train_dataset=train, eval_dataset=held_out, reward_funcs=[poser]).train()

    def strict(completions, extra, **kw):
        return [float(e) for e in extra]  # float(None): TypeError on held-out row 3 only

    config = TrainConfig(**{**TINY, "eval_size": 5}, max_steps=1, output_dir=str(tmp_path / "strict"))
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        history = Trainer(config, train_dataset=train, eval_dataset=held_out, reward_funcs=[strict]).train()
    assert [r["step"] for r in history] == [0, 1] and all("eval/accuracy" in r for r in history)
    assert not any(key.startswith("eval/reward") for r in history for key in r)
    assert caplog.text.count("the held-out reward (eval/reward) is not logged: on the held-out set") == 2  # each
    assert "reward function 'strict' raised TypeError" in caplog.text


def _rank_zero_of_two(other_error: str):
    """Rank 0 of two, the other rank's collectives faked: it scored nothing and its reward function failed with
    ``other_error``."""
    from rlzoo.trainer.distributed import Distributed

    class RankZeroOfTwo(Distributed):
        def __init__(self) -> None:
            super().__init__(rank=0, world_size=2)

        def all_reduce(self, value, op="sum"):
            return value.detach().clone()

        def all_gather(self, value, *, pad_value=0):
            return value

        def all_gather_object(self, obj):  # the reward error; else the metrics logged (none there)
            return [obj, other_error if obj is None or isinstance(obj, str) else ({}, {})]

        def any(self, flag):
            return 1

        def _device(self):
            return torch.device("cpu")

    return RankZeroOfTwo()


def test_a_held_out_reward_failing_on_another_rank_is_said_with_its_error_and_dropped_on_every_rank(tmp_path, caplog):
    """Under torchrun rank 0 said only "a reward function failed on another rank's share" (user trial): the failing
    rank's error comes along, naming the rank. A reward function failing in the start-up check on one rank only
    dropped the held-out reward there alone, and the step-0 evaluation hung (rank 0 waited in its reward
    all-reduce): every rank drops it."""
    import logging

    from rlzoo.trainer.evaluation import greedy_accuracy

    other = "reward function 'strict' raised TypeError: float() argument must be a string or a real number"
    train = datasets.Dataset.from_list([{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(16)])
    held_out = datasets.Dataset.from_list([{"prompt": f"{i} - 0 =", "answer": str(i)} for i in range(4)])
    trainer = Trainer(TrainConfig(**{**TINY, "eval_size": 4}, max_steps=1, output_dir=str(tmp_path / "run")),
                      train_dataset=train, eval_dataset=held_out,
                      reward_funcs=[lambda completions, **kw: [float(len(c)) for c in completions]])
    evaluator = trainer.evaluator
    result = greedy_accuracy(trainer.model, evaluator.tokenizer, evaluator.task, evaluator.generator, batch_size=4,
                             dist=_rank_zero_of_two(other), rewards=evaluator.rewards)
    assert result.n == 2 and result.rewards == {}  # rank 0's share; the held-out reward dropped on every rank
    assert result.reward_error == f"{other} (on rank 1's share)"
    assert evaluator.rewards is not None
    evaluator.dist = _rank_zero_of_two(other)
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        evaluator.check_rewards()  # rank 0's functions score its first held-out problem; rank 1's failed
    assert evaluator.rewards is None
    assert f"the held-out reward (eval/reward) is not logged: on the held-out set {other} (on rank 1's share)" \
        in caplog.text


def test_task_kwargs_a_train_dataset_cannot_use_are_named_in_a_warning(caplog):
    """From Python, task_kwargs with train_dataset kept only the two column options and dropped the rest silently
    (eval_split, a reasoning-gym option, a typo of answer_column, which then failed as a missing column with the
    advice to set the option the user had set): a warning names them (not an error: an older run's config.json
    may hold such options, and its resume goes on). A split at its default is no change."""
    from rlzoo.trainer.config import TaskConfig
    from rlzoo.trainer.tasks.stream import build_task

    data = datasets.Dataset.from_dict({"prompt": [f"{i} + 1 =" for i in range(20)], "solution": [str(i + 1) for i in
                                                                                               range(20)]})
    for options, named in (({"eval_split": "train[:5]", "answer_column": "solution"}, "['eval_split']"),
                           ({"min_terms": 2, "answer_column": "solution"}, "['min_terms']")):
        caplog.clear()
        with caplog.at_level("WARNING", logger="rlzoo.train"):
            stream = build_task(TaskConfig(task_kwargs=options, eval_size=4), train_dataset=data)
        assert len(stream.eval_items) == 4
        assert f"task_kwargs {named} are not used: a train_dataset given from Python takes only prompt_column and " \
               "answer_column; split it yourself" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlzoo.train"), pytest.raises(ValueError, match="no column 'answer'"):
        build_task(TaskConfig(task_kwargs={"answer_colum": "solution"}, eval_size=4), train_dataset=data)
    assert "['answer_colum'] are not used: a train_dataset given from Python takes only prompt_column and " \
           "answer_column (did you mean 'answer_column'?)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlzoo.train"):
        build_task(TaskConfig(task_kwargs={"split": "train", "answer_column": "solution"}, eval_size=4),
                   train_dataset=data)
    assert "not used" not in caplog.text


def test_a_reward_named_both_in_the_config_and_in_trainer_warns_that_it_counts_twice(tmp_path, caplog):
    """TRL's habit, Trainer(reward_funcs=["accuracy", fn]), over TrainConfig's default reward_funcs ("accuracy",)
    counted accuracy twice (accuracy, accuracy_2) with only an INFO line, which Python shows no handler for (user
    trial): a warning (shown without logging set up) says so and how to keep only Trainer's."""
    import logging

    train = datasets.Dataset.from_list([{"prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(16)])

    def fn(completions, **kw):
        return [0.0] * len(completions)

    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        trainer = Trainer(TrainConfig(**TINY, max_steps=1, output_dir=str(tmp_path / "a")), train_dataset=train,
                          reward_funcs=["accuracy", fn])
    assert trainer.rollouts.rewards.names == ("accuracy", "accuracy_2", "fn")
    assert "reward function(s) 'accuracy' are named both in TrainConfig.reward_funcs ('accuracy',)" in caplog.text
    assert "TrainConfig(reward_funcs=()) keeps only Trainer's" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        Trainer(TrainConfig(**TINY, max_steps=1, reward_funcs=(), output_dir=str(tmp_path / "b")), train_dataset=train,
                reward_funcs=["accuracy", fn])
    assert "named both" not in caplog.text
