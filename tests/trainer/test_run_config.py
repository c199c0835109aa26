"""A config file's task options go with its task: a ``--task`` other than the file's drops them (an INFO line names
them), and a file that names no task is the default task's (``chain_sum``)."""

import logging

from rlzoo.cli import parse_train_args
from rlzoo.trainer.config import DEFAULT_TASK
from rlzoo.trainer.run_config import settings_for_task

DOC_EXAMPLE = """\
algorithm = "dapo"
model = "smollm2-135m"
max_steps = 40
dynamic_sampling = true
overlong_buffer = 8
[loss]
epsilon_high = 0.28
[task_kwargs]
min_terms = 2
max_terms = 3
"""
"""docs/trainer.md's TOML example: task options and no ``task``."""


def test_a_file_without_task_has_the_default_tasks_options(tmp_path, caplog):
    """``rlzoo train --config run.toml --task leg_counting`` with the docs' example said "unknown option(s)
    ['max_terms', 'min_terms'] for reasoning-gym task 'leg_counting'": the file names no task, so its options are
    chain_sum's, the default's, and another --task drops them as it does those of a file that names chain_sum."""
    path = tmp_path / "run.toml"
    path.write_text(DOC_EXAMPLE)
    with caplog.at_level(logging.INFO, logger="rlzoo.train"):
        config = parse_train_args(["--config", str(path), "--task", "leg_counting"])
    assert config.task == "leg_counting" and config.task_kwargs is None and config.resolved_task_kwargs == {}
    assert (f"{path}: task options {{'min_terms': 2, 'max_terms': 3}} dropped: they are those of its task "
            f"'{DEFAULT_TASK}' (the default: it names none), not of --task leg_counting") in caplog.text
    assert parse_train_args(["--config", str(path), "--task", "leg_counting", "--task.min_animals", "2"]
                            ).task_kwargs == {"min_animals": 2}
    for same in ([], ["--task", DEFAULT_TASK]):  # the file's task: its options stay
        assert parse_train_args(["--config", str(path), *same]).task_kwargs == {"min_terms": 2, "max_terms": 3}


def test_settings_for_task_compares_with_the_named_or_default_task():
    options = {"task_kwargs": {"max_terms": 3}}
    assert settings_for_task(options, "leg_counting", source="f") == {}
    assert settings_for_task(options, DEFAULT_TASK, source="f") == options
    assert settings_for_task(options, None, source="f") == options
    named = {"task": "leg_counting", "task_kwargs": {"min_animals": 2}}
    assert settings_for_task(named, "leg_counting", source="f") == named
    assert settings_for_task(named, DEFAULT_TASK, source="f") == {"task": "leg_counting"}
