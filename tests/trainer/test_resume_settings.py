"""Which settings a resumed run uses: the checkpoint's, with the flags given now as changes (the CLI); a complete
``TrainConfig`` as the user's (the Python API); refusals of a run length the checkpoint is already past, of
changed LoRA options and of ``--resume`` with ``--overwrite``; ``--resume auto`` for job scripts that are
requeued; and the built-in task options under the user's. Tiny random model, through the console script."""

import dataclasses
import json
import logging
import shutil

import pytest
from test_run_safety import (
    TINY,
    TINY_FLAGS,
    _cli,
    _config,
    _error_line,
    _rows,
    _train,
    _untimed,
    digit_fraction,
)

from rlzoo.cli import parse_train_args
from rlzoo.trainer import TrainConfig, Trainer
from rlzoo.trainer.config import DEFAULT_TASK_KWARGS, TaskConfig
from rlzoo.trainer.resume import compare_settings, resume_config
from rlzoo.trainer.run_config import settings_for_algorithm

# settings that differ from the defaults, so that a resume that fell back to the defaults would be refused
FLAGS = [*TINY_FLAGS, "--learning-rate", "1e-3", "--save-steps", "5", "--task.max_terms", "3",
         "--loss.epsilon_high", "0.28", "--reward-funcs", "test_run_safety:digit_fraction"]
LORA = ["--peft.r", "4", "--peft.lora_alpha", "8", "--peft.target_modules", "all-linear"]


def _segments(run) -> list[dict]:
    return json.loads((run / "config.json").read_text())["segments"]


# ------------------------------------------------------------------------ the checkpoint's settings (CLI)
def test_a_cli_resume_continues_with_the_checkpoints_settings_exactly(tmp_path, monkeypatch, capsys, caplog):
    """``--output-dir RUN --resume latest --max-steps 2`` after a 1-step run with many non-default flags: the
    flags not given again are the checkpoint's, only --max-steps is a change (one log line), and the metrics
    equal those of an uninterrupted 2-step run."""
    code, err = _cli(monkeypatch, capsys, "train", *FLAGS, "--max-steps", "2", "--output-dir", tmp_path / "full")
    assert code == 0, err
    run = tmp_path / "run"
    code, err = _cli(monkeypatch, capsys, "train", *FLAGS, "--max-steps", "1", "--output-dir", run)
    assert code == 0, err
    with caplog.at_level(logging.INFO, logger="rlzoo.train"):
        code, err = _cli(monkeypatch, capsys, "train", "--output-dir", run, "--resume", "latest", "--max-steps", "2",
                         "--no-progress")
    assert code == 0, err
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("resume: ")] == [
        "resume: max_steps changed 1 -> 2 (applied to the restored optimizer and schedule)"]
    rows = _rows(run / "metrics.jsonl")
    assert _untimed(rows) == _untimed(_rows(tmp_path / "full" / "metrics.jsonl")) and rows[-1]["grad_norm"] > 0
    first, second = _segments(run)
    assert second["changes"] == {"max_steps": [1, 2]}
    assert {k: v for k, v in second["settings"].items() if k not in ("max_steps", "resume")} == {
        k: v for k, v in first["settings"].items() if k not in ("max_steps", "resume")}


def test_cli_flags_and_a_config_file_given_on_resume_are_the_changes(tmp_path, monkeypatch, capsys):
    """A config file and dotted flags given on resume lay over the checkpoint's settings: a dotted option
    merges into the checkpoint's mapping; what is not given stays the checkpoint's."""
    run = tmp_path / "run"
    code, err = _cli(monkeypatch, capsys, "train", *FLAGS, "--max-steps", "1", "--output-dir", run)
    assert code == 0, err
    (tmp_path / "more.yaml").write_text("max_steps: 4\nlearning_rate: 5.0e-4\n")
    config = parse_train_args(["--config", str(tmp_path / "more.yaml"), "--output-dir", str(run), "--resume",
                               "latest", "--max-steps", "2", "--loss.beta", "0.04"])
    saved = TrainConfig.from_dict({**_segments(run)[0]["settings"], "resume": "latest"})
    assert config == TrainConfig.from_dict({**saved.to_dict(), "max_steps": 2, "learning_rate": 5e-4,
                                            "loss": {"epsilon_high": 0.28, "beta": 0.04},
                                            "progress": True})  # the console's, not the checkpoint's


def test_another_algorithm_or_estimator_on_resume_drops_the_checkpoints_options_of_the_old_one(tmp_path, monkeypatch,
                                                                                                  capsys, caplog):
    """A run with --loss.epsilon_high and --advantage.scale could not be resumed with --algorithm dro ("unknown option
    'epsilon_high' for loss 'dro'", not saying it came from the checkpoint) or --advantage maxrl, and no flag could
    remove the option (helper trial). As a --task other than a config file's drops its task options, another preset
    drops the checkpoint's loss options and another estimator its advantage options, with an INFO line; the same
    preset and estimator keep them."""
    run = tmp_path / "run"
    code, err = _cli(monkeypatch, capsys, "train", *FLAGS, "--advantage.scale", "batch", "--max-steps", "1",
                     "--output-dir", run)
    assert code == 0, err
    resume = ["--output-dir", str(run), "--resume", "latest", "--max-steps", "2"]
    with caplog.at_level(logging.INFO, logger="rlzoo.train"):
        dro = parse_train_args([*resume, "--algorithm", "dro"])
    assert dict(dro.loss) == {} and dict(dro.advantage_options) == {"scale": "batch"}  # dro's estimator is grpo's
    assert "the checkpoint's settings: loss options {'epsilon_high': 0.28} dropped: they are those of its " \
           "algorithm 'grpo', not of --algorithm dro" in caplog.text
    maxrl = parse_train_args([*resume, "--advantage", "maxrl", "--loss.beta", "0.01"])
    assert dict(maxrl.advantage_options) == {} and dict(maxrl.loss) == {"epsilon_high": 0.28, "beta": 0.01}
    same = parse_train_args([*resume, "--algorithm", "GRPO", "--advantage", "grpo"])
    assert dict(same.loss) == {"epsilon_high": 0.28} and dict(same.advantage_options) == {"scale": "batch"}
    spelt = parse_train_args([*resume, "--algorithm", "Grpo", "--advantage", "GRPO"])  # as the registries fold
    assert dict(spelt.loss) == {"epsilon_high": 0.28} and dict(spelt.advantage_options) == {"scale": "batch"}
    shared = tmp_path / "shared.yaml"  # a file naming no algorithm keeps its options for any --algorithm
    shared.write_text("loss: {beta: 0.04}\nadvantage_options: {scale: batch}\n")
    fresh = parse_train_args(["--config", str(shared), "--algorithm", "dapo", "--advantage", "grpo"])
    assert dict(fresh.loss) == {"beta": 0.04} and dict(fresh.advantage_options) == {"scale": "batch"}
    folded = settings_for_algorithm({"algorithm": "dr_grpo", "loss": {"beta": 0.1}}, "DR-GRPO", None, source="f")
    assert folded["loss"] == {"beta": 0.1}  # '-' and '_' fold as the registry folds them
    unknown = settings_for_algorithm({"algorithm": "grpo", "loss": {"beta": 0.1}}, "grpoo", None, source="f")
    assert unknown["loss"] == {"beta": 0.1}  # an unknown name drops nothing (its own error comes later)
    python = resume_config(run, max_steps=2, algorithm="dro", advantage="maxrl")
    assert dict(python.loss) == {} and dict(python.advantage_options) == {}
    code, err = _cli(monkeypatch, capsys, "train", *resume, "--algorithm", "dro", "--advantage", "maxrl",
                     "--no-progress")
    assert code == 0, err


def test_inside_a_generation_cycle_a_resume_refuses_what_the_stored_batch_depends_on(tmp_path, caplog):
    """A checkpoint between the two optimizer steps of one generation batch holds that batch. ``--temperature`` changed
    there was "applied" to log-probs scored at the old temperature (ratio/max 2.77 where 1.14 was right); it is
    refused, naming the way out. A reward weight applies from the next generation batch, and the log says so."""
    run = tmp_path / "run"
    common = {"max_steps": 2, "save_steps": 1, "eval_size": 0, "steps_per_generation": 2,
              "gradient_accumulation_steps": 1, "per_device_train_batch_size": 4}
    _train(run, **common)
    step1 = str(run / "checkpoints" / "step-000001")
    with pytest.raises(ValueError, match=r"cannot change temperature \(1.0 -> 0.5\) on this resume: checkpoint .* "
                                         r"holds an unfinished generation batch.*keep --temperature 1.0 until then"):
        Trainer(_config(tmp_path / "fork", **common, resume=step1, temperature=0.5),
                reward_funcs=[digit_fraction]).train()
    with caplog.at_level(logging.INFO, logger="rlzoo.train"):
        Trainer(_config(tmp_path / "fork", **common, resume=step1, reward_weights=(2.0,)),
                reward_funcs=[digit_fraction]).train()
    assert "resume: reward_weights changed None -> [2.0] (applied from the next generation batch)" in caplog.text


def test_the_python_api_takes_a_whole_config_and_resume_config_builds_one_from_the_checkpoint(tmp_path):
    """``Trainer(TrainConfig(...))`` resumes with every field as given (a field left at its default is the
    default: here a refused change); ``resume_config(RUN, ...)`` is the checkpoint's settings with overrides."""
    run = tmp_path / "run"
    _train(run, max_steps=1, eval_size=0, num_generations=2)
    with pytest.raises(ValueError, match="cannot resume with changed settings: num_generations 2 -> 4"):
        Trainer(_config(run, max_steps=2, eval_size=0, resume="latest"), reward_funcs=[digit_fraction]).train()
    config = resume_config(run, max_steps=2, progress=False)
    assert config == _config(run, max_steps=2, eval_size=0, num_generations=2, resume="latest")
    Trainer(config, reward_funcs=[digit_fraction]).train()
    assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [1, 2]
    with pytest.raises(FileNotFoundError, match="no checkpoint under .*resume='auto' resumes if there is one"):
        resume_config(tmp_path / "empty")
    # a checkpoint (or the checkpoints folder) given as the run: the error names the run and the call to make
    step2 = run / "checkpoints" / "step-000002"
    with pytest.raises(FileNotFoundError, match=rf"is the checkpoints of the training run '{run}': e\.g\. "
                                                rf"resume_config\('{run}'\)$"):
        resume_config(run / "checkpoints")
    with pytest.raises(FileNotFoundError, match=rf"e\.g\. resume_config\('{run}', '{step2}'\)$"):
        resume_config(step2)
    lone = tmp_path / "copied"
    shutil.copytree(step2, lone)
    with pytest.raises(FileNotFoundError, match=rf"is inside the rlzoo checkpoint '{lone}': e\.g\. "
                                                rf"resume_config\(NEW_RUN_DIR, '{lone}'\)$"):
        resume_config(lone / "model")


def test_a_config_file_on_resume_merges_its_mappings_into_the_checkpoints(tmp_path, monkeypatch, capsys, caplog):
    """A config file giving ``loss: {beta: 0.1}`` on resume used to replace the checkpoint's mappings whole: the
    loss lost its epsilon_high, and task and LoRA options given in part were refused as changes. They merge
    option by option, as the dotted flags do, and the log lists exactly the options that changed."""
    run = tmp_path / "run"
    code, err = _cli(monkeypatch, capsys, "train", *FLAGS, *LORA, "--max-steps", "1", "--output-dir", run)
    assert code == 0, err
    more = tmp_path / "more.yaml"
    more.write_text("max_steps: 2\nloss:\n  beta: 0.1\ntask_kwargs:\n  min_terms: 2\npeft:\n  r: 4\n")
    with caplog.at_level(logging.INFO, logger="rlzoo.train"):
        code, err = _cli(monkeypatch, capsys, "train", "--config", more, "--output-dir", run, "--resume", "latest",
                         "--no-progress")
    assert code == 0, err
    assert sorted(r.getMessage() for r in caplog.records if r.getMessage().startswith("resume: ")) == [
        "resume: loss.beta changed (not set) -> 0.1 (applied)",
        "resume: max_steps changed 1 -> 2 (applied to the restored optimizer and schedule)"]
    first, second = _segments(run)
    assert second["changes"] == {"loss": [{"epsilon_high": 0.28}, {"epsilon_high": 0.28, "beta": 0.1}],
                                 "max_steps": [1, 2]}
    assert second["settings"]["peft"] == first["settings"]["peft"] == {"r": 4, "lora_alpha": 8,
                                                                       "target_modules": "all-linear"}
    assert second["settings"]["task_kwargs"] == {"max_terms": 3, "min_terms": 2}


def test_changes_of_mapping_options_are_named_option_by_option(caplog):
    saved = TrainConfig(**TINY, loss={"epsilon_high": 0.28, "beta": 0.04}).to_dict()
    config = TrainConfig(**TINY, loss={"epsilon_high": 0.3, "beta": 0.04, "delta": 4.0})
    with caplog.at_level(logging.INFO, logger="rlzoo.train"):
        changes = compare_settings(saved, config)
    assert changes == {"loss": ({"epsilon_high": 0.28, "beta": 0.04}, {"epsilon_high": 0.3, "beta": 0.04,
                                                                        "delta": 4.0})}
    assert [r.getMessage() for r in caplog.records] == ["resume: loss.epsilon_high changed 0.28 -> 0.3 (applied)",
                                                        "resume: loss.delta changed (not set) -> 4.0 (applied)"]
    # an option given at the preset's default builds the same loss: no change (it was logged as one, and recorded)
    saved = TrainConfig(**TINY).to_dict()
    assert compare_settings(saved, TrainConfig(**TINY, loss={"beta": 0.04, "epsilon_low": 0.2})) == {}
    assert compare_settings(saved, TrainConfig(**TINY, loss={"beta": 0.1})) == {"loss": ({}, {"beta": 0.1})}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rlzoo.train"):  # back to the default, given: logged as given
        compare_settings(TrainConfig(**TINY, loss={"beta": 0.1}).to_dict(), TrainConfig(**TINY, loss={"beta": 0.04}))
    assert [r.getMessage() for r in caplog.records] == ["resume: loss.beta changed 0.1 -> 0.04 (applied)"]
    saved = TrainConfig(**TINY, peft={"r": 4, "lora_alpha": 8}).to_dict()
    with pytest.raises(ValueError, match=r"changed settings: peft\.lora_alpha 8 -> 16 \(the checkpoint holds"):
        compare_settings(saved, TrainConfig(**TINY, peft={"r": 4, "lora_alpha": 16}))


# ------------------------------------------------------------------------------------------ Python rewards
def test_a_cli_resume_of_a_run_with_python_callable_rewards_says_to_give_them_again(tmp_path, monkeypatch,
                                                                                   capsys):
    """A run whose reward was a Python callable (Trainer(..., reward_funcs=[fn])) resumed from the command line
    used to fail with "RewardSet needs at least one reward function" (or, next to named rewards, to go on
    without it)."""
    run = tmp_path / "run"
    _train(run, max_steps=1, eval_size=0)  # digit_fraction, given as a Python callable
    code, err = _cli(monkeypatch, capsys, "train", "--output-dir", run, "--resume", "latest", "--max-steps", "2")
    line = _error_line(err)
    assert code == 2 and "reward function(s) digit_fraction given as Python callables" in line, err
    assert "give them again with --reward-funcs module:function" in line and "Trainer(resume_config(RUN)" in line
    code, err = _cli(monkeypatch, capsys, "train", "--output-dir", run, "--resume", "latest", "--max-steps", "2",
                     "--reward-funcs", "test_run_safety:digit_fraction", "--no-progress")
    assert code == 0, err
    assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [1, 2]
    assert "rewards/digit_fraction/mean" in _rows(run / "metrics.jsonl")[-1]


def test_a_resume_without_a_python_callable_reward_of_the_run_says_so(tmp_path, caplog):
    """Given other rewards, a resume used to go on without the run's Python-callable reward, silently; the change
    is applied (as a change of --reward-funcs is) with a warning naming it."""
    run = tmp_path / "run"
    _train(run, max_steps=1, eval_size=0)  # digit_fraction, given as a Python callable

    def other(prompts, completions, **kw):
        return [0.0] * len(prompts)

    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        Trainer(resume_config(run, max_steps=2), reward_funcs=[other]).train()
    said = [r.getMessage() for r in caplog.records if "Python callables of the checkpoint's run" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("resume: reward function(s) digit_fraction,"), said
    assert "rewards/other/mean" in _rows(run / "metrics.jsonl")[-1]


def test_a_run_with_a_loss_given_from_python_is_not_continued_with_its_algorithm(tmp_path, monkeypatch, capsys):
    """Trainer(config, loss=...) records algorithm 'grpo' (the default) next to the loss it trained: a resume or
    --config RUN/config.json used to train grpo's loss instead, silently. Refused now unless the loss is given again
    (Python) or --algorithm says what to train (config file); likewise a Python-callable reward under --config."""
    import rlzoo

    run = tmp_path / "run"
    loss = rlzoo.get_loss("dapo", epsilon_high=0.3)
    Trainer(_config(run, max_steps=1, eval_size=0), loss=loss, reward_funcs=[digit_fraction]).train()
    code, err = _cli(monkeypatch, capsys, "train", "--output-dir", run, "--resume", "latest", "--max-steps", "2",
                     "--reward-funcs", "test_run_safety:digit_fraction")
    assert code == 2 and "was trained with a loss given from Python (Trainer(..., loss=...): 'dapo')" in _error_line(err), err
    with pytest.raises(ValueError, match=r"trained with a loss given from Python \('dapo'\), which algorithm 'grpo' "
                                         r"does not rebuild: pass it again"):
        Trainer(resume_config(run, max_steps=2), reward_funcs=[digit_fraction]).train()
    history = Trainer(resume_config(run, max_steps=2), loss=loss, reward_funcs=[digit_fraction]).train()
    assert [r["step"] for r in history] == [1, 2]

    config = run / "config.json"
    code, err = _cli(monkeypatch, capsys, "train", "--config", config, "--output-dir", tmp_path / "copy",
                     "--reward-funcs", "test_run_safety:digit_fraction")
    assert code == 2 and "that run's loss was given from Python ('dapo')" in _error_line(err), err
    code, err = _cli(monkeypatch, capsys, "train", "--config", config, "--output-dir", tmp_path / "copy",
                     "--algorithm", "dapo")
    assert code == 2 and "reward function(s) digit_fraction given as Python callables" in _error_line(err), err
    code, err = _cli(monkeypatch, capsys, "train", "--config", config, "--output-dir", tmp_path / "copy",
                     "--algorithm", "dapo", "--loss.epsilon_high", "0.3", "--reward-funcs",
                     "test_run_safety:digit_fraction", "--max-steps", "1")
    assert code == 0, err
    # a loss from Python that is the algorithm's own (grpo, the default) resumes by the settings: nothing refused
    same = tmp_path / "same"
    Trainer(_config(same, max_steps=1, eval_size=0), loss=rlzoo.get_loss("grpo"), reward_funcs=[digit_fraction]).train()
    code, err = _cli(monkeypatch, capsys, "train", "--output-dir", same, "--resume", "latest", "--max-steps", "2",
                     "--reward-funcs", "test_run_safety:digit_fraction", "--no-progress")
    assert code == 0, err


def test_resume_latest_without_a_checkpoint_points_to_resume_auto(tmp_path, monkeypatch, capsys):
    code, err = _cli(monkeypatch, capsys, "train", *TINY_FLAGS, "--output-dir", tmp_path / "empty", "--resume",
                     "latest")
    line = _error_line(err)
    assert code == 2 and "--resume latest: no checkpoint under" in line, err
    assert "--resume auto (resume if there is a checkpoint, else start fresh)" in line


def test_a_refused_start_creates_no_directory(tmp_path, monkeypatch, capsys):
    """--resume latest where there is no run says to drop --resume (not --overwrite: nothing to delete), and neither
    it nor a start refused for its data leaves an (empty) output directory behind."""
    code, err = _cli(monkeypatch, capsys, "train", *TINY_FLAGS, "--output-dir", tmp_path / "none", "--resume",
                     "latest")
    assert code == 2 and "or drop --resume to start a new run (" in _error_line(err), err
    (tmp_path / "empty").mkdir()
    code, err = _cli(monkeypatch, capsys, "train", *TINY_FLAGS, "--output-dir", tmp_path / "empty", "--resume",
                     "latest")
    assert code == 2 and "drop --resume to start a new run there" in _error_line(err), err
    (tmp_path / "rows.jsonl").write_text('{"question": "1 + 1", "answer": "2"}\n')  # no prompt column
    code, err = _cli(monkeypatch, capsys, "train", *TINY_FLAGS, "--task", tmp_path / "rows.jsonl",
                     "--output-dir", tmp_path / "bad")
    assert code == 2 and "prompt" in _error_line(err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "rows.jsonl"]
    assert not any((tmp_path / "empty").iterdir())


# ------------------------------------------------------------------------------------------- run length
def test_a_resume_that_would_not_train_is_refused_naming_max_steps(tmp_path, monkeypatch, capsys, caplog):
    """Refused, touching nothing, and without first logging the shorter max_steps as applied (it was)."""
    run = tmp_path / "run"
    code, err = _cli(monkeypatch, capsys, "train", *FLAGS, "--max-steps", "1", "--output-dir", run)
    assert code == 0, err
    before = (run / "config.json").read_text(), (run / "metrics.jsonl").read_text()
    for more in ([], ["--max-steps", "0"]):
        with caplog.at_level(logging.INFO, logger="rlzoo.train"):
            code, err = _cli(monkeypatch, capsys, "train", "--output-dir", run, "--resume", "latest", *more)
        assert code == 2 and "--max-steps" in _error_line(err) and "step 1" in _error_line(err), err
        assert not [r for r in caplog.records if "changed" in r.getMessage()]
    assert ((run / "config.json").read_text(), (run / "metrics.jsonl").read_text()) == before
    with pytest.raises(ValueError, match="--max-steps"):  # the Python API: the checkpoint's settings as they are
        Trainer(resume_config(run)).train()


# ------------------------------------------------------------------------------------------------- LoRA
def test_lora_options_come_from_the_checkpoint_and_a_change_is_refused(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    code, err = _cli(monkeypatch, capsys, "train", *FLAGS, *LORA, "--max-steps", "1", "--output-dir", run)
    assert code == 0, err
    code, err = _cli(monkeypatch, capsys, "train", "--output-dir", run, "--resume", "latest", "--max-steps", "2",
                     "--no-progress")
    assert code == 0, err
    assert _segments(run)[1]["settings"]["peft"] == {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
    code, err = _cli(monkeypatch, capsys, "train", "--output-dir", run, "--resume", "latest", "--max-steps", "3",
                     "--peft.lora_alpha", "16")
    assert code == 2 and "cannot resume with changed settings: peft.lora_alpha 8 -> 16 (" in _error_line(err), err
    with pytest.raises(ValueError, match="cannot resume with changed settings: peft "):  # the whole model now
        Trainer(TrainConfig.from_dict({**_segments(run)[1]["settings"], "peft": None, "max_steps": 3})).train()
    assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [1, 2]


def test_steps_per_generation_given_at_its_default_is_no_change():
    """User trial: a run started without --steps-per-generation (None: gradient_accumulation_steps, TRL's default)
    refused a resume with `--steps-per-generation 2`, the same generation cycle; a real change is still refused."""
    tiny = {**TINY, "gradient_accumulation_steps": 2}
    saved = TrainConfig(**tiny).to_dict()
    assert compare_settings(saved, TrainConfig(**tiny, steps_per_generation=2)) == {}
    assert compare_settings(TrainConfig(**tiny, steps_per_generation=2).to_dict(), TrainConfig(**tiny)) == {}
    with pytest.raises(ValueError, match=r"steps_per_generation 2 -> 1 \(the batch shape and generation cycle"):
        compare_settings(saved, TrainConfig(**tiny, steps_per_generation=1))
    with pytest.raises(ValueError, match=r"changed settings: gradient_accumulation_steps 2 -> 4 \([^;]*\)\. "):
        compare_settings(saved, TrainConfig(**{**tiny, "gradient_accumulation_steps": 4}))  # one field, not two


def test_lora_options_that_build_the_same_adapter_are_no_change():
    """User trial: target_modules in another order, or an option given at peft's default, was refused as a change
    ("peft.target_modules ['v_proj', 'q_proj'] -> ['q_proj', 'v_proj']", "peft.lora_dropout (not set) -> 0.0").
    Now the options compare as the adapter they build; a real change is still refused, naming the option."""
    from peft import LoraConfig

    from rlzoo.trainer.adapters import peft_options, recorded_peft

    def saved(peft):
        return TrainConfig(**TINY, peft=peft).to_dict()

    typed = {"target_modules": ["v_proj", "q_proj"]}  # recorded as typed by older versions
    for now in ({"target_modules": ["q_proj", "v_proj"]}, {**typed, "lora_dropout": 0.0},
                {**typed, "lora_alpha": 8, "r": 8}, peft_options(LoraConfig(target_modules=["v_proj", "q_proj"]))):
        assert compare_settings(saved(typed), TrainConfig(**TINY, peft=now)) == {}, now
    from_object = peft_options(LoraConfig(r=4, target_modules="all-linear"))  # a run started from a LoraConfig
    assert compare_settings(saved(from_object), TrainConfig(**TINY, peft={**from_object, "lora_alpha": 8})) == {}
    with pytest.raises(ValueError, match=r"changed settings: peft\.target_modules \['q_proj', 'v_proj'\] -> "
                                         r"\['k_proj', 'q_proj'\] \(the checkpoint holds"):
        compare_settings(saved(typed), TrainConfig(**TINY, peft={"target_modules": ["q_proj", "k_proj"]}))
    with pytest.raises(ValueError, match=r"changed settings: peft\.lora_dropout 0\.0 -> 0\.1 \("):
        compare_settings(saved(typed), TrainConfig(**TINY, peft={**typed, "lora_dropout": 0.1}))
    # going forward the command line records the list in one order, as the object's options are
    assert recorded_peft(typed, None, resuming=False) == {"target_modules": ["q_proj", "v_proj"]}


def test_a_lora_run_resumes_with_its_target_modules_in_another_order(tmp_path, monkeypatch, capsys):
    """The trial's commands: a CLI run with --peft.target_modules [v_proj,q_proj] resumed with [q_proj,v_proj] and
    --peft.lora_dropout 0.0, then from Python with a LoraConfig listing them in the first order."""
    from peft import LoraConfig

    run = tmp_path / "run"
    code, err = _cli(monkeypatch, capsys, "train", *TINY_FLAGS, "--peft.target_modules", "[v_proj,q_proj]",
                     "--max-steps", "1", "--output-dir", run)
    assert code == 0, err
    assert _segments(run)[0]["settings"]["peft"] == {"target_modules": ["q_proj", "v_proj"]}
    state = run / "checkpoints" / "step-000001" / "trainer_state.json"  # as older versions recorded it: as typed
    old = json.loads(state.read_text())
    state.write_text(json.dumps({**old, "settings": {**old["settings"], "peft": {"target_modules": ["v_proj",
                                                                                                    "q_proj"]}}}))
    code, err = _cli(monkeypatch, capsys, "train", "--output-dir", run, "--resume", "latest", "--max-steps", "2",
                     "--peft.target_modules", "[q_proj,v_proj]", "--peft.lora_dropout", "0.0", "--no-progress")
    assert code == 0, err
    Trainer(resume_config(run, max_steps=3), peft_config=LoraConfig(target_modules=["v_proj", "q_proj"])).train()
    assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [1, 2, 3]


# -------------------------------------------------------------------------------------- resume + overwrite
def test_resume_of_the_directorys_run_with_overwrite_is_refused_and_a_fork_overwrites(tmp_path, monkeypatch,
                                                                                      capsys):
    """--overwrite with --resume latest / auto / the directory's own checkpoint contradict each other (refused,
    nothing touched); with another run's checkpoint, a fork of it replaces the directory's run."""
    run = tmp_path / "run"
    _train(run, max_steps=1, eval_size=0)
    for resume in ("latest", "auto", run / "checkpoints" / "step-000001"):
        code, err = _cli(monkeypatch, capsys, "train", *TINY_FLAGS, "--output-dir", run, "--resume", resume,
                         "--overwrite", "--max-steps", "2")
        assert code == 2 and "--overwrite and --resume" in _error_line(err), err
    assert (run / "checkpoints" / "step-000001").is_dir() and len(_segments(run)) == 1
    fork = tmp_path / "fork"
    _train(fork, max_steps=1, eval_size=0, learning_rate=1e-4)
    _train(fork, max_steps=2, eval_size=0, overwrite=True, resume=str(run / "checkpoints" / "step-000001"))
    assert [p.name for p in (fork / "checkpoints").iterdir()] == ["step-000002"]  # its own step 1 deleted
    assert [r["step"] for r in _rows(fork / "metrics.jsonl")] == [1, 2] and len(_segments(fork)) == 2
    assert _segments(fork)[0]["settings"]["learning_rate"] == 1e-3  # the segment of the run it forked from


# ----------------------------------------------------------------------------------------- --resume auto
def test_resume_auto_starts_fresh_then_resumes_with_one_command(tmp_path, monkeypatch, capsys, caplog):
    """One job-script command for the first start and every requeue: an empty directory starts fresh, a
    directory with a checkpoint resumes from it, a run already at --max-steps exits 0 without a new segment."""
    run = tmp_path / "run"
    command = ["train", *FLAGS, "--output-dir", run, "--resume", "auto"]
    code, err = _cli(monkeypatch, capsys, *command, "--max-steps", "1")
    assert code == 0, err
    code, err = _cli(monkeypatch, capsys, *command, "--max-steps", "2")
    assert code == 0, err
    assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [1, 2]
    assert [s["start_step"] for s in _segments(run)] == [0, 1]
    with caplog.at_level(logging.INFO, logger="rlzoo.train"):
        code, err = _cli(monkeypatch, capsys, *command, "--max-steps", "2")
    assert code == 0, err
    assert "already complete" in caplog.text and len(_segments(run)) == 2
    assert "resumed from" not in caplog.text and "run dir" not in caplog.text  # (it said both: contradictory)
    assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [1, 2]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rlzoo.train"):
        assert _cli(monkeypatch, capsys, *command, "--max-steps", "3")[0] == 0
    assert f"resumed from {run / 'checkpoints' / 'step-000002'} at step 2" in caplog.text and "run dir" in caplog.text


def test_resume_auto_sets_aside_a_start_that_wrote_no_checkpoint(tmp_path, monkeypatch, capsys):
    """A job preempted before its first checkpoint left config.json and metrics: --resume auto starts over and
    moves them to abandoned/ (nothing deleted)."""
    run = tmp_path / "run"
    _train(run, max_steps=1, eval_size=0)
    (run / "checkpoints" / "step-000001").rename(tmp_path / "gone")
    code, err = _cli(monkeypatch, capsys, "train", *TINY_FLAGS, "--output-dir", run, "--resume", "auto",
                     "--max-steps", "1")
    assert code == 0, err
    (aside,) = (run / "abandoned").iterdir()
    assert aside.name.startswith("no-checkpoint-") and (aside / "config.json").is_file()
    assert [r["step"] for r in _rows(aside / "metrics.jsonl")] == [1]
    assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [1] and len(_segments(run)) == 1


def test_resume_latest_and_auto_need_the_runs_output_dir(monkeypatch, capsys):
    for resume in ("latest", "auto"):
        code, err = _cli(monkeypatch, capsys, "train", *TINY_FLAGS, "--resume", resume)
        assert code == 2 and f"--resume {resume} needs --output-dir" in _error_line(err), err


# ---------------------------------------------------------------------------------------------- task options
def test_task_options_lay_over_the_built_in_defaults():
    assert TaskConfig().resolved_task_kwargs == DEFAULT_TASK_KWARGS == {
        "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    assert TaskConfig(task_kwargs={"max_terms": 3}).resolved_task_kwargs == {**DEFAULT_TASK_KWARGS, "max_terms": 3}
    assert TaskConfig(task="leg_counting", task_kwargs={"min_animals": 2}).resolved_task_kwargs == {"min_animals": 2}
    assert TrainConfig(**TINY).resolved_task_kwargs == DEFAULT_TASK_KWARGS


def test_rlzoo_tasks_shows_the_default_tasks_effective_defaults(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["rlzoo", "tasks", "chain_sum"])
    from rlzoo.cli import console_main

    assert console_main() == 0
    out = capsys.readouterr().out
    for name, value in DEFAULT_TASK_KWARGS.items():
        assert f"--task.{name} {value!r}" in out, out


def test_preset_and_estimator_names_are_recorded_as_registered():
    """--algorithm DAPO trains dapo and is recorded so: a resume with --algorithm dapo logged "algorithm changed
    'DAPO' -> 'dapo'" (likewise --advantage RLOO); an unknown name is left for the did-you-mean of the build."""
    config = TrainConfig(**TINY, algorithm="DAPO", advantage="RLOO")
    assert (config.algorithm, config.advantage) == ("dapo", "rloo")
    assert TrainConfig(**TINY, algorithm="dr-grpo").algorithm == "dr_grpo"
    saved = {**config.to_dict(), "world_size": 1}
    assert compare_settings(saved, TrainConfig(**TINY, algorithm="dapo", advantage="rloo")) == {}
    assert TrainConfig(**TINY, algorithm="dapoo").algorithm == "dapoo"
    older = {**saved, "algorithm": "DAPO", "advantage": "RLOO"}  # a checkpoint of a version that kept the spelling
    assert compare_settings(older, TrainConfig(**TINY, algorithm="dapo", advantage="rloo")) == {}


def test_a_resume_on_another_world_size_names_the_per_device_batch_that_keeps_the_global_batch(caplog):
    """2 ranks x 4 resumed on 1 rank said to leave the flags out (they were: the per-device batch is the
    checkpoint's); it names --per-device-train-batch-size 8, or the checkpoint's number of ranks. A global batch
    the new world size does not divide says so."""
    saved = {**TrainConfig(**TINY).to_dict(), "world_size": 2}  # TINY: 8 per device
    with pytest.raises(ValueError, match=r"per_device_train_batch_size '8 per rank x 2 ranks' -> '8 per rank x 1 "
                                         r"rank' .*\. Give --per-device-train-batch-size 16 \(the global batch of 16 on "
                                         r"1 rank\), or resume on 2 ranks$"):
        compare_settings(saved, TrainConfig(**TINY), world_size=1)
    with caplog.at_level(logging.INFO, logger="rlzoo.train"):
        changes = compare_settings(saved, TrainConfig(**{**TINY, "per_device_train_batch_size": 16}), world_size=1)
    # the global batch stays; the per-rank share's change is one (it was neither logged nor in the segment)
    assert changes == {"world_size": (2, 1), "per_device_train_batch_size": (8, 16)}
    assert [r.getMessage() for r in caplog.records] == ["resume: world_size changed 2 -> 1 (applied)",
                                                        "resume: per_device_train_batch_size changed 8 -> 16 (applied)"]
    for world in (3, 8):  # 16 does not split over 3 ranks; over 8, 2 per rank are no whole group of 4
        with pytest.raises(ValueError, match=r"Resume on a number of ranks over which the global batch of 16 splits "
                                             r"into whole groups of num_generations \(4\), or resume on 2 ranks$"):
            compare_settings(saved, TrainConfig(**TINY), world_size=world)
    with pytest.raises(ValueError, match=r"seed .*leave those flags out"):  # another refusal too: the general advice
        compare_settings(saved, TrainConfig(**{**TINY, "seed": 7}), world_size=1)


# ------------------------------------------------------------------------ a data set's training rows
def _data_file(path, n: int, tag: str = "") -> str:
    path.write_text("".join(json.dumps({"prompt": f"{tag}What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(n)))
    return str(path)


def test_a_resume_that_would_change_a_data_sets_training_rows_is_refused(tmp_path, caplog):
    """A data set's held-out rows are cut from its training rows: a resume with another eval_size or eval_seed
    trained on other rows (and held out rows it had trained on) after "eval_size changed (applied)". Refused now,
    before the model loads for a data file (not with a separate --task.eval_split), at the task's state for a data
    set given from Python (whose eval_dataset the config does not record); a data file with other rows too. A file
    whose rows changed in content only resumes with a warning; the same file resumes silently."""
    import datasets

    data = _data_file(tmp_path / "d.jsonl", 30)
    common = {"task": data, "max_steps": 1, "save_steps": 1, "eval_size": 4}
    _train(tmp_path / "run", **common)
    for change in ({"eval_size": 6}, {"eval_seed": 7}):
        with pytest.raises(ValueError, match=rf"^cannot resume with changed settings: {next(iter(change))} .*the data "
                                             "set's held-out rows are cut from its training rows"):
            Trainer(_config(tmp_path / "run", **{**common, **change, "max_steps": 2, "resume": "latest"}),
                    reward_funcs=[digit_fraction])
    unscored = TrainConfig(**{**TINY, **common, "task_kwargs": {"answer_column": None}})  # nothing held out
    assert compare_settings(unscored.to_dict(), dataclasses.replace(unscored, eval_size=6)) == {"eval_size": (4, 6)}
    split = {**common, "task_kwargs": {"eval_split": "train[:4]", "split": "train[4:]"}}
    _train(tmp_path / "split", **split)
    _train(tmp_path / "split", **{**split, "eval_size": 3, "max_steps": 2, "resume": "latest"})  # applied
    rows = datasets.Dataset.from_json(data)
    Trainer(_config(tmp_path / "py", **{**common, "task": "chain_sum"}), train_dataset=rows,
            reward_funcs=[digit_fraction]).train()
    with caplog.at_level(logging.INFO, logger="rlzoo.train"), \
            pytest.raises(ValueError, match=r"the training rows of data set 'train_dataset:.*' are not the checkpoint's"):
        Trainer(resume_config(tmp_path / "py", eval_size=6, max_steps=2), train_dataset=rows,
                reward_funcs=[digit_fraction]).train()
    assert not [r for r in caplog.records if r.getMessage().startswith("resume: ")]  # no "(applied)" before refusing
    _data_file(tmp_path / "d.jsonl", 31)
    with pytest.raises(ValueError, match=r"the training rows of data set '.*d.jsonl' are not the checkpoint's"):
        _train(tmp_path / "run", **{**common, "max_steps": 2, "resume": "latest"})
    _data_file(tmp_path / "d.jsonl", 30, tag="Q: ")
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        _train(tmp_path / "run", **{**common, "max_steps": 2, "resume": "latest"})
    assert [r.getMessage() for r in caplog.records if "differ from those" in r.getMessage()] == [
        (f"resume: the rows of data set {data} differ from those the checkpoint trained on (the data changed since): "
        "the run goes on with the rows as they are now")]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        _train(tmp_path / "run", **{**common, "max_steps": 3, "resume": "latest"})
    assert not [r for r in caplog.records if "differ from those" in r.getMessage()]


def test_a_data_sets_options_given_at_their_defaults_are_no_change(tmp_path):
    """A resume with --task.split train (or prompt_column prompt, answer_column answer) of a run that gave none was
    refused: "task_kwargs.split (not set) -> 'train'". Options at the data set's defaults are no change (as peft's);
    another value still is."""
    data = _data_file(tmp_path / "d.jsonl", 30)
    saved = TrainConfig(**{**TINY, "task": data})
    for given in ({"split": "train"}, {"prompt_column": "prompt", "answer_column": "answer"}, {"eval_split": None}):
        assert compare_settings(saved.to_dict(), dataclasses.replace(saved, task_kwargs=given)) == {}
    with pytest.raises(ValueError, match=r"task_kwargs.split \(not set\) -> 'train\[:20\]'"):
        compare_settings(saved.to_dict(), dataclasses.replace(saved, task_kwargs={"split": "train[:20]"}))
    python = dataclasses.replace(saved, task="train_dataset:0123abcd")  # a data set given from Python: alike
    assert compare_settings(python.to_dict(), dataclasses.replace(python, task_kwargs={"prompt_column": "prompt"})) == {}


def test_a_checkpoint_from_before_data_sets_recorded_their_rows_resumes(tmp_path):
    """Older checkpoints hold no ``rows`` / ``content`` in their task state: nothing to compare, no refusal."""
    from rlzoo.trainer.tasks import TaskStream, load_task

    stream = TaskStream(load_task(_data_file(tmp_path / "d.jsonl", 10), eval_size=2))
    state = stream.state_dict()
    assert set(state) >= {"rows", "content"}
    old = {k: v for k, v in state.items() if k not in ("rows", "content")}
    stream.load_state_dict({**old, "position": 3})
    assert stream.position == 3
    with pytest.raises(ValueError, match="are not the checkpoint's"):
        stream.load_state_dict({**state, "rows": "0" * 16})
