"""rlzoo: list and explain the zoo, train, evaluate, benchmark.

::

    rlzoo list                          presets (with papers), advantage estimators, parts
    rlzoo explain dapo                  a preset's card: formula, components, defaults, paper
    rlzoo explain grpo --kind advantage a part or advantage estimator (--kind: where a preset has the name too)
    rlzoo explain dapo --loss.beta 0.04 ... and the components those loss options build
    rlzoo explain dapo --markdown       its section of docs/algorithms.md
    rlzoo explain --all --markdown      docs/algorithms.md
    rlzoo plot dapo [--output FILE] [--loss.OPTION VALUE]   a PNG of the objective and its gradient vs. the ratio
    rlzoo plot --all --output-dir docs/pictures --dpi 72    every preset's picture (docs/algorithms.md shows them)
    rlzoo tasks [NAME]                  the tasks and their options
    rlzoo train [--config FILE] [--algorithm NAME] [--loss.OPTION VALUE] [--advantage NAME] ...
    rlzoo eval --run RUN | --model MODEL [--task NAME] [--task.OPTION VALUE] [--eval-size N] [--output FILE]
    rlzoo export SOURCE OUTPUT          a checkpoint as a plain Hugging Face model (a LoRA adapter merged)
    rlzoo bench [pytest options]        the pytest-benchmark suite (source checkout)

Flags of ``train`` are the fields of :class:`rlzoo.trainer.TrainConfig` in kebab-case (``rlzoo train --help``);
dotted flags set the mapping options: ``--loss.epsilon_high 0.28``, ``--advantage.scale none``,
``--task.max_terms 3``, ``--peft.r 16`` (values are parsed as YAML scalars: 0.28, true, null).
"""

import argparse
import contextlib
import dataclasses
import logging
import os
import re
import stat
import subprocess
import sys
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlzoo.trainer.flags import CommandLineError, flag_name, tyro_cli

__all__ = ["CommandLineError", "console_main", "lay_over", "main", "parse_train_args"]

_DOTTED = re.compile(r"^--(loss|advantage|task|peft)\.([A-Za-z0-9_\-]+)(?:=(.*))?$")
_DOTTED_FIELD = {"loss": "loss", "advantage": "advantage_options", "task": "task_kwargs", "peft": "peft"}
_TEXT_TASK_OPTIONS = ("split", "eval_split", "prompt_column", "answer_column", "name", "data_dir", "revision")
"""A data set's --task options (rlzoo.trainer.tasks.datasets_source.DATASET_OPTIONS): names, text or null."""


def _scalar(text: str, *, numeric: bool = False) -> Any:
    """A flag value as a YAML scalar (``0.28``, ``true``, ``null``, and ``1e-3`` as a number); ``None``, Python's
    spelling of null that TRL users type (``--loss.dual_clip None``), is null too. ``numeric`` (the loss's and the
    advantage estimator's options, which are numbers, names and flags): ``inf`` / ``-inf`` / ``nan`` (any case; YAML
    spells them ``.inf``, ``.nan``) are floats, as Python's ``float`` reads them (YAML reads them as strings:
    ``--loss.epsilon_high inf`` was "must be a number, got str 'inf'"); a task's or adapter's option keeps them as
    text (a split or module named ``nan``)."""
    import yaml

    if text == "None":
        return None
    if numeric and re.fullmatch(r"[-+]?(inf|infinity|nan)", text, flags=re.IGNORECASE):
        return float(text)
    from rlzoo.trainer.config_files import yaml_load

    try:
        return yaml_load(text)
    except yaml.YAMLError:
        return text


_TRAIN_HELP = """Train a causal LM with any loss of the zoo (flags = TrainConfig fields).

Besides the flags below: --config FILE (TOML, YAML or JSON with the same field names, or a run's config.json;
flags override it), and the dotted options --loss.NAME VALUE (see rlzoo explain ALGORITHM), --advantage.NAME
VALUE, --task.NAME VALUE (the data set's options, see rlzoo tasks) and --peft.NAME VALUE (LoRA: the fields of
peft.LoraConfig; --peft none turns a config file's LoRA off), values read as YAML scalars (0.28, 1e-3, true, null;
inf for --loss / --advantage)."""

_EVAL_HELP = """Greedy held-out accuracy and reward of a run's checkpoint (--run RUN: its task, prompts, answer extraction
and reward functions) or of any model (--model), printed as JSON. Also the dotted options --task.NAME VALUE, and
--config FILE: a config file's evaluation settings (its training settings are checked, not used), under the flags.
A flag left at None takes the run's setting (--run), else rlzoo train's default."""


def parse_train_args(argv: Sequence[str], prog: str = "rlzoo train"):
    """Parse ``rlzoo train`` arguments into a :class:`~rlzoo.trainer.TrainConfig`.

    Precedence: built-in defaults < the checkpoint's settings (with ``--resume``) < ``--config FILE`` < flags.
    A mapping (``loss``, ``advantage_options``, ``task_kwargs``, ``peft``) given in the config file or by dotted
    flags merges option by option into the one below it (the file's, else the checkpoint's).

    Raises:
        SystemExit: on ``--help`` (tyro's help).
        CommandLineError: a flag tyro rejects (unknown, a bad value, out of range): one line naming the flag;
            ``--reward-funcs none`` (rlzoo eval's spelling: training needs a reward function).
        ValueError: invalid values (from :class:`TrainConfig` validation), ``--reward-weights`` not one per
            ``--reward-funcs`` name, or a resume of a run whose reward functions were Python callables without
            ``--reward-funcs``.
    """
    import dataclasses

    from rlzoo.trainer.config import TrainConfig
    from rlzoo.trainer.resume import checkpoint_settings
    from rlzoo.trainer.run_dir import RunDirectory

    base, rest = _config_and_dotted(argv)
    _refuse_trl_spellings(rest)
    output_dir, resume = _resume_target(base, rest)
    given = {flag_name(a) for a in rest}
    rewards_given = "reward_funcs" in base or "--reward-funcs" in given
    overwrite = base.get("overwrite") or "--overwrite" in given
    if overwrite and RunDirectory(output_dir or ".", resume=resume).resumes_own_run:
        rewards_given = True  # a contradiction the trainer refuses first (--overwrite would delete what resumes)
    saved = checkpoint_settings(output_dir, resume, rewards_given=rewards_given,
                                loss_given="algorithm" in base or "--algorithm" in given)  # a preset chosen anew
    if saved is not None:  # resuming: what is not given again is the checkpoint's, so only what is given can change
        base, _ = _config_and_dotted(argv, under=saved)
    try:
        default = TrainConfig.from_dict(base)
    except ValueError as err:
        raise _naming_config_file(err, argv) from None
    parsed = tyro_cli(TrainConfig, args=rest, default=default, prog=prog, description=_TRAIN_HELP,
                      dotted=list(_DOTTED_FIELD))
    # tyro rebuilds the dataclass from flags; keep the dotted mappings it does not parse.
    config = dataclasses.replace(parsed, loss=default.loss, advantage_options=default.advantage_options,
                                 task_kwargs=default.task_kwargs, peft=default.peft)
    _check_file_tables(config, argv)
    if [f.lower() for f in config.reward_funcs if isinstance(f, str)] == ["none"]:  # rlzoo eval's spelling
        raise CommandLineError("--reward-funcs none: training needs a reward function (rlzoo eval's 'none' means its "
                               "accuracy alone, which training's default --reward-funcs accuracy is)")
    weights, funcs = config.reward_weights, config.reward_funcs
    if weights is not None and len(weights) != len(funcs):  # no Python callables here: exactly one per name, now
        from rlzoo.trainer.config_files import load_config_file

        path = _config_file(argv)[0]
        in_file = load_config_file(path).keys() if path else set()
        what = ("--reward-weights" if "--reward-weights" in given else f"{path}: reward_weights"
                if "reward_weights" in in_file else "reward_weights (the run's)")
        whose = ("" if "--reward-funcs" in given else f" (reward_funcs of {path})" if "reward_funcs" in in_file
                 else f" (the {'run' if saved is not None else 'default'}'s; --reward-funcs gives others)")
        raise ValueError(f"{what} gives {len(weights)} weight(s) for {len(funcs)} reward function(s) {list(funcs)}"
                         f"{whose}: give one weight per reward function")
    return config


def _naming_config_file(err: ValueError, argv: Sequence[str]) -> ValueError:
    """``err`` (a settings error) prefixed with the ``--config`` file's path when it names one of the file's keys
    (``max_steps must be an integer``), so that the one-line error says where the value is."""
    from rlzoo.trainer.config_files import load_config_file

    path, _ = _config_file(argv)
    message = str(err.args[0]) if err.args else str(err)
    if path is None or not any(re.match(rf"{re.escape(key)}\b", message) or repr(key) in message
                               for key in load_config_file(path)):
        return err
    return ValueError(f"{path}: {message}")


def _check_file_tables(config: Any, argv: Sequence[str], *, algorithm: bool = False) -> None:
    """Build what the ``--config`` file's option tables configure (the loss and advantage estimator, the LoRA config,
    a reasoning-gym task's options: no model, no data) so that a bad option there fails naming the file, as a bad
    top-level key does. When the settings fail, they are built again from the file's options alone (the dotted
    flags' left out): the file is named only when that fails too, so a flag's error never is. Warnings are left to
    the trainer (said once).

    Args:
        algorithm: build the loss whenever the file sets ``algorithm`` (rlzoo eval, which builds no loss itself).

    Raises:
        ValueError, UnknownNameError: the settings' error; prefixed with the file's path when it is the file's.
    """
    import warnings

    from rlzoo.registry import UnknownNameError
    from rlzoo.trainer.adapter_options import check_adapter_options, lora_config
    from rlzoo.trainer.algorithm import build_loss
    from rlzoo.trainer.config import AlgorithmConfig
    from rlzoo.trainer.config_files import load_config_file
    from rlzoo.trainer.tasks import ReasoningGymTask, list_reasoning_gym_tasks

    path, rest = _config_file(argv)
    if path is None:
        return
    file = load_config_file(path)
    tables = {t for t, v in file.items() if t in _DOTTED_FIELD.values() and isinstance(v, Mapping)}
    if algorithm and {"algorithm", "advantage"} & file.keys():
        tables.add("loss")  # build the loss: the preset's and the estimator's names are checked with it
    if not tables:
        return

    def build(settings: Any) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if tables & {"loss", "advantage_options"}:
                build_loss(settings.section(AlgorithmConfig), None, max_completion_length=settings.max_completion_length)
            if "peft" in tables and settings.peft:  # (a reference's needs are the trainer's to check)
                check_adapter_options(lora_config(settings.peft), given_as="--peft", needs_reference=False)
            if "task_kwargs" in tables and settings.task in list_reasoning_gym_tasks():
                ReasoningGymTask(name=settings.task, kwargs=settings.resolved_task_kwargs, eval_size=0)

    try:
        build(config)
    except (ValueError, UnknownNameError):
        flagged = {(_DOTTED_FIELD[m.group(1)], m.group(2).replace("-", "_")) for m in map(_DOTTED.match, rest) if m}
        own = dataclasses.replace(config, **{t: {k: v for k, v in (getattr(config, t) or {}).items()
                                                 if (t, k) not in flagged} for t in _DOTTED_FIELD.values()})
        try:
            build(own)  # the file's (over a resumed checkpoint's) options alone
        except (ValueError, UnknownNameError) as mine:
            raise type(mine)(f"{path}: {mine.args[0] if mine.args else mine}") from None
        raise


def _resume_target(base: dict[str, Any], rest: Sequence[str]) -> tuple[str | None, str | None]:
    """``output_dir`` and ``resume`` as the flags (else the config file) give them, read before the full parse (a
    checkpoint's bare name as its path): the checkpoint they name gives the defaults of that parse."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("--output-dir", "--output_dir", default=base.get("output_dir"))
    parser.add_argument("--resume", default=base.get("resume"))
    try:
        known, _ = parser.parse_known_args(list(rest))
    except argparse.ArgumentError:  # e.g. --resume without a value: the full parse says so
        return None, None
    from rlzoo.trainer.run_config import named_checkpoint

    output_dir, resume = (None if v == "None" else v for v in (known.output_dir, known.resume))
    return output_dir, named_checkpoint(resume, output_dir)


def _refuse_trl_spellings(argv: Sequence[str], takes: Collection[str] | None = None) -> None:
    """Raise :class:`CommandLineError` with a pointer to rlzoo's spelling when a flag is TRL's (``--loss_type``,
    ``--beta``, ``--lr``); with ``takes`` (a command's fields: rlzoo eval's), only where its rlzoo spelling is one
    of them (eval was told "TRL's --lr is --learning-rate", which it refuses in turn)."""
    from rlzoo.trainer.spellings import spelling_hint

    flags = [a for a in argv if a.startswith("--")]
    hint = spelling_hint(flags, flags=True, fields=takes)
    if hint:
        raise CommandLineError(f"unknown option: {hint}")


def _config_and_dotted(argv: Sequence[str], under: dict[str, Any] | None = None, *,
                       train: bool = True) -> tuple[dict[str, Any], list[str]]:
    """``--config FILE``'s settings (laid over ``under``) merged with the dotted flags, and the remaining arguments;
    for ``train`` a run's config.json whose loss or rewards were Python objects is checked (:func:`_check_python_parts`).
    A ``--task`` flag other than the file's task drops the file's ``task_kwargs`` (that task's options;
    :func:`~rlzoo.trainer.run_config.settings_for_task`) before the ``--task.NAME`` flags are laid over; an
    ``--algorithm`` (``--advantage``) other than the file's or ``under``'s drops their ``loss``
    (``advantage_options``; :func:`~rlzoo.trainer.run_config.settings_for_algorithm`)."""
    from rlzoo.trainer.config_files import load_config_file
    from rlzoo.trainer.run_config import settings_for_algorithm, settings_for_task

    path, argv = _config_file(argv)
    base: dict[str, Any] = {}
    if path is not None:
        base = load_config_file(path)
        if train:
            _check_python_parts(path, argv)
    dotted: dict[str, dict[str, Any]] = {}
    rest: list[str] = []
    no_peft = False
    i = 0
    while i < len(argv):
        match = _DOTTED.match(argv[i])
        if train and (argv[i] == "--peft" or argv[i].startswith("--peft=")):  # over a config file's LoRA options
            value = argv[i].split("=", 1)[1] if "=" in argv[i] else (argv[i + 1] if i + 1 < len(argv) else "")
            if value.lower() not in ("none", "null"):
                raise CommandLineError(f"--peft takes none (no LoRA: train the whole model), got {value!r}; LoRA's "
                                       "options are --peft.NAME VALUE (e.g. --peft.r 16)")
            no_peft, i = True, i + (1 if "=" in argv[i] else 2)
            continue
        if match:
            kind, key, value = match.group(1), match.group(2).replace("-", "_"), match.group(3)
            if value is None:
                value = _dotted_value(argv, i)
                i += 1
                if i + 1 < len(argv) and not argv[i + 1].startswith("-"):  # --peft.target_modules q_proj v_proj
                    raise CommandLineError(f"unexpected argument {argv[i + 1]!r} after {argv[i - 1]} {value}: a dotted "
                                           f"option takes one value; a list is given comma-separated ({argv[i - 1]} "
                                           f"{value},{argv[i + 1]})")
            parsed = _scalar(value, numeric=kind in ("loss", "advantage"))
            if kind == "task" and key in _TEXT_TASK_OPTIONS and parsed is not None and not isinstance(parsed, str):
                parsed = value  # a column or split named 1, yes or on is that text, not YAML's 1 or true
            dotted.setdefault(_DOTTED_FIELD[kind], {})[key] = parsed
        else:
            rest.append(argv[i])
        i += 1
    algorithm, advantage = _task_flag(rest, "algorithm"), _task_flag(rest, "advantage")
    if path is not None:
        base = settings_for_task(base, _task_flag(rest), source=path)
        base = settings_for_algorithm(base, algorithm, advantage, source=path)
    if under:  # a resume: the checkpoint's loss options are those of its preset (and estimator)
        under = settings_for_algorithm(under, algorithm or base.get("algorithm"), advantage or base.get("advantage"),
                                       source="the checkpoint's settings")
    settings = lay_over(lay_over(under or {}, base), dotted)
    if no_peft:
        if "peft" in dotted:
            raise CommandLineError("--peft none turns LoRA off: give it or --peft.NAME options, not both")
        settings["peft"] = None
    return settings, rest


def _config_file(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """The file of the first ``--config FILE`` (or ``--config=FILE``) in ``argv``, and the other arguments.

    Raises:
        CommandLineError: ``--config`` without a file, or given twice.
    """
    argv = list(argv)
    if sum(1 for a in argv if a == "--config" or a.startswith("--config=")) > 1:  # the second was "unknown"
        raise CommandLineError("--config is given once: one file (put the settings of both in it; flags override it)")
    for i, arg in enumerate(argv):
        if arg == "--config":
            if i + 1 >= len(argv):
                raise CommandLineError("--config needs a file (TOML, YAML or JSON)")
            return argv[i + 1], argv[:i] + argv[i + 2:]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1], argv[:i] + argv[i + 1:]
    return None, argv


def _dotted_value(argv: Sequence[str], i: int) -> str:
    """The value of the dotted flag ``argv[i]`` given as the next argument. A next argument that begins with ``--``
    is a flag, not the value (``--loss.beta --max-steps 1``); a negative number (``-0.1``) is a value.

    Raises:
        CommandLineError: no value follows (names the flag and how values are read).
    """
    if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
        raise CommandLineError(f"{argv[i]} needs a value (read as YAML: 0.28, 1e-3, true, null)")
    return argv[i + 1]


def _task_flag(argv: Sequence[str], name: str = "task") -> str | None:
    """The value of the last ``--task TASK`` (or ``--task=TASK``; another flag ``name``) in ``argv`` (without the
    dotted flags), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == f"--{name}" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
    return value


def _check_python_parts(path: str, argv: Sequence[str]) -> None:
    """Refuse ``--config RUN/config.json`` of a run whose loss or reward functions were given from Python (a config
    file cannot hold them: the settings alone would train another loss or without those rewards) unless the flags
    that replace them (``--algorithm``, ``--reward-funcs``) are given."""
    import json

    from rlzoo.trainer.resume import loss_summary

    if not path.endswith(".json"):
        return
    try:
        run = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return  # load_config_file has said what is wrong
    if not isinstance(run, dict) or "segments" not in run:
        return
    given = {flag_name(a) for a in argv}
    loss = run.get("resolved_loss") if run.get("resolved_python_loss") else None
    if loss is not None and "--algorithm" not in given:
        raise ValueError(f"{path}: that run's loss was given from Python ({loss_summary(loss)}), which a config file "
                         f"cannot hold (its algorithm {run.get('algorithm')!r} would train another loss): pass "
                         "--algorithm NAME (and --loss.* options) to train a preset with its settings, or train it "
                         "from Python with Trainer(config, loss=...)")
    rewards = list(run.get("resolved_python_reward_funcs") or [])
    if rewards and "--reward-funcs" not in given:
        raise ValueError(f"{path}: that run also had the reward function(s) {', '.join(rewards)} given as Python "
                         "callables, which a config file cannot hold: give all its rewards with --reward-funcs "
                         f"{' '.join([*(run.get('reward_funcs') or []), 'module:function'])} (or train from Python "
                         "with Trainer(config, reward_funcs=[...]))")


def lay_over(below: Mapping[str, Any], above: Mapping[str, Any]) -> dict[str, Any]:
    """Settings ``above`` laid over ``below``: a value of ``above`` replaces the one below it, except that a
    mapping laid over a mapping (``loss``, ``advantage_options``, ``task_kwargs``, ``peft``) merges option by
    option, so ``loss: {beta: 0.1}`` (a config file) or ``--loss.beta 0.1`` (a flag) keeps the other loss
    options below it. ``None`` (``peft: null``) replaces the mapping. Never raises."""
    out = dict(below)
    for key, value in above.items():
        under = out.get(key)
        out[key] = {**under, **value} if isinstance(value, Mapping) and isinstance(under, Mapping) else value
    return out


_ABBREVIATIONS = frozenset({"e.g.", "i.e.", "Dr.", "vs.", "cf.", "al.", "eq.", "Eq.", "sec.", "Sec.", "Fig.", "approx."})
"""Words ending in a period that end no sentence (for :func:`_summary`)."""


def _summary(doc: str | None, limit: int = 110) -> str:
    """The first sentence of a docstring, its lines joined (a period inside ``literal`` or `role` markup, or ending
    an abbreviation such as ``Dr.``, ends none); longer than ``limit`` characters, cut at a word boundary and ended
    with ``...``. ``""`` for no docstring."""
    import inspect

    text = " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())
    masked = re.sub(r"``.*?``|`[^`]*`", lambda m: "x" * len(m.group()), text)  # same length: offsets carry over
    for end in re.finditer(r"[.!?](?=\s|$)", masked):
        if masked[:end.end()].rsplit(" ", 1)[-1] not in _ABBREVIATIONS:
            text = text[:end.end()]
            break
    if len(text) > limit:
        text = text[:limit - 2].rsplit(" ", 1)[0].rstrip(",;:") + "..."
    return text


def _cmd_list(args: argparse.Namespace) -> int:
    from rlzoo.advantages import advantage_estimators
    from rlzoo.losses import kl_estimators, presets
    from rlzoo.losses.policy_loss import SLOTS

    print("loss presets (rlzoo.get_loss / --algorithm):")
    width = max(map(len, presets.names()))
    for name, card in presets.items():
        paper = f"arXiv:{card.arxiv}" if card.arxiv else "-"
        print(f"  {name:<{width}} {card.title}  [{paper}]")
    print("\nadvantage estimators (rlzoo.get_advantage / --advantage; rlzoo explain NAME, with --kind advantage where "
          "a preset has the name):")
    width = max(map(len, advantage_estimators.names()))
    for name, cls in advantage_estimators.items():
        print(f"  {name:<{width}} {_summary(cls.__doc__)}")
        for option, registry in cls.choices().items():  # those the estimator takes (grpo_passk: per group only)
            names = [n for n in registry.names() if _takes(cls, option, n)] or registry.names()
            print(f"  {'':<{width}}   {option}: {', '.join(names)}")
    print("\nparts (compose your own: rlzoo.losses.PolicyLoss; rlzoo explain PART, with --kind part where a preset has "
          "the name):")
    for slot in SLOTS:
        how = f" ({slot.swap_option})" if slot.swap_option else ""
        print(f"  {slot.field}{how}: {', '.join(slot.base.registry.names())}")
        for cls in slot.base.registry.values():
            for option, registry in cls.choices().items():
                if registry is not kl_estimators:
                    print(f"    {option}: {', '.join(registry.names())}")
    print(f"  kl estimators (kl_estimator): {', '.join(kl_estimators.names())}")
    return 0


_EXPLAIN_KINDS = {"preset": "loss preset", "advantage": "advantage estimator", "part": "part",
                  "kl": "KL estimator", "option": "option value of a part"}
"""What ``rlzoo explain NAME`` can explain, in the order it tries them (``--kind`` picks one): a loss preset, an
advantage estimator, a part of :class:`~rlzoo.losses.PolicyLoss`, a KL estimator, an option value of a part."""


def _explanations(name: str) -> dict[str, tuple[str, str]]:
    """Every meaning of ``name`` that ``rlzoo explain`` shows, by kind (:data:`_EXPLAIN_KINDS`, in that order):
    ``{kind: (what it is, in a few words, the text printed)}``. A name matches as the registries resolve it (case
    and ``-`` / ``_`` folded: ``DAPO``, ``dr-grpo``); of the option values, the first part's is shown."""
    import inspect

    from rlzoo.advantages import advantage_estimators
    from rlzoo.losses import kl_estimate, kl_estimators, presets
    from rlzoo.losses.policy_loss import SLOTS

    found: dict[str, tuple[str, str]] = {}

    def add(kind: str, what: str, header: str, entry: Any) -> None:  # the first of a kind only
        found.setdefault(kind, (what, f"{header}\n\n{inspect.cleandoc(entry.__doc__ or '')}"))

    if (key := presets.canonical(name)) in presets:
        found["preset"] = ("a loss preset", presets.get(key).card())
    if (key := advantage_estimators.canonical(name)) in advantage_estimators:
        add("advantage", "an advantage estimator", f"{key} (advantage estimator)", advantage_estimators.get(key))
    for slot in SLOTS:
        if (key := slot.base.registry.canonical(name)) in slot.base.registry:
            cls = slot.base.registry.get(key)
            add("part", f"{'an' if slot.field[0] in 'aeiou' else 'a'} {slot.field} part of PolicyLoss",
                f"{key} ({slot.base.__name__}, PolicyLoss.{slot.field}; {cls.__module__}.{cls.__qualname__})", cls)
    if (key := kl_estimators.canonical(name)) in kl_estimators:  # functions: the penalty module's docstring
        add("kl", "a KL estimator", f"{key} (KL estimator: --loss.kl_estimator of the kl penalty, "
            "distillation_loss_mode of the distillation penalty; rlzoo.losses.kl_estimate)",
            sys.modules[kl_estimate.__module__])
    for slot in SLOTS:  # an option's alternatives, as rlzoo list shows them (is_correction's modes, ...)
        for part, cls in slot.base.registry.items():
            for option, registry in cls.choices().items():
                if (key := registry.canonical(name)) in registry:
                    entry = registry.get(key)
                    add("option", f"a value of option {option} of the {slot.field} part {part}",
                        f"{key} (option {option} of the {slot.field} part {part}; {entry.__module__}."
                        f"{entry.__qualname__})", entry)
    return found


def _names_of_kind(kind: str) -> list[str]:
    """The names ``rlzoo explain --kind KIND`` takes, sorted."""
    from rlzoo.advantages import advantage_estimators
    from rlzoo.losses import kl_estimators, presets
    from rlzoo.losses.policy_loss import SLOTS

    if kind == "preset":
        return presets.names()
    if kind == "advantage":
        return advantage_estimators.names()
    if kind == "kl":
        return kl_estimators.names()
    if kind == "part":
        return sorted({n for slot in SLOTS for n in slot.base.registry.names()})
    return sorted({n for slot in SLOTS for cls in slot.base.registry.values() for registry in cls.choices().values()
                   for n in registry.names()})


def _takes(cls: type, option: str, value: str) -> bool:
    """Whether component class ``cls`` accepts ``value`` for ``option`` (its checks may narrow the registry)."""
    try:
        cls(**{option: value})
    except Exception:  # noqa: BLE001 - a user's estimator may need other options to be built at all
        return False
    return True


def _also_means(name: str, meanings: Mapping[str, tuple[str, str]], shown: str) -> str | None:
    """The line (on stderr, after the card) for ``name`` with more than one meaning: the others and how to show
    them."""
    others = [f"{what}: rlzoo explain {name} --kind {kind}" for kind, (what, _) in meanings.items() if kind != shown]
    return f"{name} is also {'; '.join(others)}" if others else None


def _cmd_explain(args: argparse.Namespace) -> int:
    from rlzoo.losses import algorithms_markdown, get_loss, presets
    from rlzoo.losses.presets import needs_line
    from rlzoo.registry import UnknownNameError, close_names

    if args.loss_options and (args.all or not args.name or args.kind not in (None, "preset")):
        kind = f", not with --kind {args.kind}" if args.kind not in (None, "preset") else ""
        raise ValueError(f"rlzoo explain: --loss.NAME VALUE options go with one preset name (rlzoo list){kind}")
    if args.all:
        if args.kind or args.name:
            raise ValueError("rlzoo explain --all shows every preset: give no NAME or --kind (rlzoo explain NAME "
                             "--kind KIND shows one)")
        if args.markdown:
            sys.stdout.write(algorithms_markdown())
        else:
            print("\n\n".join(card.card() for _, card in presets.items()))
        return 0
    if not args.name:
        print("rlzoo: error: rlzoo explain takes a preset, a part or an advantage estimator (rlzoo list names them), "
              "or --all",
              file=sys.stderr)
        return 2
    meanings = _explanations(args.name)
    if args.kind is not None and args.kind not in meanings:
        names = _names_of_kind(args.kind)
        close = close_names(args.name, names)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        other = f" (it is {' and '.join(what for what, _ in meanings.values())})" if meanings else ""
        raise UnknownNameError(f"rlzoo explain --kind {args.kind}: {args.name!r} is no {_EXPLAIN_KINDS[args.kind]}"
                               f"{other}{hint}; "
                               f"valid names: {', '.join(names)}")
    if not meanings:
        try:
            presets.get(args.name)  # the presets' did-you-mean
        except UnknownNameError as err:  # and what else explain takes
            raise UnknownNameError(f"rlzoo explain: {args.name!r} is no preset, part, option value or advantage "
                                   f"estimator (rlzoo list names them all); {err}") from None
    kind = args.kind or next(iter(meanings))
    if args.loss_options and kind != "preset":
        raise ValueError(f"rlzoo explain: --loss.NAME VALUE options go with a preset, and {args.name!r} is "
                         f"{meanings[kind][0]} here")
    if args.markdown:  # the preset's section of docs/algorithms.md
        if kind != "preset" or args.loss_options:
            raise ValueError(f"rlzoo explain --markdown renders a preset's section of docs/algorithms.md, as "
                             f"registered: {args.name!r} is {meanings[kind][0]} here" if kind != "preset" else
                             "rlzoo explain --markdown renders a preset as registered: drop the --loss.NAME options")
        print(presets.get(args.name).markdown())
        return 0
    name = presets.canonical(args.name) if kind == "preset" else args.name
    # built before the card prints: an unknown option (did-you-mean) or a bad value is an error without a card
    loss = get_loss(name, **args.loss_options) if args.loss_options else None
    print(meanings[kind][1])
    if kind == "preset":
        also = _also_means(name, meanings, kind)
        if also:  # on stderr: stdout is the card, as before
            print(f"\n{also}", file=sys.stderr)
        if loss is not None:  # the components these options build
            given = " ".join(f"--loss.{k} {v}" for k, v in args.loss_options.items())
            print(f"\ncomponents (with {given}):\n" + "\n".join("  " + line for line in loss.describe().splitlines()))
            print(needs_line(loss))
    return 0


def _loss_options(argv: Sequence[str], prog: str) -> tuple[list[str], dict[str, Any]]:
    """``(the other arguments, {OPTION: value})`` of ``--loss.OPTION VALUE`` (or ``=VALUE``) flags in ``argv``,
    values read as YAML scalars, as ``rlzoo train`` takes them.

    Raises:
        ValueError: another dotted option (``--task.x``; names ``prog``).
        CommandLineError: ``--loss.OPTION`` without a value (:func:`_dotted_value`).
    """
    rest, overrides = [], {}
    i, argv = 0, list(argv)
    while i < len(argv):
        match = _DOTTED.match(argv[i])
        if not match:
            rest.append(argv[i])
        elif match.group(1) != "loss":
            raise ValueError(f"{prog} takes loss options only (--loss.NAME VALUE), got {argv[i]}")
        else:
            value = match.group(3)
            if value is None:
                value, i = _dotted_value(argv, i), i + 1
            overrides[match.group(2).replace("-", "_")] = _scalar(value, numeric=True)
        i += 1
    return rest, overrides


def _cmd_plot(argv: Sequence[str]) -> int:
    """``rlzoo plot NAME [--output FILE] [--loss.OPTION VALUE ...]`` or ``rlzoo plot --all [--output-dir DIR]``:
    the per-token objective and its gradient as functions of the ratio (:func:`rlzoo.losses.pictures.plot_objective`),
    computed by calling the loss on one-token batches."""
    from rlzoo.losses.pictures import plot_all, plot_objective

    parser = argparse.ArgumentParser(
        prog="rlzoo plot", description="A PNG of a preset's per-token objective and its gradient with respect to "
        "log pi, as functions of the ratio r, for A > 0 and A < 0 (the loss itself, called with autograd). "
        "Loss options: --loss.NAME VALUE, as rlzoo train takes them (values read as YAML scalars).")
    parser.add_argument("name", nargs="?", help="a preset (rlzoo list)")
    parser.add_argument("--output", help="the file to write (default NAME.png, NAME as registered)")
    parser.add_argument("--all", action="store_true", help="every preset, with its defaults, into --output-dir")
    parser.add_argument("--output-dir", type=Path, help="where NAME.png (or --all's pictures: docs/pictures for the "
                        "docs) go (default: the current directory)")
    parser.add_argument("--advantage-magnitude", type=float, default=1.0, help="|A| (default 1)")
    parser.add_argument("--old-prob", type=float, default=0.2,
                        help="p_old of the token (default 0.2; lowered to 1/r_max where r_max needs it, noted)")
    parser.add_argument("--r-max", type=float, help="largest ratio drawn (default 3 or beyond the loss's caps)")
    parser.add_argument("--dpi", type=int, default=100, help="dots per inch (default 100; docs/pictures uses 72)")
    rest, overrides = _loss_options(argv, "rlzoo plot")
    args = parser.parse_args(rest)
    options = {"advantage": args.advantage_magnitude, "old_prob": args.old_prob, "r_max": args.r_max, "dpi": args.dpi}
    if args.all:
        if args.name or overrides or args.output:
            raise ValueError("rlzoo plot --all draws every preset with its defaults: give no NAME, --output or --loss.*")
        with _plot_flags_named():
            paths = plot_all(args.output_dir or Path("."), **options)
        print(f"rlzoo plot: wrote {len(paths)} pictures to {args.output_dir or Path('.')}")
        return 0
    if not args.name:
        print("rlzoo: error: rlzoo plot takes a preset name (rlzoo list names them) or --all", file=sys.stderr)
        return 2
    if args.output and args.output_dir:
        raise ValueError("rlzoo plot: give --output FILE or --output-dir DIR, not both")
    from rlzoo.losses import presets

    if presets.canonical(args.name) not in presets.names() and (Path(args.name) / "config.json").is_file():
        raise ValueError(f"rlzoo plot draws a loss preset's objective; {args.name} is a run, whose plot is "
                         f"{Path(args.name) / 'reward.png'} (written at each checkpoint)")
    # the registered spelling names the default file (rlzoo plot DAPO writes dapo.png, as docs/pictures names them)
    default = (args.output_dir or Path(".")) / f"{presets.canonical(args.name)}.png"
    with _plot_flags_named():
        path = plot_objective(args.name, args.output or default, **options, **overrides)
    from rlzoo.trainer.io import is_stream

    print(f"rlzoo plot: wrote {path}", file=sys.stderr if is_stream(path) else sys.stdout)  # not into the picture
    return 0


# the plotting functions' parameter names in their range errors, and the rlzoo plot flags that set them
_PLOT_FLAGS = {"objective_curves: advantage ": "--advantage-magnitude ", "objective_curves: old_prob ": "--old-prob ",
               "objective_curves: r_max ": "--r-max ", "plot_objective: dpi ": "--dpi "}


@contextlib.contextmanager
def _plot_flags_named() -> Iterator[None]:
    """Re-raise a range error of :mod:`rlzoo.losses.pictures` naming the ``rlzoo plot`` flag, not the parameter."""
    try:
        yield
    except ValueError as err:
        text = str(err)
        flag = next((f for internal, f in _PLOT_FLAGS.items() if text.startswith(internal)), None)
        if flag is None:
            raise
        raise ValueError(flag + text.split(" ", 2)[2].replace("max(1, r_min)", "1")) from None  # (no --r-min flag)


def _cmd_train(argv: Sequence[str]) -> int:
    from rlzoo.trainer import train
    from rlzoo.trainer.distributed import leave_process_group
    from rlzoo.trainer.interrupts import RunInterrupted

    config = parse_train_args(argv)
    try:
        history = train(config)
    except (RunInterrupted, FloatingPointError):
        # every rank stops after the same step (a signal agreed through an all-reduce, a non-finite reduced loss or
        # gradient norm): they leave the process group together, as after a normal end
        leave_process_group()
        raise
    leave_process_group()  # under torchrun: every rank leaves the group together before the interpreter exits
    key = "eval/accuracy" if any(r.get("eval/accuracy") is not None for r in history) else "eval/reward"
    evals = [r for r in history if r.get(key) is not None]  # the reward of a task without answers
    if evals and os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for the run
        first, last = evals[0], evals[-1]
        shown = (lambda v: f"{100 * v:.1f}%") if key == "eval/accuracy" else (lambda v: f"{v:.3f}")
        print(f"held-out greedy {key[5:]}: step {first['step']} {shown(first[key])} -> "
              f"step {last['step']} {shown(last[key])}")
    return 0


def _cmd_eval(argv: Sequence[str]) -> int:
    """``rlzoo eval``: the JSON result on stdout, a one-line summary on stderr."""
    import dataclasses
    import json

    from rlzoo.trainer.eval_run import EvalArgs, eval_args_from_file, eval_result, with_run

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("rlzoo eval runs in one process: run it without torchrun (python -m rlzoo eval ...); a "
                         "run's held-out evaluation during training is the one sharded over the ranks")
    path, plain = _config_file(argv)
    train_only = [a.split("=", 1)[0] for a in plain if (m := _DOTTED.match(a)) and m.group(1) != "task"]
    if train_only:
        raise CommandLineError(f"rlzoo eval takes --task.NAME options only; {', '.join(train_only)} "
                               f"{'is' if len(train_only) == 1 else 'are'} rlzoo train's")
    settings, rest = _config_and_dotted(argv, train=False)
    default = None if path is None else eval_args_from_file(settings, source=path,
                                                            python_rewards=_records_python_rewards(path))
    _refuse_trl_spellings(rest, takes={f.name for f in dataclasses.fields(EvalArgs)})
    rest = [("none" if a == "None" and i and flag_name(rest[i - 1]) == "--reward-funcs" else a)  # tyro: None = unset
            for i, a in enumerate(rest)]
    args = tyro_cli(EvalArgs, args=rest, prog="rlzoo eval", description=_EVAL_HELP, default=default, dotted=["task"])
    if default is not None and args.run is not None:
        args = with_run(args, default, {flag_name(a) for a in rest}, source=str(path))
    args = dataclasses.replace(args, task_kwargs=settings.get("task_kwargs"))
    if path is not None:
        _check_eval_file(settings, argv)
    try:
        out = eval_result(args)
    except ValueError as err:  # a setting's error names it as it was given: its flag, or the --config file's key
        message, flags = str(err), {flag_name(a) for a in rest}
        field = re.match(r"(?:--)?([a-z_]+)(?= (must|gives) )", message)  # a value's check: "eval_size must be ..."
        flag = field and "--" + field.group(1).replace("_", "-")
        if flag in flags and not message.startswith(flag):
            raise type(err)(flag + message.removeprefix(field.group(1))) from err
        if path is not None and flag not in flags and message.startswith("--reward-weights gives"):
            raise type(err)(f"{path}: reward_weights{message.removeprefix('--reward-weights')}") from err
        raise
    print(json.dumps(out, indent=2, allow_nan=False))
    accuracy = (f"greedy accuracy {100 * out['accuracy']:.1f}% (95% CI {100 * out['ci_low']:.1f}-"
                f"{100 * out['ci_high']:.1f}, n={out['n']})" if out["accuracy"] is not None else f"n={out['n']}")
    reward = f", reward {out['reward']:.3f}" if out["reward"] is not None else ""
    print(f"rlzoo eval: {out['model']} on {out['task']}: {accuracy}{reward}", file=sys.stderr)
    return 0


def _check_eval_file(settings: Mapping[str, Any], argv: Sequence[str]) -> None:
    """``rlzoo eval``'s ``--config`` file checked as ``rlzoo train`` checks it: its option tables (the loss's, the
    advantage estimator's, LoRA's, the task's) and its ``algorithm``, so that a typo there fails naming the file.
    An algorithm that is no registered preset here is left unchecked with a warning (rlzoo eval builds no loss; a
    preset of the user's own is known only where its module is imported).

    Raises:
        ValueError, UnknownNameError: as :func:`_check_file_tables`.
    """
    from rlzoo.losses import list_losses
    from rlzoo.registry import close_names
    from rlzoo.trainer.config import TrainConfig

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    config = TrainConfig.from_dict({key: value for key, value in settings.items() if key in fields})
    if config.algorithm not in list_losses():
        close = close_names(config.algorithm, list_losses())
        logging.getLogger("rlzoo.train").warning(
            "%s: algorithm %r is no registered preset here%s; its loss options are not checked (rlzoo eval builds no "
            "loss)", _config_file(argv)[0], config.algorithm, f" (did you mean {close[0]!r}?)" if close else "")
        default = TrainConfig(model=config.model)  # the LoRA and task options are still checked
        config = dataclasses.replace(config, algorithm=default.algorithm, loss=default.loss, advantage=None,
                                     advantage_options=default.advantage_options)
    _check_file_tables(config, argv, algorithm=True)


def _records_python_rewards(path: str) -> bool:
    """Whether config file ``path`` is a run's ``config.json`` whose rewards included Python callables."""
    import json

    try:
        return path.endswith(".json") and bool(json.loads(Path(path).read_text()).get("resolved_python_reward_funcs"))
    except (OSError, ValueError, AttributeError):  # unreadable or not an object: the config's own errors say so
        return False


def _cmd_tasks(args: argparse.Namespace) -> int:
    """``rlzoo tasks [NAME]``: every reasoning-gym task with its options (NAME: one, with defaults; a data set file
    or directory: the data set options), and the data set tasks' options."""
    import dataclasses

    from reasoning_gym.factory import DATASETS

    from rlzoo.trainer.config import TaskConfig
    from rlzoo.trainer.tasks import DATASET_OPTIONS, list_reasoning_gym_tasks
    from rlzoo.trainer.tasks.dataset_loading import is_dataset_spec

    def options(name: str, defaults: bool) -> list[str]:
        fields = [f for f in dataclasses.fields(DATASETS[name][1]) if f.name not in ("seed", "size")]
        if not defaults:
            return [f.name for f in fields]
        ours = TaskConfig(task=name).resolved_task_kwargs  # rlzoo's built-in options (chain_sum) over reasoning-gym's
        return [f"{f.name}={ours.get(f.name, f.default)!r}" if f.name in ours or f.default is not dataclasses.MISSING
                else f.name for f in fields]

    if args.name and args.name not in DATASETS and is_dataset_spec(args.name):  # a data set: file, directory, hub id
        print(f"{args.name} (data set): --task {args.name}")
        for name, meaning in DATASET_OPTIONS.items():
            print(f"  --task.{name:<14} {meaning}")
        return 0
    if args.name:
        if args.name in DATASET_OPTIONS or args.name not in DATASETS:
            from rlzoo.registry import UnknownNameError, close_names

            names = list_reasoning_gym_tasks()
            if args.name in DATASET_OPTIONS:
                meant = f" ({args.name} is an option of data set tasks: --task.{args.name})"
            else:
                close = close_names(args.name, names)
                meant = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise UnknownNameError(f"unknown reasoning-gym task {args.name!r}{meant}; valid names: {', '.join(names)}")
        print(f"{args.name} (reasoning-gym): --task {args.name}")
        for option in options(args.name, defaults=True):
            print(f"  --task.{option.replace('=', ' ', 1)}")
        return 0
    print("data sets (--task FILE.jsonl|.json|.csv|.tsv|.parquet, a save_to_disk or hub-style directory, or a hub id):")
    for name, meaning in DATASET_OPTIONS.items():
        print(f"  --task.{name:<14} {meaning}")
    print("\nreasoning-gym tasks (--task NAME; options --task.OPTION VALUE; rlzoo tasks NAME for defaults):")
    for name in list_reasoning_gym_tasks():
        print(f"  {name:<28} {', '.join(options(name, defaults=False))}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    """``rlzoo export SOURCE OUTPUT``: a checkpoint as a plain Hugging Face model, a LoRA adapter merged."""
    from rlzoo.trainer.adapters import export_model

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # every rank would write OUTPUT at once
        raise ValueError("rlzoo export runs in one process: run it without torchrun (python -m rlzoo export ...)")
    path = export_model(args.source, args.output, overwrite=args.overwrite)
    print(f"rlzoo export: wrote {path}")
    return 0


def _selects_a_subset(pytest_args: Sequence[str]) -> bool:
    """Whether pytest arguments select part of the suite (``-k``, ``-m``, also combined as ``-vk``, ``--lf``,
    ``--deselect``, ...). A file or node id does not: ``benchmarks/`` itself is collected too."""
    selecting = ("--lf", "--last-failed", "--sw", "--stepwise", "--sw-skip", "--stepwise-skip", "--deselect",
                 "--ignore", "--ignore-glob")

    def picks(arg: str) -> bool:
        if arg.startswith("--"):
            return arg.split("=", 1)[0] in selecting
        for letter in arg[1:] if arg.startswith("-") else "":  # short flags, combined (-vk EXPR) or -kEXPR
            if letter in "km":
                return True
            if not letter.isalpha():  # a value began
                return False
        return False

    return any(picks(a) for a in pytest_args)


def _cmd_bench(argv: Sequence[str]) -> int:
    """``rlzoo bench [--output FILE] [--docs FILE] [--no-render] [PYTEST ARGS...]``: run ``benchmarks/`` with
    pytest-benchmark, save its JSON (default ``benchmarks/results/cuda.json`` on a GPU machine, else ``cpu.json``)
    and render it with ``benchmarks/render.py`` (every results file when FILE is under ``benchmarks/results/``,
    else FILE alone). The committed page (``docs/benchmarks.md`` + ``.png``) is the default only for the committed
    results: a subset (``-k``, ``-m``, ...) needs ``--output`` outside ``benchmarks/results/``, and results written
    elsewhere need ``--docs FILE`` or ``--no-render`` (refused before pytest starts). The JSON goes to
    ``FILE.partial`` first and replaces FILE only when pytest succeeded; a failed run keeps the partial results and
    renders nothing. Needs a source checkout and the ``bench`` extra; returns pytest's exit status (2 for bad
    usage)."""
    import importlib.util
    import json

    root = Path(__file__).resolve().parent.parent
    bench = root / "benchmarks"
    if not bench.is_dir():
        print("rlzoo bench runs the benchmark suite of a source checkout (benchmarks/ not found next to rlzoo/)",
              file=sys.stderr)
        return 2
    missing = [dist for module, dist in (("pytest", "pytest"), ("pytest_benchmark", "pytest-benchmark"),
                                         ("matplotlib", "matplotlib")) if importlib.util.find_spec(module) is None]
    if missing:
        print(f"rlzoo bench needs {', '.join(missing)}: pip install -e '{root}[bench]' (the bench extra)",
              file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="rlzoo bench", description="Run benchmarks/, save the JSON, render the docs; "
                                     "other arguments go to pytest (e.g. -k fused)")
    parser.add_argument("--output", type=Path, help="results JSON (default benchmarks/results/{cpu,cuda}.json: the "
                        "committed results, replaced by a successful full run; a selection by -k / -m needs --output "
                        "outside benchmarks/results/)")
    parser.add_argument("--docs", type=Path, help="rendered page, its plot next to it as .png (default "
                        "docs/benchmarks.md, only for results in benchmarks/results/; needed with any other --output)")
    parser.add_argument("--no-render", action="store_true", help="save the JSON only")
    args, pytest_args = parser.parse_known_args(list(argv))
    if any(a.startswith("--benchmark-json") for a in pytest_args):
        raise ValueError("rlzoo bench: use --output FILE instead of --benchmark-json")
    results = bench / "results"
    committed = args.output is None or args.output.resolve().parent == results.resolve()
    if committed and _selects_a_subset(pytest_args):
        raise ValueError(f"rlzoo bench {' '.join(pytest_args)}: a subset of the suite would replace the committed full "
                         "results (benchmarks/results/) and docs/benchmarks.md; give --output FILE outside "
                         "benchmarks/results/ for its JSON, and --docs FILE or --no-render")
    if not committed and args.docs is None and not args.no_render:
        raise ValueError(f"rlzoo bench --output {args.output}: the committed docs/benchmarks.md is rendered from "
                         "benchmarks/results/ only; give --docs FILE for this run's page, or --no-render")
    if args.output is None:
        import torch

        args.output = results / ("cuda.json" if torch.cuda.is_available() else "cpu.json")
    from rlzoo.trainer.io import is_stream

    if is_stream(args.output):  # a rename onto /dev/null replaces the device (as root); the page reads the file back
        raise ValueError(f"rlzoo bench --output {args.output}: not a regular file; give a file to save the results in")
    output = args.output.resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    # -o addopts=: no doctest collection of benchmarks/ (it would import every script) and no test-time type checker
    command = [sys.executable, "-m", "pytest", str(bench), "-o", "addopts=", "--benchmark-only", "-p", "no:cacheprovider",
               f"--benchmark-json={partial}", *pytest_args]
    status = subprocess.call(command, cwd=root)
    if status != 0:
        kept = f"; the cases that ran are in {partial}" if partial.exists() else ""
        print(f"rlzoo bench: pytest exited with status {status}: {output} unchanged, nothing rendered{kept}",
              file=sys.stderr)
        return status
    if not partial.exists() or not json.loads(partial.read_text()).get("benchmarks"):
        partial.unlink(missing_ok=True)
        print(f"rlzoo bench: no benchmark ran (all skipped or deselected): {output} unchanged", file=sys.stderr)
        return 0
    os.replace(partial, output)  # pytest-benchmark wrote the whole file; the rename makes it appear at once
    print(f"rlzoo bench: saved {output}")
    if args.no_render:
        return 0
    docs = (args.docs or root / "docs" / "benchmarks.md").resolve()
    files = [] if output.parent == results.resolve() else [str(output)]
    return subprocess.call([sys.executable, str(bench / "render.py"), *files, "--out", str(docs),
                            "--plot", str(docs.with_suffix(".png"))], cwd=root)


USER_ERRORS = (ValueError, KeyError, ImportError, OSError, FloatingPointError)
"""Exceptions the ``rlzoo`` command prints as one message instead of a traceback (``RLZOO_DEBUG=1``: raise).
Anything else (``RuntimeError`` from torch internals, ...) is a bug and keeps its traceback."""


_TRAIN_EXTRA = frozenset({"transformers", "accelerate", "gguf", "safetensors", "reasoning_gym", "tqdm", "yaml", "tyro",
                          "datasets", "peft"})
"""Modules of the ``train`` extra (a core install has the zoo, ``list``, ``explain`` and, with matplotlib, ``plot``)."""


def console_main() -> int:
    """The ``rlzoo`` console script: :func:`main`, with bad input reported as ``rlzoo: error: ...`` (exit 2)
    instead of a traceback. ``RLZOO_DEBUG=1`` shows the traceback. A collective that failed under torchrun
    (another rank stopped, or timed out) is one line too (:func:`_collective_failure`, exit 1). A run stopped by
    SIGINT / SIGTERM exits 130 / 143 after its checkpoint; a second Ctrl-C exits 130 at once, a repeated SIGTERM
    (a scheduler's) is ignored (:mod:`rlzoo.trainer.interrupts`). Output into a closed pipe (stdout a pipe whose
    reader has gone) exits 141 without a message."""
    from rlzoo.trainer.interrupts import RunInterrupted

    try:
        return main()
    except RunInterrupted as stop:
        if os.environ.get("RANK", "0") == "0":  # the same line on every rank under torchrun: rank 0's
            print(f"rlzoo: {stop}", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:
        print("rlzoo: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError as err:
        if os.environ.get("RLZOO_DEBUG") or not _stdout_is_pipe():
            return _report(err)
        # the reader of stdout went away (``rlzoo tasks | head``): quiet, as a command killed by SIGPIPE
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's flush of stdout at exit would raise again
        return 141
    except USER_ERRORS as err:
        return _report(err)
    except RuntimeError as err:  # under torchrun: a collective another rank left or never reached
        message = _collective_failure(err)
        if message is None or os.environ.get("RLZOO_DEBUG"):
            raise
        _report(RuntimeError(message))
        return 1


_COLLECTIVE = re.compile(r"connection (closed|reset) by peer|timed out waiting|collective operation timeout|"
                         r"communicator was aborted", re.IGNORECASE)
"""What torch.distributed's backends say when a collective fails for another rank (a plain RuntimeError from gloo):
a peer gone, or a wait past the timeout. Not their other errors (a failed set-up, a CUDA error): a traceback."""


def _collective_failure(err: RuntimeError) -> str | None:
    """One line for a collective that failed on this rank under torchrun (more than one rank): where in rlzoo, and
    why in rlzoo's terms (another rank stopped, with its own error line; or it did not arrive within
    ``--distributed-timeout``), with the backend's own words; None for any other error (a bug: its traceback).
    The surviving rank printed about 40 lines of gloo traceback after the failing rank's one-line error."""
    import traceback

    if os.environ.get("WORLD_SIZE", "1") in ("", "0", "1") or not _COLLECTIVE.search(str(err)):
        return None
    said = re.sub(r"^\[[^\]]*\]\s*", "", str(err).splitlines()[0] if str(err) else "")  # gloo's "[pair.cc:553] "
    package = Path(__file__).resolve().parent
    frames = [f for f in traceback.extract_tb(err.__traceback__) if package in Path(f.filename).resolve().parents]
    collective = [f.name for f in frames if Path(f.filename).name == "distributed.py"]  # the method rlzoo called
    callers = [f for f in frames if Path(f.filename).name not in ("distributed.py", "cli.py")]
    where = (f" ({collective[0]})" if collective else "") + (
        f" in {Path(callers[-1].filename).relative_to(package.parent)}:{callers[-1].lineno} ({callers[-1].name})"
        if callers else "")
    why = ("another rank did not reach it within --distributed-timeout (stuck, or much slower: raise "
           "--distributed-timeout if its work is legitimately that slow)" if "time" in said.lower() else
           "another rank stopped (its own error is the 'rlzoo: error (rank N)' line above, or torchrun's report)")
    return f"a collective failed{where}: {why} [{said}]"


def _stdout_is_pipe() -> bool:
    """Whether stdout is a pipe (where a BrokenPipeError is the reader going away, not a failure of the command)."""
    try:
        return stat.S_ISFIFO(os.fstat(sys.stdout.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):  # no file descriptor (a replaced sys.stdout)
        return False


def _report(err: BaseException) -> int:
    """Bad input as one line ``rlzoo: error: ...`` (exit 2; ``rlzoo: error (rank R): ...`` under torchrun with more
    than one rank, where a rank-local error, such as a reward function raising on one rank, must say where);
    under ``RLZOO_DEBUG=1`` the traceback instead."""
    if os.environ.get("RLZOO_DEBUG"):
        raise err
    message = err.args[0] if isinstance(err, KeyError) and err.args else err
    if isinstance(err, ModuleNotFoundError) and (err.name or "").split(".")[0] in _TRAIN_EXTRA:
        message = f"{err}: this command needs the train extra, pip install 'rlzoo[train]'"
    debug = "" if isinstance(err, CommandLineError) else " (RLZOO_DEBUG=1 shows the traceback)"
    ranks = os.environ.get("WORLD_SIZE", "1")
    where = f" (rank {os.environ['RANK']})" if "RANK" in os.environ and ranks not in ("", "0", "1") else ""
    print(f"rlzoo: error{where}: {message}{debug}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlzoo`` command (raises on bad input; the console script is :func:`console_main`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    rank = os.environ.get("RANK", "0")
    level = os.environ.get("RLZOO_LOG_LEVEL", "INFO" if rank == "0" else "WARNING")
    ranks = os.environ.get("WORLD_SIZE", "1") not in ("", "0", "1")  # under torchrun: each line says its rank
    ours = not logging.getLogger().handlers  # basicConfig configures logging (not a caller's, e.g. a test's)
    logging.basicConfig(level=level, datefmt="%H:%M:%S",
                        format=f"%(asctime)s %(levelname)s %(name)s{f' [rank {rank}]' if ranks else ''}: %(message)s")
    if ours and ranks and rank != "0" and argv[:1] == ["train"] and "RLZOO_LOG_LEVEL" not in os.environ:
        # what every rank logs the same is rank 0's to show (RLZOO_LOG_LEVEL, set to debug a rank, shows it all)
        from rlzoo.trainer.distributed import shown_on_every_rank

        for handler in logging.getLogger().handlers:
            handler.addFilter(shown_on_every_rank)
    for noisy in ("httpx", "urllib3", "transformers", "accelerate"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if argv and argv[0] in ("train", "eval", "bench", "plot"):
        command, rest = argv[0], argv[1:]
        return {"train": _cmd_train, "eval": _cmd_eval, "bench": _cmd_bench, "plot": _cmd_plot}[command](rest)

    import rlzoo

    parser = argparse.ArgumentParser(prog="rlzoo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"rlzoo {rlzoo.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="presets, advantage estimators and parts")
    explain = sub.add_parser("explain", help="a preset's card (formula, components, defaults, paper), or a part's "
                             "or advantage estimator's documentation",
                             epilog="--loss.OPTION VALUE (repeatable, after a preset NAME): also show the components "
                             "those loss options build, e.g. rlzoo explain dapo --loss.beta 0.04")
    explain.add_argument("name", nargs="?", help="a preset, advantage estimator, part, KL estimator or a part's "
                         "option value (rlzoo list); a name of more than one kind shows the preset (--kind)")
    explain.add_argument("--kind", choices=list(_EXPLAIN_KINDS), help="which meaning of NAME to show, where it names "
                         "more than one (grpo: the preset, or --kind advantage; cispo: --kind part)")
    explain.add_argument("--all", action="store_true", help="every preset")
    explain.add_argument("--markdown", action="store_true",
                         help="a preset's section of docs/algorithms.md (with --all: the whole file)")
    tasks = sub.add_parser("tasks", help="the tasks and their options")
    tasks.add_argument("name", nargs="?", help="a reasoning-gym task: its options with their defaults")
    export = sub.add_parser("export", help="a checkpoint as a plain Hugging Face model (a LoRA adapter merged)")
    export.add_argument("source", help="a checkpoint (RUN/checkpoints/step-N), its model/ directory, or a model")
    export.add_argument("output", help="the directory to write (new or empty)")
    export.add_argument("--overwrite", action="store_true",
                        help="replace OUTPUT if it is not empty (everything in it is deleted; never a run directory)")
    for name, text in (("train", "train a model (rlzoo train --help)"),
                       ("eval", "greedy accuracy and reward of a run or a model (rlzoo eval --help)"),
                       ("bench", "the pytest-benchmark suite"),
                       ("plot", "a picture of a loss: objective and gradient vs. the ratio (rlzoo plot --help)")):
        sub.add_parser(name, help=text)
    rest, overrides = _loss_options(argv, "rlzoo explain") if argv and argv[0] == "explain" else (argv, {})
    args = parser.parse_args(rest)
    args.loss_options = overrides
    return {"list": _cmd_list, "explain": _cmd_explain, "tasks": _cmd_tasks, "export": _cmd_export}[args.command](args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(console_main())
