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

    from rlzoo.trainer.config_files import yaml_numbers

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

    from rlzoo.trainer.config import TrainConfig
    from rlzoo.trainer.config_files import load_config_file

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
    from rlzoo.losses import aggregations, kl_estimators, presets, ratio_levels, surrogates

    print("loss presets (rlzoo.get_loss / --algorithm):")
    for name, card in presets.items():
        paper = f"arXiv:{card.arxiv}" if card.arxiv else "-"
        print(f"  {name:<12} {card.title}  [{paper}]")
    print("\nadvantage estimators (rlzoo.get_advantage / --advantage):")
    for name, cls in advantage_estimators.items():
        summary = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        print(f"  {name:<22} {summary}")
    print("\nparts (compose your own: rlzoo.losses.PolicyLoss):")
    print(f"  ratio levels (importance_sampling_level): {', '.join(ratio_levels.names())}")
    print(f"  surrogates: {', '.join(surrogates.names())}")
    print(f"  aggregations: {', '.join(aggregations.names())}")
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
    if args.name in advantage_estimators:
        import inspect

        print(f"{args.name} (advantage estimator)\n")
        print(inspect.cleandoc(advantage_estimators.get(args.name).__doc__ or ""))
        return 0
    presets.get(args.name)  # raises UnknownNameError listing the presets
    return 2


def _cmd_train(argv: Sequence[str]) -> int:
    from rlzoo.trainer import train

    config = parse_train_args(argv)
    history = train(config)
    evals = [r for r in history if r.get("eval/accuracy") is not None]
    if evals and os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for the run
        first, last = evals[0], evals[-1]
        print(f"held-out greedy accuracy: step {first['step']} {100 * first['eval/accuracy']:.1f}% -> "
              f"step {last['step']} {100 * last['eval/accuracy']:.1f}%")
    return 0


def _cmd_eval(argv: Sequence[str]) -> int:
    from rlzoo.trainer.evaluation import evaluate

    config = parse_train_args(argv, prog="rlzoo eval")
    result = evaluate(config)
    print(f"{config.model} on {config.task}: greedy accuracy {result}")
    for question, completion, score in result.samples:
        print(f"  [{score:.0f}] {question!r} -> {completion!r}")
    return 0


def _cmd_bench(argv: Sequence[str]) -> int:
    """``rlzoo bench [--output FILE] [--docs FILE] [--no-render] [PYTEST ARGS...]``: run ``benchmarks/`` with
    pytest-benchmark, save its JSON (default ``benchmarks/results/cuda.json`` on a GPU machine, else ``cpu.json``)
    and render it with ``benchmarks/render.py`` (default ``docs/benchmarks.md`` + ``.png``; every results file
    when FILE is under ``benchmarks/results/``, else FILE alone). The JSON goes to ``FILE.partial`` first and
    replaces FILE only when pytest succeeded; a failed run keeps the partial results and renders nothing.
    Needs a source checkout and the ``bench`` extra; returns pytest's exit status (2 for bad usage)."""
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
    parser.add_argument("--output", type=Path, help="results JSON (default benchmarks/results/{cpu,cuda}.json)")
    parser.add_argument("--docs", type=Path, default=root / "docs" / "benchmarks.md",
                        help="rendered page (its plot goes next to it as .png)")
    parser.add_argument("--no-render", action="store_true", help="save the JSON only")
    args, pytest_args = parser.parse_known_args(list(argv))
    if any(a.startswith("--benchmark-json") for a in pytest_args):
        raise ValueError("rlzoo bench: use --output FILE instead of --benchmark-json")
    results = bench / "results"
    if args.output is None:
        import torch

        args.output = results / ("cuda.json" if torch.cuda.is_available() else "cpu.json")
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
    docs = args.docs.resolve()
    files = [] if output.parent == results.resolve() else [str(output)]
    return subprocess.call([sys.executable, str(bench / "render.py"), *files, "--out", str(docs),
                            "--plot", str(docs.with_suffix(".png"))], cwd=root)


USER_ERRORS = (ValueError, KeyError, ImportError, OSError, FloatingPointError)
"""Exceptions the ``rlzoo`` command prints as one message instead of a traceback (``RLZOO_DEBUG=1``: raise).
Anything else (``RuntimeError`` from torch internals, ...) is a bug and keeps its traceback."""


def console_main() -> int:
    """The ``rlzoo`` console script: :func:`main`, with bad input reported as ``rlzoo: error: ...`` (exit 2)
    instead of a traceback. ``RLZOO_DEBUG=1`` shows the traceback. A run stopped by SIGINT / SIGTERM exits
    130 / 143 after its checkpoint; a second Ctrl-C exits 130 at once."""
    from rlzoo.trainer.interrupts import RunInterrupted

    try:
        return main()
    except RunInterrupted as stop:
        print(f"rlzoo: {stop}", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:
        print("rlzoo: interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as err:
        if os.environ.get("RLZOO_DEBUG"):
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"rlzoo: error: {message} (RLZOO_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlzoo`` command (raises on bad input; the console script is :func:`console_main`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    level = os.environ.get("RLZOO_LOG_LEVEL", "INFO" if os.environ.get("RANK", "0") == "0" else "WARNING")
    logging.basicConfig(level=level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "urllib3", "transformers", "accelerate"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if argv and argv[0] in ("train", "eval", "bench"):
        command, rest = argv[0], argv[1:]
        return {"train": _cmd_train, "eval": _cmd_eval, "bench": _cmd_bench}[command](rest)

    parser = argparse.ArgumentParser(prog="rlzoo", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="presets, advantage estimators and parts")
    explain = sub.add_parser("explain", help="a preset's card (formula, components, defaults, paper)")
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
