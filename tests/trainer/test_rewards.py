"""Reward functions: TRL's signature, module:function loading, the RewardSet's checks, weights and None."""

import math
import sys
import textwrap

import pytest
import torch
from trl.trainer.utils import nanstd as trl_nanstd

from rlzoo.registry import UnknownNameError
from rlzoo.trainer.reward_loading import recorded_module_reward
from rlzoo.trainer.rewards import (
    RewardFunction,
    RewardFunctionError,
    RewardSet,
    accuracy_reward,
    format_reward,
    load_reward_function,
    nanstd,
)
from rlzoo.trainer.tasks import load_task, make_task

ONE_DIGIT = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


@pytest.fixture(scope="module")
def task():
    return load_task("chain_sum", kwargs=ONE_DIGIT, eval_size=4)


def _columns(items):
    return {key: [item.columns[key] for item in items] for key in items[0].columns}


def test_accuracy_reward_has_trls_signature_and_scores(task):
    items = task.eval_items()
    completions = [f"{items[0].answer}", f"It is {items[1].answer}", "", f"{int(items[3].answer) + 1}"]
    fn = accuracy_reward(task, "last_number")
    assert isinstance(fn, RewardFunction) and fn.__name__ == "accuracy"
    # called exactly as TRL 1.16 GRPOTrainer._calculate_rewards calls it
    values = fn(prompts=["p"] * 4, completions=completions, completion_ids=[[1]] * 4, **_columns(items))
    assert values == [1.0, 1.0, 0.0, 0.0]
    full = accuracy_reward(task, "full")(prompts=["p"] * 4, completions=completions, **_columns(items))
    assert full[0] == 1.0 and 0.0 < full[1] < 1.0  # reasoning-gym's partial credit for "It is 3"
    with pytest.raises(UnknownNameError, match="valid: full"):
        accuracy_reward(task, "bogus")


@pytest.mark.parametrize(
    ("style", "completion", "expected"),
    [
        ("number", " -12 ", 1.0),
        ("number", "1,234.5.", 1.0),
        ("number", "The answer is 3", 0.0),
        ("number", "3\n4", 0.0),
        ("tag", "<answer>3</answer>", 1.0),
        ("tag", "<think>\n1 + 2\n</think>\n<answer>3</answer>\n", 1.0),
        ("tag", "<answer>3</answer> extra", 0.0),
        ("tag", "<think>a</think><think>b</think><answer>3</answer>", 0.0),
        ("tag", "3", 0.0),
    ],
)
def test_format_reward(style, completion, expected):
    assert format_reward(style)(prompts=["p"], completions=[completion]) == [expected]


def test_format_reward_unknown_style():
    with pytest.raises(UnknownNameError, match="valid: number, tag"):
        format_reward("json")


def test_load_reward_function_from_module_and_file(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent(
            """
            def length_reward(prompts, completions, **kwargs):
                return [float(len(c)) for c in completions]
            NOT_CALLABLE = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = load_reward_function("my_rewards:length_reward")
    assert fn(prompts=["p"], completions=["abc"]) == [3.0]
    from_file = load_reward_function(f"{tmp_path / 'my_rewards.py'}:length_reward")
    assert from_file(prompts=["p"], completions=["ab"]) == [2.0]
    with pytest.raises(RewardFunctionError, match="no attribute 'lenght_reward'.*length_reward"):
        load_reward_function("my_rewards:lenght_reward")
    with pytest.raises(RewardFunctionError, match="'NOT_CALLABLE' is a int, not callable"):
        load_reward_function("my_rewards:NOT_CALLABLE")
    with pytest.raises(ImportError, match="no module named 'no_such_reward_module'"):
        load_reward_function("no_such_reward_module:f")
    with pytest.raises(ImportError, match="does not exist"):
        load_reward_function(f"{tmp_path / 'missing.py'}:f")
    assert load_reward_function("my_rewards.length_reward") is fn  # TRL's dotted spelling
    with pytest.raises(ValueError, match="must be 'module:function'"):
        load_reward_function("not a reward")
    # a file without ':function' looked like a hub id ("dir/file.py"): "cannot load reward model ... not a valid
    # JSON file"; it says to name the function and lists the file's
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rw").mkdir()
    (tmp_path / "rw" / "rewards.py").write_text("def length_reward(completions, **kwargs):\n    return [1.0]\n")
    with pytest.raises(RewardFunctionError, match=r"^reward function 'rw/rewards.py' is a Python file: name the "
                                                  r"function in it, 'rw/rewards.py:FUNCTION'; its public callables: "
                                                  r"length_reward$"):
        load_reward_function("rw/rewards.py")
    with pytest.raises(RewardFunctionError, match=r"^reward function 'rw/missing.py' is a Python file: .*'rw/missing.py'"
                                                  r" does not exist$"):
        load_reward_function("rw/missing.py")
    # a package's module named where a function is expected said "module '.../__init__.py' has no attribute"
    (tmp_path / "rwpkg").mkdir()
    (tmp_path / "rwpkg" / "__init__.py").write_text("")
    (tmp_path / "rwpkg" / "rew.py").write_text("def length_reward(completions, **kwargs):\n    return [1.0]\n")
    for spec in ("rwpkg.rew", "rwpkg:rew", recorded_module_reward("rwpkg.rew")):
        with pytest.raises(RewardFunctionError, match=r"rwpkg.rew is a module; name a function in it "
                                                      r"\(rwpkg.rew.FUNCTION\)$"):
            load_reward_function(spec)


def test_load_reward_function_module_that_fails_to_import(tmp_path, monkeypatch):
    (tmp_path / "broken_rewards.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="importing 'broken_rewards' failed.*boom"):
        load_reward_function("broken_rewards:f")


def constant(value):
    def fn(prompts, completions, **kwargs):
        return [value] * len(completions)

    fn.__name__ = f"const_{value}"
    return fn


def test_weights_none_and_unscorable_rows_follow_trl():
    def sometimes(prompts, completions, **kwargs):
        return [1.0, None, None, 0.5]

    def other(prompts, completions, **kwargs):
        return [2.0, 4.0, None, None]

    out = RewardSet((sometimes, other), weights=(0.5, 2.0))(["p"] * 4, ["a", "b", "c", "d"])
    assert out.per_function.shape == (4, 2) and out.per_function.dtype == torch.float32
    assert torch.isnan(out.per_function[1, 0]) and torch.isnan(out.per_function[2]).all()
    # TRL: (rewards_per_func * weights).nansum(dim=1), rows where every function returned None -> NaN
    expected = torch.tensor([0.5 * 1.0 + 2.0 * 2.0, 2.0 * 4.0, math.nan, 0.5 * 0.5])
    torch.testing.assert_close(out.total, expected, equal_nan=True)
    assert out.metrics["rewards/sometimes/mean"] == pytest.approx(0.75)
    assert out.metrics["rewards/other/mean"] == pytest.approx(3.0)
    assert out.metrics["rewards/other/std"] == pytest.approx(float(trl_nanstd(out.per_function[:, 1])))
    assert out.metrics["reward"] == pytest.approx(float(torch.nanmean(expected)))
    assert out.metrics["reward_std"] == pytest.approx(float(trl_nanstd(expected)))


def test_nanstd_matches_trl():
    values = torch.tensor([1.0, math.nan, 3.0, 7.0, math.nan])
    assert float(nanstd(values)) == pytest.approx(float(trl_nanstd(values)))
    assert math.isnan(float(nanstd(torch.tensor([1.0, math.nan]))))


def test_columns_and_completion_ids_reach_functions():
    seen = {}

    def spy(prompts, completions, **kwargs):
        seen.update(kwargs, prompts=prompts, completions=completions)
        return [0.0] * len(completions)

    rewards = RewardSet((spy,), max_steps=7)
    rewards(
        ["p1", "p2"],
        ["c1", "c2"],
        completion_ids=[[5, 2], [6]],
        columns={"answer": ["1", "2"], "level": [0, 1]},
    )
    state = seen.pop("trainer_state")
    assert state is rewards.trainer_state and (state.global_step, state.max_steps) == (0, 7)
    assert callable(seen.pop("log_extra")) and callable(seen.pop("log_metric"))  # each function's own (names it)
    assert seen == {
        "prompts": ["p1", "p2"],
        "completions": ["c1", "c2"],
        "completion_ids": [[5, 2], [6]],
        "answer": ["1", "2"],
        "level": [0, 1],
    }


def test_errors_name_the_function():
    def raising(prompts, completions, **kwargs):
        raise KeyError("answer")

    def short(prompts, completions, **kwargs):
        return [1.0]

    def text(prompts, completions, **kwargs):
        return ["1.0", 2.0]

    def nan(prompts, completions, **kwargs):
        return [1.0, float("nan")]

    def scalar(prompts, completions, **kwargs):
        return 1.0

    def huge(prompts, completions, **kwargs):  # finite as a Python float, inf in float32 ("rewards holds inf")
        return [1.0, 1e39]

    cases = [
        (raising, "reward function 'raising' raised KeyError"),
        (short, "'short' returned 1 rewards, but 2 were expected"),
        (text, r"'text' returned '1.0' \(str\) at index 0"),
        (nan, "'nan' returned nan at index 1; return None"),
        (scalar, "'scalar' must return a list of 2 floats"),
        (huge, r"'huge' returned 1e\+39 at index 1, beyond float32's range \(\+-3.4e\+38\)"),
    ]
    for fn, message in cases:
        with pytest.raises(RewardFunctionError, match=message):
            RewardSet((constant(1.0), fn))(["p", "p"], ["a", "b"])


def test_bools_and_numpy_scalars_are_numbers():
    import numpy as np

    def mixed(prompts, completions, **kwargs):
        return [True, np.float32(0.5), np.bool_(True)]  # numpy's bool was refused as "expected a float"

    out = RewardSet((mixed,))(["p", "p", "p"], ["a", "b", "c"])
    assert out.per_function[:, 0].tolist() == [1.0, 0.5, 1.0]

    def zero_dim(prompts, completions, **kwargs):  # TRL's torch.tensor(outputs) takes a list of 0-d tensors
        return [torch.tensor(0.25), np.array(True)]

    assert RewardSet((zero_dim,))(["p", "p"], ["a", "b"]).per_function[:, 0].tolist() == [0.25, 1.0]

    def one_dim_items(prompts, completions, **kwargs):
        return [torch.tensor([0.25]), None]

    with pytest.raises(RewardFunctionError, match=r"'one_dim_items' returned tensor\(\[0.2500\]\) \(Tensor\) at index 0"):
        RewardSet((one_dim_items,))(["p", "p"], ["a", "b"])


def test_construction_and_call_errors(task):
    with pytest.raises(ValueError, match="at least one"):
        RewardSet(())
    with pytest.raises(ValueError, match="reward_weights has 1 entries but there are 2"):
        RewardSet((constant(1), constant(2)), weights=(1.0,))
    with pytest.raises(ValueError, match="finite"):
        RewardSet((constant(1),), weights=(math.inf,))
    with pytest.raises(ValueError, match=r"^unknown reward function 'accuracy,format': give the functions as separate "
                                         r"arguments \(--reward-funcs accuracy format\)$"):  # --report-to's commas
        RewardSet(("accuracy,format",), task=task)
    with pytest.raises(
        TypeError, match="not callable|parameter .functions."
    ):  # beartype checks first in tests
        RewardSet((3,))
    rs = RewardSet((constant(1),))
    with pytest.raises(ValueError, match="2 completions but.*'prompts': 1"):
        rs(["p"], ["a", "b"])
    with pytest.raises(ValueError, match="column 'answer'"):
        rs(["p", "p"], ["a", "b"], columns={"answer": ["1"]})
    with pytest.raises(ValueError, match="clash"):
        rs(["p"], ["a"], columns={"prompts": ["x"]})


def test_names_resolve_and_compute_on_items(task, tmp_path, monkeypatch):
    (tmp_path / "extra_rewards.py").write_text(
        "def short(prompts, completions, **kw):\n    return [-len(c) for c in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    rs = RewardSet(
        ["accuracy", "format", "extra_rewards:short"], task=task, extraction="full", weights=[1, 0.1, 0.01]
    )
    assert rs.names == ("accuracy", "format", "short") and rs.weights == (1.0, 0.1, 0.01)
    item = task.eval_items()[0]
    out = rs(["p"], [item.answer], columns={k: [v] for k, v in item.columns.items()})
    assert out.per_function.tolist() == [[1.0, 1.0, -float(len(item.answer))]]
    assert out.total.tolist() == pytest.approx([1.0 + 0.1 - 0.01 * len(item.answer)])
    tagged = RewardSet(["format"], task=task, extraction="tag")
    assert tagged(["p"], ["<answer>1</answer>"]).total.tolist() == [1.0]
    with pytest.raises(UnknownNameError, match="built-in: accuracy, format"):
        RewardSet(["accuracy", "lenght"], task=task)


def test_compute_with_a_task_stream_uses_its_extraction():
    stream = make_task("chain_sum", ONE_DIGIT, eval_size=3, answer_extraction="last_number")
    items = stream.eval_items
    rs = RewardSet(["accuracy", constant(0.5)], task=stream)
    completions = [f"The answer is {items[0].answer}.", "no idea", f"{items[2].answer}"]
    values = rs.compute(["p"] * 3, completions, items)
    assert values.tolist() == [[1.0, 0.5], [0.0, 0.5], [1.0, 0.5]]
    assert [stream.score(c, item) for c, item in zip(completions, items)] == [1.0, 0.0, 1.0]


def test_duplicate_names_are_made_unique():
    rs = RewardSet((constant(1), constant(1), constant(1)))
    assert rs.names == ("const_1", "const_1_2", "const_1_3")
    with pytest.raises(ValueError, match="distinct"):
        RewardSet((constant(1), constant(2)), names=("a", "a"))


def test_numpy_arrays_are_rewards_and_partials_are_named_by_their_function():
    """TRL iterates whatever a reward function returns (a 1-D numpy array works there) and names a
    ``functools.partial`` by the function it wraps (``get_callable_name``): the metrics go under that name."""
    import functools

    import numpy as np
    from trl.trainer.utils import get_callable_name

    def scaled(prompts, completions, scale=1.0, **kwargs):
        return np.array([scale * len(c) for c in completions])

    partial = functools.partial(functools.partial(scaled, scale=0.5))
    rs = RewardSet((partial,))
    assert rs.names == (get_callable_name(partial),) == ("scaled",)
    out = rs(["p", "p"], ["ab", "abcd"])
    assert out.per_function[:, 0].tolist() == [1.0, 2.0]
    assert "rewards/scaled/mean" in out.metrics


def test_reward_weights_cover_the_python_callables_after_the_named_functions():
    """TRL's reward_weights weigh every reward function; in rlzoo the names of reward_funcs come first, then the
    Python callables of ``Trainer(config, reward_funcs=[...])``. A count that fits neither names both lists."""
    from rlzoo.trainer.config import RewardConfig
    from rlzoo.trainer.rewards import build_rewards

    task = make_task("chain_sum", ONE_DIGIT, eval_size=3, answer_extraction="last_number")
    config = RewardConfig(reward_funcs=("format",), reward_weights=(1.0, 0.5))
    rs = build_rewards(config, [constant(2)], task=task, max_steps=1, device="cpu")
    assert rs.names == ("format", "const_2") and rs.weights == (1.0, 0.5)
    with pytest.raises(ValueError, match=r"3 entries but there are 2 reward functions: \['format'\] \(reward_funcs\) "
                                         r"and \['const_2'\]"):
        build_rewards(RewardConfig(reward_funcs=("format",), reward_weights=(1.0, 0.5, 2.0)), [constant(2)],
                      task=task, max_steps=1, device="cpu")


def test_trls_soft_overlong_punishment_name_is_built_as_trls_script_builds_it():
    """`--reward-funcs get_soft_overlong_punishment` is TRL's registry entry: the DAPO length penalty with
    max_completion_len 1280 and soft_punish_cache 256 (trl/scripts/grpo.py), not the factory."""
    from trl.rewards import get_soft_overlong_punishment

    fn = load_reward_function("get_soft_overlong_punishment")
    ids = [[1] * n for n in (10, 1024, 1100, 1280, 1300)]
    assert fn(completion_ids=ids) == get_soft_overlong_punishment(1280, 256)(completion_ids=ids)
    assert fn(completion_ids=ids) == [0.0, 0.0, -0.296875, -1.0, -1.0]
    rewards = RewardSet(["get_soft_overlong_punishment"])
    out = rewards(["p", "p"], ["a", "b"], completion_ids=[[1] * 1100, [1] * 5])
    assert rewards.names == ("soft_overlong_punishment_reward",)  # TRL's metric name
    assert out.per_function[:, 0].tolist() == [-0.296875, 0.0]


def test_a_module_of_the_working_directory_is_recorded_as_its_file(tmp_path, monkeypatch, request):
    """`--reward-funcs myrewards.len_reward` imported from the working directory used to be recorded as typed, so
    `--config RUN/config.json` from another directory failed with "no module named 'myrewards'". config.json now
    holds the module's absolute file (a package's module imports as that module, relative imports work); installed
    modules stay as typed."""
    import sys

    from rlzoo.trainer.run_config import absolute_paths

    modules = ("wd_rewards", "wd_helper", "wd_pkg", "wd_pkg.scores", "wd_pkg.base", "rlzoo_reward_wd_rewards")
    request.addfinalizer(lambda: [sys.modules.pop(name, None) for name in modules])
    work = tmp_path / "work"
    (work / "wd_pkg").mkdir(parents=True)
    (work / "wd_rewards.py").write_text("import wd_helper\n\ndef len_reward(prompts, completions, **kw):\n"
                                        "    return [float(wd_helper.size(c)) for c in completions]\n")
    (work / "wd_helper.py").write_text("def size(c):\n    return len(c)\n")
    (work / "wd_pkg" / "__init__.py").write_text("")
    (work / "wd_pkg" / "scores.py").write_text("from . import base\n\ndef fn(prompts, completions, **kw):\n"
                                               "    return [base.VALUE] * len(completions)\n")
    (work / "wd_pkg" / "base.py").write_text("VALUE = 2.0\n")
    monkeypatch.chdir(work)
    typed = ["wd_rewards.len_reward", "wd_pkg.scores:fn", "trl.rewards.think_format_reward",
             "rlzoo.trainer.reward_functions.format_reward", "accuracy", "no_such_module.f"]
    recorded = absolute_paths({"reward_funcs": typed})["reward_funcs"]
    assert recorded == [f"{work.resolve()}/wd_rewards.py:len_reward", f"{work.resolve()}/wd_pkg/scores.py:fn",
                        *typed[2:]]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr("sys.path", [p for p in sys.path if p and p != str(work)])  # the new directory's path
    for name in modules:
        sys.modules.pop(name, None)
    rewards = RewardSet(recorded[:2])
    assert rewards.names == ("len_reward", "fn")
    assert rewards(["p"], ["abc"]).per_function.tolist() == [[3.0, 2.0]]
    assert absolute_paths({"reward_funcs": recorded})["reward_funcs"] == recorded


def test_a_reward_model_directory_without_tokenizer_says_so(tmp_path, monkeypatch):
    """A reward-model directory without tokenizer files failed with "(HF_HUB_OFFLINE is set and it is not cached):
    Couldn't instantiate the backend tokenizer from one of:" (cut off, blaming offline mode for a local directory).
    It now names the files looked for and how to give a tokenizer; offline mode is blamed for hub ids only."""
    import huggingface_hub.constants
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from rlzoo.trainer.rewards import RewardModel

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    model = LlamaForSequenceClassification(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                                       num_hidden_layers=1, num_attention_heads=2,
                                                       num_key_value_heads=2, num_labels=1, pad_token_id=2))
    model.save_pretrained(tmp_path / "rm_notok")
    path = str(tmp_path / "rm_notok")
    for spec in (path, LlamaForSequenceClassification.from_pretrained(path)):
        with pytest.raises(OSError) as err:
            RewardSet([spec])
        message = str(err.value)
        assert message.startswith(f"reward model {path!r} has no tokenizer files (looked for tokenizer.json, "
                                  "tokenizer_config.json, ")
        assert "HF_HUB_OFFLINE" not in message and "\n" not in message
        assert "tokenizer.save_pretrained" in message and "tokenizer=tok)" in message
    (tmp_path / "empty").mkdir()
    with pytest.raises(OSError, match="'.*empty': the directory has no config.json"):
        RewardModel(str(tmp_path / "empty"))
    with pytest.raises(OSError, match=r"^cannot load reward model 'no-such-org/no-such-rm' \(HF_HUB_OFFLINE is set"):
        RewardModel("no-such-org/no-such-rm")


def test_a_causal_lm_directory_as_a_reward_model_is_refused(tmp_path):
    """User trial: `--reward-funcs CAUSAL_LM_DIR` trained on the rewards of a classification head transformers
    initialised at random (only its load report said so; TRL 1.16 does the same): refused now, naming the head."""
    from rlzoo.trainer.models import build_tiny_random
    from rlzoo.trainer.rewards import RewardModel

    model, tokenizer = build_tiny_random()
    model.save_pretrained(tmp_path / "lm")
    tokenizer.save_pretrained(tmp_path / "lm")
    with pytest.raises(ValueError, match=r"^reward model '.*lm' is not a sequence-classification checkpoint: "
                                         r"score.weight would start at random \(a causal LM's checkpoint\?\)"):
        RewardModel(str(tmp_path / "lm"))


def test_log_extra_columns_are_checked_and_the_last_logger_wins(caplog):
    """A log_extra column with one value too few used to leave NaN in the completions table silently, and a column
    two functions logged kept the first one's values. As TRL 1.16 (``_log_completion_extra`` extends the batch's
    list, the table's deque keeps the generation batch's last values), the function that logged a column last wins
    (a warning when the values differ); a count TRL would misalign is an error naming the function, the column
    and both counts."""
    import logging

    def logger(column, make):
        def fn(prompts, completions, log_extra, **kwargs):
            log_extra(column, make(completions))
            return [0.0] * len(completions)

        fn.__name__ = f"logs_{column}_{make.__name__}"
        return fn

    def short(completions):
        return [len(c) for c in completions][:-1]

    with pytest.raises(RewardFunctionError, match=r"^reward function 'logs_size_short' logged 2 values for column "
                                                  r"'size' with log_extra, but 3 completions were scored"):
        RewardSet([logger("size", short)])(["p"] * 3, ["a", "bb", "ccc"])

    def upper(completions):
        return [c.upper() for c in completions]

    def lower(completions):
        return [c.lower() for c in completions]

    rewards = RewardSet([logger("text", upper), logger("same", upper), logger("text", lower),
                         logger("same", upper)])
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        rewards(["p"] * 2, ["Ab", "cD"])
    extra = rewards.take_extra()
    assert extra == {"text": ["ab", "cd"], "same": ["AB", "CD"]}
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "'logs_text_upper', 'logs_text_lower'" in warnings[0]
    assert "keeps the values of 'logs_text_lower'" in warnings[0]

    def in_two_parts(prompts, completions, log_extra, **kwargs):  # TRL extends: two halves make one column
        log_extra("half", completions[:1])
        log_extra("half", completions[1:])
        return [0.0] * len(completions)

    def second_call_only(prompts, completions, log_extra, **kwargs):
        if completions[0] == "x":
            log_extra("late", ["L"] * len(completions))
        return [0.0] * len(completions)

    rewards = RewardSet([in_two_parts, second_call_only])
    rewards(["p"] * 2, ["a", "b"])
    rewards(["p"] * 2, ["x", "y"])  # two batches before the columns are taken: each column stays aligned
    assert rewards.take_extra() == {"half": ["a", "b", "x", "y"], "late": [None, None, "L", "L"]}


def test_a_reward_function_factory_is_refused_saying_to_call_it():
    """`--reward-funcs trl.rewards.get_soft_overlong_punishment` (TRL's dotted spelling of a factory) advised to
    rename a data set column to 'max_completion_len'. A function whose parameters are not a reward function's (no
    completions or other reward argument, no **kwargs) is now refused as a factory: call it first (its required
    parameters), and, for TRL's overlong punishment, the bare name and --overlong-buffer."""
    from trl.rewards import get_repetition_penalty_reward, get_soft_overlong_punishment

    for spec in ("trl.rewards.get_soft_overlong_punishment", "trl.rewards:get_soft_overlong_punishment"):
        with pytest.raises(RewardFunctionError) as err:
            RewardSet([spec])
        message = str(err.value)
        assert message.startswith(f"reward function {spec!r} is a factory, not a reward function (its parameters: "
                                  "max_completion_len, soft_punish_cache;")
        assert "reward_funcs=[get_soft_overlong_punishment(max_completion_len=..., soft_punish_cache=...)]" in message
        assert "--reward-funcs get_soft_overlong_punishment" in message and "--overlong-buffer" in message
        assert "column" not in message
    with pytest.raises(RewardFunctionError, match=r"'get_repetition_penalty_reward' is a factory.*"
                                                  r"reward_funcs=\[get_repetition_penalty_reward\(\)\]"):
        RewardSet([get_repetition_penalty_reward])  # a Python callable as well
    def score(text):  # no reward argument: refused, saying what TRL's call passes, not calling it a factory
        return 1.0

    with pytest.raises(RewardFunctionError) as err:
        RewardSet([score])
    assert str(err.value).startswith("reward function 'score' takes none of a reward function's arguments (its "
                                     "parameters: text): TRL's call passes prompts, completions")
    assert "if it is a factory" in str(err.value) and "is a factory, not" not in str(err.value)
    made = get_soft_overlong_punishment(max_completion_len=8, soft_punish_cache=4)  # its result is a reward function
    assert RewardSet([made, get_repetition_penalty_reward()]).names == ("soft_overlong_punishment_reward",
                                                                         "repetition_penalty_reward")


def test_a_reward_file_imported_already_is_that_module_and_a_shadowed_package_file_loads_alone(tmp_path, monkeypatch,
                                                                                               request):
    """A reward module the script imported (and configured) is used as it is, not loaded again from its recorded
    file (state set by the script was lost: Trainer records reward modules as their files); a file of a package
    whose import gives another file (or fails) loads as a module of its own, as before packages were imported."""
    import sys

    from rlzoo.trainer.reward_loading import load_reward_function
    from rlzoo.trainer.run_config import absolute_paths

    modules = ("st_rewards", "rlzoo_reward_st_rewards", "st_pkg", "st_pkg.scores", "rlzoo_reward_scores")
    request.addfinalizer(lambda: [sys.modules.pop(name, None) for name in modules])
    (tmp_path / "st_rewards.py").write_text("SCALE = 1.0\n\ndef scaled(prompts, completions, **kw):\n"
                                            "    return [SCALE] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import st_rewards

    st_rewards.SCALE = 42.0
    (recorded,) = absolute_paths({"reward_funcs": ["st_rewards.scaled"]})["reward_funcs"]
    assert recorded.endswith("st_rewards.py:scaled")
    assert load_reward_function(recorded) is st_rewards.scaled
    assert load_reward_function(recorded)(["p"], ["c"]) == [42.0]
    (tmp_path / "st_pkg").mkdir()
    (tmp_path / "st_pkg" / "__init__.py").write_text("raise RuntimeError('this package does not import')\n")
    (tmp_path / "st_pkg" / "scores.py").write_text("def fn(prompts, completions, **kw):\n    return [2.0] * len(completions)\n")
    assert load_reward_function(f"{tmp_path}/st_pkg/scores.py:fn")(["p"], ["c"]) == [2.0]


def test_a_metric_named_as_one_of_the_trainers_is_an_error_naming_the_function_and_the_metric():
    """A reward function's ``log_metric("step", 99.0)`` / ``log_metric("loss", 5.0)`` replaced the row's step and loss
    in metrics.jsonl (TRL 1.16 keeps the values in its own metrics dict: averaged into its metric of that name, or
    overwriting ``loss``). ``step`` and ``eval/*`` are refused when logged, inside the function's call (sync or
    async) and not wrapped as an error it raised; any other key of the step's row when the row is assembled."""

    def logs(*names):
        def fn(prompts, completions, log_metric, **kwargs):
            for name in names:
                log_metric(name, 5.0)
            return [0.0] * len(completions)

        fn.__name__ = "logs_" + "_".join(n.replace("/", "_") for n in names)
        return fn

    async def logs_async(prompts, completions, log_metric, **kwargs):
        log_metric("eval/accuracy", 1.0)
        return [0.0] * len(completions)

    for fn, name in ((logs("mine", "step"), "step"), (logs("eval/accuracy"), "eval/accuracy"),
                     (logs_async, "eval/accuracy")):
        with pytest.raises(RewardFunctionError, match=rf"^reward function '{fn.__name__}' logged the metric '{name}' "
                                                      rf"with log_metric, but .*: log it under another name, e\.g\. "
                                                      rf"'{fn.__name__}/{name}'$"):
            RewardSet((constant(1.0), fn))(["p", "p"], ["a", "b"])
    with pytest.raises(RewardFunctionError, match=r"^a reward function logged the metric 'step'"):
        RewardSet((constant(1.0),)).log_metric("step", 1.0)

    rewards = RewardSet((logs("loss", "mine/loss"), logs("loss")))
    rewards(["p", "p"], ["a", "b"])
    metrics, _ = rewards.take_logged()
    assert metrics == {"loss": 5.0, "mine/loss": 5.0}
    row = {"step": 1, "loss": 0.25, "reward": 0.0, "kl": 0.0}
    with pytest.raises(RewardFunctionError, match=r"^reward functions 'logs_loss_mine_loss' and 'logs_loss' logged "
                                                  r"the metric 'loss' with log_metric, but the trainer writes it in "
                                                  r"the step's row: log it under another name, e\.g\. "
                                                  r"'logs_loss_mine_loss/loss'$"):
        rewards.add_logged(row, metrics)
    assert rewards.add_logged(row, {"mine/loss": 5.0}) == {**row, "mine/loss": 5.0}
    assert row == {"step": 1, "loss": 0.25, "reward": 0.0, "kl": 0.0}  # not changed
    with pytest.raises(RewardFunctionError, match="'eval/x' with log_metric, but the held-out evaluation"):
        rewards.add_logged(row, {"eval/x": 1.0})  # (logged with the public log_metric it is refused at once)
    # a later round names the functions that logged the name in that round only (they were kept from every round)
    later = RewardSet((logs("loss"), logs("mine")))
    later(["p"], ["a"])
    later.take_logged()
    later.log_metric("loss", 1.0)  # this round: logged by no function of the set
    metrics, _ = later.take_logged()
    with pytest.raises(RewardFunctionError, match=r"^a reward function logged the metric 'loss'"):
        later.add_logged(row, metrics)


def test_trainer_state_progress_is_trls():
    """``trainer_state.epoch`` was always 0 and ``num_train_epochs`` 0. As transformers' Trainer sets them for
    ``max_steps``: a data set's epoch is the rows drawn / its training rows, num_train_epochs the epochs the run
    reaches; without a length (endless or streamed) the run is one epoch, num_train_epochs sys.maxsize."""
    rewards = RewardSet((constant(0.0),), max_steps=4)
    rewards.set_progress(global_step=2, rows_drawn=9, train_rows=6, rows_per_run=13)
    state = rewards.trainer_state
    assert (state.global_step, state.epoch, state.num_train_epochs, state.max_steps) == (2, 1.5, 3, 4)
    rewards.set_progress(global_step=3, rows_drawn=9, train_rows=None, rows_per_run=13)
    assert (state.global_step, state.epoch, state.num_train_epochs) == (3, 0.75, sys.maxsize)
    RewardSet((constant(0.0),), max_steps=0).set_progress(global_step=0, rows_drawn=0, train_rows=None, rows_per_run=0)
    with pytest.raises(ValueError, match="train_rows must be >= 1"):
        rewards.set_progress(global_step=0, rows_drawn=0, train_rows=0, rows_per_run=0)


def _run(tmp_path, fn, *, max_steps, train_dataset=None, **options):
    from rlzoo.trainer import TrainConfig, Trainer

    config = TrainConfig(**{"model": "tiny-random", "num_generations": 2, "per_device_train_batch_size": 4,
                            "max_completion_length": 4, "eval_size": 0, "progress": False, "save_steps": 0,
                            "max_steps": max_steps, "output_dir": str(tmp_path / "run"), **options})
    return Trainer(config, reward_funcs=[fn], train_dataset=train_dataset)


def test_a_run_gives_reward_functions_its_epochs_and_refuses_a_metric_of_its_own(tmp_path):
    """Through the trainer: a data set of 6 training rows drawn 2 per step over 4 steps is 2 epochs, seen by the
    functions as 0, 1/3, 2/3, 1 (the rows drawn before each generation batch); an endless reasoning-gym task's
    epoch is the run's fraction. A function logging ``loss`` stops the run at the first step, before its row is
    written."""
    import datasets

    seen = []

    def spy(prompts, completions, trainer_state, **kwargs):
        seen.append((trainer_state.global_step, trainer_state.epoch, trainer_state.num_train_epochs))
        fields.update({k: getattr(trainer_state, k) for k in ("is_world_process_zero", "is_local_process_zero",
                                                             "logging_steps", "eval_steps", "save_steps",
                                                             "train_batch_size")})
        return [0.0] * len(completions)

    fields = {}
    rows = datasets.Dataset.from_list([{"prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(6)])
    _run(tmp_path / "data", spy, max_steps=4, train_dataset=rows, eval_steps=3, save_steps=2).train()
    assert seen == [(0, 0.0, 2), (0, 0.0, 2), (1, 1 / 3, 2), (2, 2 / 3, 2), (3, 1.0, 2)]  # the reward check first
    # as transformers.Trainer sets them (they were its defaults: 500 steps, no batch size)
    assert fields == {"is_world_process_zero": True, "is_local_process_zero": True, "logging_steps": 1,
                      "eval_steps": 3, "save_steps": 2, "train_batch_size": 4}
    _run(tmp_path / "ends", spy, max_steps=2, train_dataset=rows, eval_steps=0).train()
    assert (fields["eval_steps"], fields["save_steps"]) == (2, 2)  # at the end only: no interval of 0
    seen.clear()
    _run(tmp_path / "gym", spy, max_steps=2, task="chain_sum", task_kwargs=ONE_DIGIT).train()
    assert [s[:2] for s in seen] == [(0, 0.0), (0, 0.0), (1, 0.5)] and {s[2] for s in seen} == {sys.maxsize}

    def loss(prompts, completions, log_metric, **kwargs):
        log_metric("loss", 5.0)
        return [0.0] * len(completions)

    with pytest.raises(RewardFunctionError, match="^reward function 'loss' logged the metric 'loss' with log_metric"):
        _run(tmp_path / "clash", loss, max_steps=2, task="chain_sum", task_kwargs=ONE_DIGIT).train()
    metrics = tmp_path / "clash" / "run" / "metrics.jsonl"
    assert not metrics.exists() or '"loss"' not in metrics.read_text()


def test_a_python_file_a_lazy_modules_callables_and_a_two_label_reward_model_are_named(tmp_path, monkeypatch):
    """``--reward-funcs rewards.py`` from its directory blamed a function ``py`` (the recorded spelling turned it
    into module ``rewards``); a misspelt ``trl.rewards`` function was told the module has no callables (a lazy
    module's vars() is empty); a 2-label reward model was a transformers traceback."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    from rlzoo.trainer.builtin_models import build_tiny_random

    monkeypatch.chdir(tmp_path)
    (tmp_path / "filerw.py").write_text("def fr(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    assert recorded_module_reward("filerw.py") == "filerw.py"
    with pytest.raises(RewardFunctionError, match=r"^reward function 'filerw.py' is a Python file: name the function "
                                                  r"in it, 'filerw.py:FUNCTION'; its public callables: fr$"):
        RewardSet([recorded_module_reward("filerw.py")])
    pytest.importorskip("trl")
    with pytest.raises(RewardFunctionError, match=r"module 'trl.rewards' has no attribute 'think_format'; its public "
                                                  r"callables: .*think_format_reward"):
        load_reward_function("trl.rewards.think_format")
    _, tokenizer = build_tiny_random()
    model = LlamaForSequenceClassification(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                                       num_hidden_layers=1, num_attention_heads=2,
                                                       num_key_value_heads=2, num_labels=2, pad_token_id=0))
    model.save_pretrained(tmp_path / "rm2")
    tokenizer.save_pretrained(tmp_path / "rm2")
    assert AutoTokenizer.from_pretrained(tmp_path / "rm2") is not None
    with pytest.raises(ValueError, match=r"^reward model '.*rm2' cannot be loaded with one output \(num_labels=1\)"):
        RewardSet([str(tmp_path / "rm2")])
