"""The built-in task options under the user's: for the default task, ``task_kwargs`` lays over rlzoo's built-in
options, and ``rlzoo tasks`` shows the options a run gets."""

from rlzoo.trainer import TrainConfig
from rlzoo.trainer.config import DEFAULT_TASK_KWARGS, TaskConfig

TINY = {"model": "tiny-random", "progress": False}


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
