"""``rlzoo``: list and explain the zoo, train, evaluate, benchmark.

::

    rlzoo list                          presets (with papers), advantage estimators, parts
    rlzoo explain dapo                  a preset's card: formula, components, defaults, paper
    rlzoo explain --all --markdown      docs/algorithms.md
    rlzoo train [--config FILE] [--algorithm NAME] [--loss.OPTION VALUE] [--advantage NAME] ...
    rlzoo eval --model PATH_OR_NAME [--task NAME] [--task.OPTION VALUE] [--eval-size N]
    rlzoo bench [pytest options]        the pytest-benchmark suite (source checkout)

Flags of ``train`` and ``eval`` are the fields of :class:`rlzoo.trainer.TrainConfig` in kebab-case
(``rlzoo train --help``); dotted flags set the mapping options: ``--loss.epsilon_high 0.28``,
``--advantage.scale none``, ``--task.max_terms 3`` (values are parsed as YAML scalars: 0.28, true, null).
"""

import argparse
import logging
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["console_main", "main", "parse_train_args"]

_DOTTED = re.compile(r"^--(loss|advantage|task)\.([A-Za-z0-9_\-]+)(?:=(.*))?$")
_DOTTED_FIELD = {"loss": "loss", "advantage": "advantage_options", "task": "task_kwargs"}


def _scalar(text: str) -> Any:
    """A flag value as a YAML scalar (``0.28``, ``true``, ``null``, and ``1e-3`` as a number)."""
    import yaml

    from rlzoo.trainer.config import yaml_numbers

    try:
        return yaml_numbers(yaml.safe_load(text))
    except yaml.YAMLError:
        return text


_TRAIN_HELP = """Train a causal LM with any loss of the zoo (flags = TrainConfig fields; rlzoo eval reads the model,
task and evaluation flags among them).

Besides the flags below: --config FILE (TOML, YAML or JSON with the same field names; flags override it),
and the dotted options --loss.NAME VALUE (see `rlzoo explain ALGORITHM`), --advantage.NAME VALUE and
--task.NAME VALUE (the data set's options), values read as YAML scalars (0.28, 1e-3, true, null)."""


def parse_train_args(argv: Sequence[str], prog: str = "rlzoo train"):
    """Parse ``rlzoo train`` arguments into a :class:`~rlzoo.trainer.TrainConfig`.

    Precedence: built-in defaults < ``--config FILE`` < flags. Dotted flags merge into the file's mappings.

    Raises:
        SystemExit: on ``--help`` or a parse error (argparse/tyro behaviour).
        ValueError: invalid values (from :class:`TrainConfig` validation).
    """
    import dataclasses

    import tyro

    from rlzoo.trainer.config import TrainConfig, load_config_file

    argv = list(argv)
    base: dict[str, Any] = {}
    for i, arg in enumerate(argv):
        if arg == "--config":
            if i + 1 >= len(argv):
                raise SystemExit(f"{prog}: --config needs a file")
            base = load_config_file(argv[i + 1])
            del argv[i:i + 2]
            break
        if arg.startswith("--config="):
            base = load_config_file(arg.split("=", 1)[1])
            del argv[i]
            break
    dotted: dict[str, dict[str, Any]] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        match = _DOTTED.match(argv[i])
        if match:
            kind, key, value = match.group(1), match.group(2).replace("-", "_"), match.group(3)
            if value is None:
                if i + 1 >= len(argv):
                    raise SystemExit(f"{prog}: {argv[i]} needs a value")
                value = argv[i + 1]
                i += 1
            dotted.setdefault(_DOTTED_FIELD[kind], {})[key] = _scalar(value)
        else:
            rest.append(argv[i])
        i += 1
    for field, values in dotted.items():
        base[field] = {**(base.get(field) or {}), **values}
    default = TrainConfig.from_dict(base)
    parsed = tyro.cli(TrainConfig, args=rest, default=default, prog=prog, description=_TRAIN_HELP)
    # tyro rebuilds the dataclass from flags; keep the dotted mappings it does not parse.
    return dataclasses.replace(parsed, loss=default.loss, advantage_options=default.advantage_options,
                               task_kwargs=default.task_kwargs)


def _cmd_list(args: argparse.Namespace) -> int:
    from rlzoo.advantages import advantage_estimators
    from rlzoo.losses import kl_estimators, presets
    from rlzoo.losses.policy_loss import SLOTS

    print("loss presets (rlzoo.get_loss / --algorithm):")
    for name, card in presets.items():
        paper = f"arXiv:{card.arxiv}" if card.arxiv else "-"
        print(f"  {name:<12} {card.title}  [{paper}]")
    print("\nadvantage estimators (rlzoo.get_advantage / --advantage):")
    for name, cls in advantage_estimators.items():
        summary = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        print(f"  {name:<22} {summary}")
        for option, registry in cls.choices().items():
            print(f"  {'':<22}   {option}: {', '.join(registry.names())}")
    print("\nparts (compose your own: rlzoo.losses.PolicyLoss; rlzoo explain PART):")
    for slot in SLOTS:
        how = f" ({slot.swap_option})" if slot.swap_option else ""
        print(f"  {slot.field}{how}: {', '.join(slot.base.registry.names())}")
        for cls in slot.base.registry.values():
            for option, registry in cls.choices().items():
                if registry is not kl_estimators:
                    print(f"    {option}: {', '.join(registry.names())}")
    print(f"  kl estimators (kl_estimator): {', '.join(kl_estimators.names())}")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    from rlzoo.advantages import advantage_estimators
    from rlzoo.losses import algorithms_markdown, presets

    if args.all:
        if args.markdown:
            sys.stdout.write(algorithms_markdown())
        else:
            print("\n\n".join(card.card() for _, card in presets.items()))
        return 0
    if not args.name:
        print("rlzoo explain: give a preset name or --all", file=sys.stderr)
        return 2
    if args.name in presets:
        print(presets.get(args.name).card())
        return 0
    import inspect

    from rlzoo.losses.policy_loss import SLOTS

    if args.name in advantage_estimators:
        print(f"{args.name} (advantage estimator)\n")
        print(inspect.cleandoc(advantage_estimators.get(args.name).__doc__ or ""))
        return 0
    for slot in SLOTS:
        if args.name in slot.base.registry:
            cls = slot.base.registry.get(args.name)
            print(f"{args.name} ({slot.base.__name__}, PolicyLoss.{slot.field}; {cls.__module__}.{cls.__qualname__})\n")
            print(inspect.cleandoc(cls.__doc__ or ""))
            return 0
    presets.get(args.name)  # raises UnknownNameError listing the presets
    return 2


def _cmd_train(argv: Sequence[str]) -> int:
    from rlzoo.trainer import train

    config = parse_train_args(argv)
    history = train(config)
    evals = [r for r in history if r.get("eval/accuracy") is not None]
    if evals:
        first, last = evals[0], evals[-1]
        print(f"held-out greedy accuracy: step {first['step']} {100 * first['eval/accuracy']:.1f}% -> "
              f"step {last['step']} {100 * last['eval/accuracy']:.1f}%")
    return 0


def _cmd_eval(argv: Sequence[str]) -> int:
    from rlzoo.trainer.loop import evaluate

    config = parse_train_args(argv, prog="rlzoo eval")
    result = evaluate(config)
    print(f"{config.model} on {config.task}: greedy accuracy {result}")
    for question, completion, score in result.samples:
        print(f"  [{score:.0f}] {question!r} -> {completion!r}")
    return 0


def _cmd_bench(argv: Sequence[str]) -> int:
    root = Path(__file__).resolve().parent.parent
    bench = root / "benchmarks"
    if not bench.is_dir():
        print("rlzoo bench runs the benchmark suite of a source checkout (benchmarks/ not found next to rlzoo/)",
              file=sys.stderr)
        return 2
    command = [sys.executable, "-m", "pytest", str(bench), "--benchmark-only", "-p", "no:cacheprovider", *argv]
    return subprocess.call(command, cwd=root)


USER_ERRORS = (ValueError, KeyError, ImportError, OSError, FloatingPointError, RuntimeError)
"""Exceptions the ``rlzoo`` command prints as one message instead of a traceback (``RLZOO_DEBUG=1``: raise)."""


def console_main() -> int:
    """The ``rlzoo`` console script: :func:`main`, with bad input reported as ``rlzoo: error: ...`` (exit 2)
    instead of a traceback. ``RLZOO_DEBUG=1`` shows the traceback."""
    try:
        return main()
    except KeyboardInterrupt:
        print("rlzoo: interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as err:
        if os.environ.get("RLZOO_DEBUG"):
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"rlzoo: error: {message}\n(RLZOO_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlzoo`` command (raises on bad input; the console script is :func:`console_main`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=os.environ.get("RLZOO_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "urllib3", "transformers", "accelerate"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if argv and argv[0] in ("train", "eval", "bench"):
        command, rest = argv[0], argv[1:]
        return {"train": _cmd_train, "eval": _cmd_eval, "bench": _cmd_bench}[command](rest)

    parser = argparse.ArgumentParser(prog="rlzoo", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="presets, advantage estimators and parts")
    explain = sub.add_parser("explain", help="a preset's card (formula, components, defaults, paper), or a part's "
                             "or advantage estimator's documentation")
    explain.add_argument("name", nargs="?")
    explain.add_argument("--all", action="store_true", help="every preset")
    explain.add_argument("--markdown", action="store_true", help="markdown (docs/algorithms.md)")
    for name, text in (("train", "train a model (rlzoo train --help)"), ("eval", "greedy accuracy of a model"),
                       ("bench", "the pytest-benchmark suite")):
        sub.add_parser(name, help=text)
    args = parser.parse_args(argv)
    return {"list": _cmd_list, "explain": _cmd_explain}[args.command](args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(console_main())
