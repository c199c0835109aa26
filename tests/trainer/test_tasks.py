"""Tasks: deterministic streams, train/eval separation, JSONL files, prompt formatting, answer extraction."""

import itertools
import json

import pytest
from trl.data_utils import maybe_apply_chat_template

from rlzoo.registry import UnknownNameError
from rlzoo.trainer.models import build_tiny_random
from rlzoo.trainer.tasks import (
    EXTRACTIONS,
    DatasetTask,
    TaskStream,
    extract_answer,
    format_prompt,
    load_task,
    make_task,
    normalized_match,
    prompt_messages,
)
from rlzoo.trainer.tasks.base import TRAIN_CHUNK
from rlzoo.trainer.tasks.rows import RowOrigin

ONE_DIGIT = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
# many distinct problems: a repeated question means a repeated RNG state, not chance
WIDE = {"min_terms": 4, "max_terms": 5, "min_digits": 3, "max_digits": 4}


def _questions(items):
    return [item.question for item in items]


def test_same_seeds_same_items_different_seed_different_stream():
    a = load_task("chain_sum", kwargs=ONE_DIGIT, train_seed=3, eval_seed=7, eval_size=30)
    b = load_task("chain_sum", kwargs=ONE_DIGIT, train_seed=3, eval_seed=7, eval_size=30)
    c = load_task("chain_sum", kwargs=WIDE, train_seed=4, eval_seed=7, eval_size=30)
    d = load_task("chain_sum", kwargs=WIDE, train_seed=3, eval_seed=7, eval_size=30)
    assert a.eval_items() == b.eval_items() and len(a.eval_items()) == 30
    assert list(itertools.islice(a.train_items(), 50)) == list(itertools.islice(b.train_items(), 50))
    assert _questions(itertools.islice(c.train_items(), 50)) != _questions(
        itertools.islice(d.train_items(), 50)
    )
    assert [item.index for item in a.eval_items()] == list(range(30))


def test_eval_is_not_a_shifted_copy_of_the_train_stream():
    """reasoning-gym draws item i of seed s from Random(s + i): raw seeds 1 and 1000 share 1000+ items."""
    task = load_task("chain_sum", kwargs=WIDE, train_seed=1, eval_seed=1000, eval_size=200)
    overlap = task.eval_overlap(3000)
    assert overlap["eval_seen"] == 0.0 and overlap["train_in_eval"] == 0.0
    assert overlap["eval_distinct"] == 1.0


def test_train_chunk_sharing_rng_states_with_eval_is_skipped(monkeypatch):
    seeds = {("eval", 0): 5000, ("train", 0, 0): 5000 - 10, ("train", 0, 1): 90_000, ("train", 0, 2): 3000}
    monkeypatch.setattr("rlzoo.trainer.tasks.reasoning_gym_source.derive_seed", lambda *parts: seeds[parts])
    task = load_task("chain_sum", kwargs=WIDE, train_seed=0, eval_seed=0, eval_size=20)
    assert list(itertools.islice(task.train_chunk_seeds(), 2)) == [90_000, 3000]
    import reasoning_gym

    reference = reasoning_gym.create_dataset("chain_sum", seed=90_000, size=3, **WIDE)
    first = next(task.train_items())
    assert first.question == reference[0]["question"] and first.index == 0


def test_resume_from_any_position_including_chunk_boundaries():
    task = load_task("chain_sum", kwargs=WIDE, eval_size=5)
    stream = list(itertools.islice(task.train_items(), TRAIN_CHUNK + 5))
    for start in (0, 7, TRAIN_CHUNK - 2, TRAIN_CHUNK):
        resumed = list(itertools.islice(task.train_items(start=start), 4))
        assert resumed == stream[start : start + 4]
        assert [item.index for item in resumed] == list(range(start, start + 4))
    with pytest.raises(ValueError, match="start"):
        next(task.train_items(start=-1))


def test_one_digit_chain_sum_repeats_problems_and_exclusion_removes_them():
    plain = load_task("chain_sum", kwargs=ONE_DIGIT, eval_size=200)
    overlap = plain.eval_overlap(500)
    assert overlap["eval_distinct"] < 0.8  # only 200 distinct problems exist
    assert overlap["eval_seen"] > 0.8
    excluded = load_task("chain_sum", kwargs=ONE_DIGIT, eval_size=200, exclude_eval_questions=True)
    assert excluded.eval_items() == plain.eval_items()
    assert excluded.eval_overlap(500)["train_in_eval"] == 0.0


def test_exclusion_with_no_problem_left_raises(monkeypatch):
    monkeypatch.setattr("rlzoo.trainer.tasks.base.MAX_SKIPPED", 300)
    task = load_task("chain_sum", kwargs=ONE_DIGIT, eval_size=3000, exclude_eval_questions=True)
    with pytest.raises(ValueError, match="covers the problem space"):
        next(task.train_items())


def test_reasoning_gym_scorer_and_columns():
    task = load_task("chain_sum", kwargs=ONE_DIGIT, eval_size=3)
    item = task.eval_items()[0]
    assert set(item.columns) == {"question", "answer", "metadata"}
    assert item.columns["answer"] == item.answer
    assert task.score(item.answer, item.columns) == 1.0
    assert task.score(None, item.columns) == 0.0
    assert task.score(str(int(item.answer) + 1), item.columns) == 0.0
    assert task.score_completions([f" The answer is {item.answer}."], [item.columns], "last_number") == [1.0]
    with pytest.raises(ValueError, match="2 completions but 1 rows"):
        task.score_completions(["1", "2"], [item.columns])


def test_unknown_task_and_bad_options():
    with pytest.raises(UnknownNameError, match="available:.*chain_sum"):
        load_task("chain_summ")
    with pytest.raises(ValueError, match="unknown option.*'max_term'.*valid: .*max_terms"):
        load_task("chain_sum", kwargs={"max_term": 3})
    with pytest.raises(ValueError, match="use train_seed / eval_seed / eval_size"):
        load_task("chain_sum", kwargs={"seed": 3})
    with pytest.raises(ValueError, match="invalid options"):
        load_task("chain_sum", kwargs={"min_terms": 5, "max_terms": 2})
    with pytest.raises(ValueError, match="eval_size"):
        load_task("chain_sum", eval_size=-1)


@pytest.mark.parametrize("task, option, value, message", [
    ("chain_sum", "min_terms", "abc", "min_terms (--task.min_terms) must be an integer, got 'abc'"),
    ("chain_sum", "min_terms", 2.5, "min_terms (--task.min_terms) must be an integer, got 2.5"),
    ("chain_sum", "max_terms", True, "max_terms (--task.max_terms) must be an integer, got True"),
    ("chain_sum", "allow_negation", 3, "allow_negation (--task.allow_negation) must be true or false, got 3"),
    ("basic_arithmetic", "whitespace", "tab",
     "whitespace (--task.whitespace) must be one of 'no_space', 'single', 'random', got 'tab'"),
])
def test_a_reasoning_gym_option_of_the_wrong_type_is_named_with_what_it_takes(task, option, value, message):
    """`--task.min_terms abc` showed Python's "'>' not supported between instances of 'str' and 'int'"."""
    with pytest.raises(ValueError) as refused:
        load_task(task, kwargs={option: value})
    assert str(refused.value) == f"task option {message}"


def test_every_reasoning_gym_default_passes_the_option_type_check():
    """The check follows the config dataclasses' annotations, and accepts a value of its default's type where the
    annotation says otherwise (rearc's diff_ub: int, default 0.2), so no valid option is refused."""
    import dataclasses

    from reasoning_gym.factory import DATASETS

    from rlzoo.trainer.tasks.reasoning_gym_source import _check_option_type

    for _, config_cls in DATASETS.values():
        for field in dataclasses.fields(config_cls):
            if field.default is not dataclasses.MISSING:
                _check_option_type(config_cls, field.name, field.default)
    _check_option_type(DATASETS["rearc"][1], "diff_ub", 0.3)
    assert load_task("chain_sum", kwargs={"min_terms": 2, "max_terms": 3, "allow_negation": True}, eval_size=2)


def _write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_jsonl_task_split_stream_and_columns(tmp_path):
    rows = [{"prompt": f"q{i}?", "answer": i, "difficulty": i % 3} for i in range(25)]
    path = _write_jsonl(tmp_path / "t.jsonl", [*rows[:10], "", *rows[10:]])  # a blank line is skipped
    task = load_task(path, eval_size=5, train_seed=2, eval_seed=9)
    assert isinstance(task, DatasetTask) and task.name == path
    evals = task.eval_items()
    assert len(evals) == 5 and [item.index for item in evals] == list(range(5))
    train = list(itertools.islice(task.train_items(), 40))
    assert set(_questions(train[:20])) == {r["prompt"] for r in rows} - set(_questions(evals))  # one epoch
    assert not set(_questions(train)) & set(_questions(evals))
    assert train == list(
        itertools.islice(load_task(path, eval_size=5, train_seed=2, eval_seed=9).train_items(), 40)
    )
    assert list(itertools.islice(task.train_items(start=13), 5)) == train[13:18]
    item = evals[0]
    assert item.columns == {"answer": int(item.answer), "difficulty": int(item.answer) % 3}  # TRL's columns, as read
    assert item.prompt == item.question  # standard format: the string itself
    assert task.score(item.answer, item.columns) == 1.0 and task.score("nope", item.columns) == 0.0


def test_a_missing_answer_column_names_the_columns_and_the_option(tmp_path):
    path = _write_jsonl(tmp_path / "t.jsonl", [{"prompt": "a", "solution": "1"}, {"prompt": "b", "solution": "2"}])
    with pytest.raises(ValueError, match=r"no column 'answer'; its columns: 'prompt', 'solution'; choose one "
                                         r"with --task.answer_column"):
        load_task(path, eval_size=0)
    task = load_task(path, kwargs={"answer_column": "solution"}, eval_size=0)
    assert task.eval_items() == [] and next(task.train_items()).answer in ("1", "2")
    no_answers = load_task(path, kwargs={"answer_column": None}, eval_size=5)
    assert not no_answers.has_answers and no_answers.eval_items() == []  # nothing to score: no held-out set


def test_jsonl_bad_json_line_number(tmp_path):
    path = _write_jsonl(
        tmp_path / "t.jsonl", [{"prompt": "a", "answer": "1"}, "", '{"prompt": "b", "answer": ']
    )
    with pytest.raises(ValueError, match=r"t.jsonl:3: invalid JSON"):
        load_task(path, eval_size=0)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": 3, "answer": "1"}', (r"the prompt column 'prompt' is 3 \(int\); every row needs a prompt: a string "
                                         r"or a list of \{'role', 'content'\} messages")),
        ('{"prompt": [], "answer": "1"}', r"the prompt column 'prompt' is \[\] \(list\)"),
    ],
)
def test_jsonl_bad_rows(tmp_path, line, message):
    path = _write_jsonl(tmp_path / "t.jsonl", [line, line])
    with pytest.raises(ValueError, match=rf"t.jsonl' row 0 \(line 1\): {message}"):
        load_task(path, eval_size=0)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": " ", "answer": "1"}', "the prompt column 'prompt' is empty; every row needs a prompt"),
        ('{"answer": "1"}', r"the prompt column 'prompt' is missing \(the row has no 'prompt' key\)"),
        ('{"prompt": null, "answer": "1"}', r"the prompt column 'prompt' is missing \(null\)"),
        ('{"prompt": "x", "answer": null}', (r"the answer column 'answer' is missing \(null\); every row needs an "
                                            r"answer \(a string, a number or a bool\) for the accuracy: fix or remove the row$")),
        ('{"prompt": "x"}', r"the answer column 'answer' is missing \(the row has no 'answer' key\)"),
        ('{"prompt": "x", "answer": ""}', "the answer column 'answer' is empty"),
    ],
)
def test_a_bad_row_is_refused_at_load_naming_its_file_row_and_line(tmp_path, line, message):
    """A bad row used to fail only when the shuffled training stream reached it (after some steps, and at the same
    row again after a resume), named by its stream position ("row 5" for the file's row 7): every row is checked
    when the task loads, named as the file numbers it (0-based row; its line, blank lines counted)."""
    good = [{"prompt": f"q{i}", "answer": str(i)} for i in range(19)]
    path = _write_jsonl(tmp_path / "t.jsonl", [*good[:3], "", *good[3:7], line, *good[7:]])
    with pytest.raises(ValueError, match=rf"^task file '.*t.jsonl' row 7 \(line 9\): {message}"):
        load_task(path, eval_size=4)


def test_a_list_or_dict_answer_is_refused_and_a_bool_is_scored_as_its_text(tmp_path):
    """A list-valued answer column was compared as its Python text ("['0', 'n0']"), so the accuracy was always 0:
    refused when the task loads (a file, a Dataset, a stream), naming the column, the row and the type. Strings,
    numbers and bools are compared as their text (a bool casefolded: a completion "True" or "true" matches)."""
    import datasets

    rows = [{"prompt": f"q{i}", "answer": [str(i), f"n{i}"]} for i in range(10)]
    path = _write_jsonl(tmp_path / "t.jsonl", rows)
    with pytest.raises(ValueError, match=r"^task file '.*t.jsonl' row 0 \(line 1\): the answer column 'answer' "
                                         r"holds a list \(\['0', 'n0'\]\), not a string, a number or a bool"):
        load_task(path, eval_size=2)
    nested = datasets.Dataset.from_list([{"prompt": "q", "answer": None}, {"prompt": "q", "answer": {"value": 1}}])
    with pytest.raises(ValueError, match=r"^data set 'x' row 1: the answer column 'answer' holds a dict"):
        DatasetTask(name="x", dataset=nested, eval_size=0)
    stream = datasets.Dataset.from_list(rows).to_iterable_dataset()
    with pytest.raises(ValueError, match=r"^data set 'x' row 0: the answer column 'answer' holds a list"):
        DatasetTask(name="x", dataset=stream, eval_size=0)
    flags = DatasetTask(name="x", dataset=datasets.Dataset.from_list([{"prompt": f"q{i}", "answer": i % 2 == 0}
                                                                      for i in range(10)]), eval_size=2)
    item = flags.eval_items()[0]
    assert flags.score("True" if item.columns["answer"] else "false", item.columns) == 1.0


def test_a_json_file_column_of_mixed_types_is_checked_by_its_values(tmp_path):
    """A .jsonl answer column mixing strings and numbers ("5", 6) loads as datasets' Json column: it was refused
    as "holds a str ('5'), not a string, a number or a bool"; its decoded values are checked instead, so such a
    file trains and a list among them, a blank answer or a bad prompt in a mixed prompt column is still refused."""
    rows = [{"prompt": f"q{i}", "answer": str(i) if i % 2 else i} for i in range(10)]
    task = load_task(_write_jsonl(tmp_path / "mixed.jsonl", rows), eval_size=2)
    assert {item.answer for item in task.eval_items()} <= {str(i) for i in range(10)}
    for bad, message in (({"answer": [1]}, r"the answer column 'answer' holds a list \(\[1\]\)"),
                         ({"answer": " "}, "the answer column 'answer' is empty"),
                         ({"answer": None}, "the answer column 'answer' is missing"),
                         ({"prompt": 7}, r"the prompt column 'prompt' is 7 \(int\)")):
        path = _write_jsonl(tmp_path / "bad.jsonl", [*rows[:6], {**rows[6], **bad}, *rows[7:]])
        with pytest.raises(ValueError, match=rf"^task file '.*bad.jsonl' row 6 \(line 7\): {message}"):
            load_task(path, eval_size=2)


def test_a_csv_cell_that_pandas_reads_as_missing_is_named_as_such(tmp_path):
    """pandas reads NA, null, None, ... as missing: the error said "is empty" of a cell that held text."""
    for cell, what in (("NA", (r"'NA', which the CSV reader \(pandas\) reads as missing \(a .jsonl or .parquet file "
                              r"keeps such a value as text\)")),
                       ("null", "'null', which the CSV reader"), ("None", "'None', which the CSV reader"),
                       ("", r"empty \(an empty cell\)")):
        path = tmp_path / "t.csv"
        path.write_text("prompt,answer\n" + "".join(f"q{i},{i}\n" for i in range(5)) + f"q5,{cell}\n"
                        + "".join(f"q{i},{i}\n" for i in range(6, 10)))
        with pytest.raises(ValueError, match=rf"^task file '.*t.csv' row 5 \(line 7\): the answer column 'answer' is "
                                             rf"{what}"):
            load_task(str(path), eval_size=2)


def test_a_bad_row_of_a_python_data_set_or_stream_is_named_by_its_row():
    """A Dataset is checked whole at construction (its held-out set too); a stream as it is read, named by the
    stream's row (held-out rows skipped at its head counted), not the position in the training stream."""
    import datasets

    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(10)]
    bad = datasets.Dataset.from_list([*rows[:6], {"prompt": "q6", "answer": None}, *rows[7:]])
    with pytest.raises(ValueError, match=r"^train_x row 6: the answer column 'answer' is missing \(null\)"):
        DatasetTask(name="x", dataset=bad, eval_size=0, origin=RowOrigin("train_x"))
    with pytest.raises(ValueError, match=r"^data set 'x' \(held out\) row 6: the answer column"):
        DatasetTask(name="x", dataset=datasets.Dataset.from_list(rows), eval_dataset=bad, eval_size=8)
    DatasetTask(name="x", dataset=datasets.Dataset.from_list(rows), eval_dataset=bad, eval_size=6)  # rows unused
    longer = [*rows, *({"prompt": f"q{i}", "answer": str(i)} for i in range(10, 20))]
    longer[15]["answer"] = None
    task = DatasetTask(name="x", dataset=datasets.Dataset.from_list(longer).to_iterable_dataset(), eval_size=2)
    items = task.train_items()  # the stream's head (10 rows, read for the held-out set) was checked: good
    assert [next(items).question for _ in range(13)][-1] == "q14"
    with pytest.raises(ValueError, match=r"^data set 'x' row 15: the answer column 'answer' is missing \(null\)"):
        next(items)


def test_a_conversational_prompt_may_hold_a_tool_calls_turn_without_content():
    """An assistant turn that only calls a tool has content None (the chat format's tool_calls): accepted, as
    before the rows were checked at load; a turn with neither is refused."""
    from rlzoo.trainer.tasks.rows import row_problem

    call = {"role": "assistant", "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]}
    prompt = [{"role": "user", "content": "1 + 2?"}, call, {"role": "tool", "content": "3"}]
    assert row_problem({"prompt": prompt, "answer": "3"}, "prompt", "answer") is None
    bare = [{"role": "user", "content": "1 + 2?"}, {"role": "assistant", "content": None}]
    assert row_problem({"prompt": bare, "answer": "3"}, "prompt", "answer")[0] == "prompt"


def test_a_task_only_evaluated_holds_out_eval_size_rows_without_the_cap(tmp_path, caplog):
    """evaluation_only (rlzoo eval): nothing trains, so the held-out set takes up to eval_size rows, all of a small
    file; the seeded order is the training task's, so its capped held-out set is a prefix. A stream alike."""
    import datasets

    path = _write_jsonl(tmp_path / "t.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(20)])
    with caplog.at_level("WARNING", logger="rlzoo.train"):
        task = load_task(path, eval_size=200, evaluation_only=True)
        assert len(load_task(path, eval_size=15, evaluation_only=True).eval_items()) == 15
    assert len(task.eval_items()) == 20 and "capped" not in caplog.text
    assert _questions(task.eval_items())[:4] == _questions(load_task(path, eval_size=200).eval_items())
    with pytest.raises(ValueError, match="is only evaluated.*none is left for training"):
        next(task.train_items())
    stream = datasets.Dataset.from_list([{"prompt": f"q{i}", "answer": str(i)} for i in range(20)]).to_iterable_dataset()
    assert len(DatasetTask(name="s", dataset=stream, eval_size=200, evaluation_only=True).eval_items()) == 20


def test_a_split_takes_datasets_split_syntax(tmp_path, caplog):
    """--task.split "train[:10]" was refused ("has no split"): datasets' split syntax (slices, percents, +) is read
    with datasets.ReadInstruction, for a data file (its one split, train), a saved DatasetDict and a saved Dataset;
    an error in a slice names its row as the file numbers it."""
    import datasets

    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(20)]
    path = _write_jsonl(tmp_path / "t.jsonl", rows)
    task = load_task(path, kwargs={"split": "train[5:]", "eval_split": "train[:5]"}, eval_size=3)
    assert task.dataset["prompt"] == [f"q{i}" for i in range(5, 20)]
    assert _questions(task.eval_items()) == ["q0", "q1", "q2"]
    assert len(load_task(path, kwargs={"split": "train[:50%]+train[-2:]"}, eval_size=0).dataset) == 12
    with caplog.at_level("WARNING", logger="rlzoo.train"):
        load_task(path, kwargs={"split": "train[:10]", "eval_split": "train[5:15]"}, eval_size=2)
    assert "--task.eval_split train[5:15] and --task.split train[:10] share 5 rows" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlzoo.train"):  # the whole split trains: every held-out row is shared
        load_task(path, kwargs={"eval_split": "train[:4]"}, eval_size=2)
    assert "--task.eval_split train[:4] and --task.split train share 4 rows" in caplog.text
    bad = _write_jsonl(tmp_path / "bad.jsonl", [*rows[:7], {"prompt": "q7"}, *rows[8:]])
    with pytest.raises(ValueError, match=r"^task file '.*bad.jsonl' row 7 \(line 8\): the answer column"):
        load_task(bad, kwargs={"split": "train[5:]"}, eval_size=0)
    assert len(load_task(bad, kwargs={"split": "train[:7]+train[8:]"}, eval_size=0).dataset) == 19
    for split, message in (("train[x]", r"'train\[x\]' is not valid in datasets' split syntax \(Unrecognized"),
                           ("train[:0]", r"'train\[:0\]' selects no row \(its splits: train has 20\)"),
                           ("test[:5]", r"has no split 'test\[:5\]'; its splits: train")):
        with pytest.raises(ValueError, match=message):
            load_task(path, kwargs={"split": split}, eval_size=0)
    saved = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:15]),
                                  "test": datasets.Dataset.from_list(rows[15:])})
    saved.save_to_disk(str(tmp_path / "dict"))
    task = load_task(str(tmp_path / "dict"), kwargs={"split": "train[:10]", "eval_split": "test[:3]"}, eval_size=5)
    assert len(task.dataset) == 10 and _questions(task.eval_items()) == ["q15", "q16", "q17"]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "one"))
    task = load_task(str(tmp_path / "one"), kwargs={"split": "train[10:]", "eval_split": "train[:10]"}, eval_size=2)
    assert task.dataset["prompt"] == [f"q{i}" for i in range(10, 20)] and _questions(task.eval_items()) == ["q0", "q1"]


def test_eval_size_is_capped_and_path_errors(tmp_path, caplog):
    path = _write_jsonl(tmp_path / "t.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(20)])
    with caplog.at_level("WARNING", logger="rlzoo.train"):
        task = load_task(path, eval_size=200)
    assert len(task.eval_items()) == 4 and "capped at 4 rows" in caplog.text  # 20 % of the rows, never more
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['x'\] for data set task.*valid: split"):
        load_task(path, kwargs={"x": 1})
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_task(str(tmp_path / "missing.jsonl"))
    (tmp_path / "header.csv").write_text("prompt,answer\n")  # was datasets' 'Instruction "train" corresponds to...'
    with pytest.raises(ValueError, match=r"^task file .*header.csv has no rows \(a header at most\)$"):
        load_task(str(tmp_path / "header.csv"))


@pytest.mark.parametrize(
    ("answer", "reference", "expected"),
    [
        (" Paris ", "paris", 1.0),
        ("New   York", "new york", 1.0),
        ("1,000.0", "1000", 1.0),
        ("+3.", "3", 1.0),
        ("-4", "4", 0.0),
        ("", "", 0.0),
        (None, "1", 0.0),
        ("London", "Paris", 0.0),
        ("3,4", "34", 0.0),  # a comma that groups no thousands is no number (it scored 1.0)
        ("1,00", "100", 0.0),
        ("-12,345.5", "-12345.5", 1.0),
        ("12,345,678", "12345678", 1.0),
    ],
)
def test_normalized_match(answer, reference, expected):
    assert normalized_match(answer, reference) == expected


@pytest.mark.parametrize(
    ("completion", "extraction", "expected"),
    [
        ("  -4 \n", "full", "-4"),
        ("   \n", "full", None),
        ("\n\n The answer is 3.\nMore", "first_line", "The answer is 3."),
        ("", "first_line", None),
        ("5 - 9 = -4", "first_number", "5"),
        ("5 - 9 = -4", "last_number", "-4"),
        ("4-1=3", "first_number", "4"),
        ("4-1=3", "last_number", "3"),
        ("Total: 1,234.5 apples", "last_number", "1,234.5"),
        ("x = -12.", "last_number", "-12"),
        ("no digits", "last_number", None),
        ("<answer>1</answer> then <answer> 7 </answer>", "tag", "7"),
        ("7", "tag", None),
    ],
)
def test_extract_answer(completion, extraction, expected):
    assert extract_answer(completion, extraction) == expected


def test_extract_answer_unknown():
    with pytest.raises(UnknownNameError, match="valid: " + ", ".join(EXTRACTIONS)):
        extract_answer("1", "number")


def test_a_misspelt_answer_extraction_gets_a_did_you_mean():
    """`--answer-extraction lastnumber` listed the valid names without the did-you-mean other names get."""
    from rlzoo.trainer.reward_functions import accuracy_reward

    task = load_task("chain_sum", kwargs=ONE_DIGIT, eval_size=4)
    for refuse, field in ((lambda name: make_task("chain_sum", ONE_DIGIT, eval_size=4, answer_extraction=name),
                           "answer_extraction"),
                          (lambda name: extract_answer("1", name), "answer extraction"),
                          (lambda name: accuracy_reward(task, name), "answer extraction")):
        with pytest.raises(UnknownNameError, match=rf"^unknown {field} 'lastnumber'; did you mean 'last_number'\?; "
                           rf"valid: {', '.join(EXTRACTIONS)}$"):
            refuse("lastnumber")
    with pytest.raises(UnknownNameError, match=r"^unknown answer_extraction 'regex'; valid: "):  # nothing close
        make_task("chain_sum", ONE_DIGIT, eval_size=4, answer_extraction="regex")


@pytest.mark.parametrize("system_prompt", [None, "Answer with a number only."])
def test_format_prompt_matches_trl(system_prompt):
    _, tok = build_tiny_random()
    question = "State the final answer to the following arithmetic problem: 4 - 1 ="
    ours = format_prompt(tok, question, system_prompt)
    theirs = maybe_apply_chat_template({"prompt": prompt_messages(question, system_prompt)}, tok)["prompt"]
    assert ours == theirs
    assert ours.endswith("<|im_start|>assistant\n")
    assert ("You are a helpful AI assistant named SmolLM" in ours) == (system_prompt is None)
    # TRL 1.16 GRPOTrainer tokenizes with apply_chat_template(tokenize=True) = add_special_tokens=False
    trl_ids = tok.apply_chat_template(
        [prompt_messages(question, system_prompt)],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )["input_ids"][0]
    assert tok(ours, add_special_tokens=False)["input_ids"] == list(trl_ids)


def test_format_prompt_without_chat_template():
    _, tok = build_tiny_random()
    tok.chat_template = None
    assert format_prompt(tok, "2 + 2 =") == "2 + 2 ="
    with pytest.raises(ValueError, match="chat_template"):
        format_prompt(tok, "2 + 2 =", "system")


def test_a_mistyped_data_file_name_gets_a_did_you_mean(tmp_path, monkeypatch):
    """--task data.jsnol (an existing file's name mistyped) listed the 106 reasoning-gym tasks and nothing else."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.jsonl").write_text('{"prompt": "q", "answer": "1"}\n')
    with pytest.raises(UnknownNameError, match=r"^unknown task 'data.jsnol': .*; did you mean 'data.jsonl'\?; available"):
        make_task("data.jsnol", {}, eval_size=0)


@pytest.mark.parametrize("extraction", ["full", "tag", "last_number"])
def test_a_task_scored_by_verification_is_not_called_unscorable(extraction):
    """graph_color's and propositional_logic's answers are None (reasoning-gym verifies a completion instead): the
    start-up check read the string 'None' as the answer and warned that nothing could score (reviewer). A task whose
    answers are text does warn under last_number, and not under full."""
    for name in ("graph_color", "propositional_logic"):
        assert make_task(name, {}, eval_size=4, answer_extraction=extraction).unscorable_answers() is None
    words = make_task("spell_backward", {}, eval_size=4, answer_extraction=extraction).unscorable_answers()
    assert (words is not None) == (extraction == "last_number"), words


def test_a_resume_on_a_stream_warns_that_it_cannot_be_checked(caplog):
    """An IterableDataset has no length or digest: a resume on another stream continued silently (helper trial:
    a 7-row stream after a 40-row one). It warns; a Dataset that is the checkpoint's says nothing."""
    import logging

    import datasets

    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(12)]
    for data, warned in [(datasets.IterableDataset.from_generator(lambda: iter(rows)), True),
                         (datasets.Dataset.from_list(rows), False)]:
        stream = TaskStream(DatasetTask(name="data", dataset=data, eval_size=2))
        stream.next_train(3)
        state = json.loads(json.dumps(stream.state_dict()))
        resumed = TaskStream(DatasetTask(name="data", dataset=data, eval_size=2))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
            resumed.load_state_dict(state)
            TaskStream(DatasetTask(name="data", dataset=data, eval_size=2)).load_state_dict(state, warn=False)
        assert [r.getMessage() for r in caplog.records] == ([
            ("resume: data set data is a stream (an IterableDataset), which cannot be checked against the one the "
            "checkpoint trained on: the run goes on from its row 3")] if warned else [])


def test_task_stream_cursor_state_and_scoring():
    stream = make_task("chain_sum", ONE_DIGIT, train_seed=5, eval_size=4, answer_extraction="last_number")
    first = stream.next_train(3) + stream.next_train(2)
    assert first == list(itertools.islice(stream.task.train_items(), 5))
    state = json.loads(json.dumps(stream.state_dict()))  # JSON-able, as checkpoints store it
    assert state["position"] == 5
    upcoming = stream.next_train(4)
    resumed = make_task("chain_sum", ONE_DIGIT, train_seed=5, eval_size=4, answer_extraction="last_number")
    resumed.load_state_dict(state)
    assert resumed.next_train(4) == upcoming
    other = make_task("chain_sum", ONE_DIGIT, train_seed=6, eval_size=4)
    with pytest.raises(ValueError, match="different training stream: train_seed=5"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="position"):
        resumed.load_state_dict({**state, "position": -1})
    item = stream.eval_items[0]
    assert stream.score(f"So the answer is {item.answer}.", item) == 1.0
    assert stream.question(item) == item.question
    _, tok = build_tiny_random()
    assert stream.prompt(tok, item) == format_prompt(tok, item.question)
    with pytest.raises(UnknownNameError, match="unknown answer_extraction"):
        make_task("chain_sum", ONE_DIGIT, eval_size=4, answer_extraction="number")
