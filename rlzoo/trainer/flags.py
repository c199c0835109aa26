"""The command-line flags of the trainer's configs (``rlzoo train``, ``rlzoo eval``) through tyro, each parse
error one line naming the flag.

tyro reports a rejected flag in a boxed multi-line panel. Its public settings only silence that
(``console_outputs=False`` prints nothing at all); its parse-error hook (``tyro._errors.on_parse_error``, which
tyro marks private and experimental) hands each error over as an event naming the argument, the value given and
the choices, before tyro prints anything. :func:`tyro_cli` raises :class:`CommandLineError` from that hook, worded
by :func:`flag_error`, and the ``rlzoo`` console script prints it as ``rlzoo: error: ...``. ``--help`` is tyro's.
Under a tyro without the hook, tyro's own panel is what the user sees.
"""

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Sequence
from typing import Any

__all__ = ["CommandLineError", "flag_error", "flag_name", "tyro_cli"]


class CommandLineError(ValueError):
    """A flag the parser rejected (unknown, a value of the wrong type, not one of the choices, out of range, no
    value); the message is one line naming the flag and what it takes."""


def tyro_cli(cls: type, *, args: Sequence[str], prog: str, description: str, default: Any = None,
             dotted: Sequence[str] = ()) -> Any:
    """``tyro.cli(cls, args=args, ...)`` (``default``: the values of flags not given) with its parse errors raised
    as :class:`CommandLineError`.

    Args:
        dotted: the prefixes of the dotted options the caller parses itself (``loss`` for ``--loss.NAME``), offered
            when an unknown flag is close to one.

    Raises:
        CommandLineError: one line (:func:`flag_error`, or :func:`_list_without_values` for a list-valued flag given
            no value, which tyro would take as an empty list).
        SystemExit: on ``--help`` (tyro prints the help).
    """
    import tyro

    _join_docstring_lines()
    empty = _list_without_values(cls, list(args))
    if empty is not None:
        raise CommandLineError(empty)
    options: dict[str, Any] = {"args": list(args), "prog": prog, "description": description}
    if default is not None:
        options["default"] = default
    try:
        from tyro import _errors
    except ImportError:  # pragma: no cover - a tyro without the hook: its own panel
        return tyro.cli(cls, **options)
    on_parse_error = getattr(_errors, "on_parse_error", None)
    if on_parse_error is None:  # pragma: no cover - the private module changed: tyro's own panel
        return tyro.cli(cls, **options)

    def hook(event: Any) -> None:
        try:
            message = flag_error(event, cls, list(args), prog=prog, dotted=dotted)
        except Exception:  # noqa: BLE001 -- an event shaped otherwise (another tyro): a generic line, not a crash
            message = f"invalid arguments; {prog} --help lists the options"
        raise CommandLineError(message)

    with on_parse_error(hook):
        return tyro.cli(cls, **options)


def _join_docstring_lines() -> None:
    """Make tyro join a field docstring's wrapped lines into one paragraph of help (blank lines and ``- `` items
    kept). tyro keeps a line break before a line that does not start with a letter, and it sees the continuation
    lines still indented (it dedents afterwards), so every wrapped field's help broke mid-sentence (``a .gguf`` /
    ``file, ...``). The patch is tyro's, for the process: rlzoo's command line is its only tyro user here."""
    import textwrap

    try:
        from tyro import _strings
    except ImportError:  # pragma: no cover - the private module moved: tyro's own wrapping
        return
    original = getattr(_strings, "remove_single_line_breaks", None)
    if original is None or getattr(original, "rlzoo_dedents", False):
        return

    def remove_single_line_breaks(helptext: str) -> str:
        first, _, rest = helptext.partition("\n")
        text = first + ("\n" + textwrap.dedent(rest) if rest else "")
        return original(re.sub(r"(?<!\n)\n(?![\n\-*] )(?!\n)", " ", text))  # keep paragraphs and "- " items

    remove_single_line_breaks.rlzoo_dedents = True  # type: ignore[attr-defined]
    _strings.remove_single_line_breaks = remove_single_line_breaks


def flag_name(arg: str) -> str:
    """``--max_steps=3`` -> ``--max-steps`` (the spelling of tyro's flags); other arguments as they are."""
    if not arg.startswith("--"):
        return arg
    return "--" + arg[2:].split("=", 1)[0].replace("_", "-")


def flag_error(event: Any, cls: type, args: list[str], *, prog: str, dotted: Sequence[str] = ()) -> str:
    """One line for one of tyro's parse-error events (``tyro._errors``) while parsing ``args`` into ``cls``: the
    flag, the value given and what the flag takes (its choices, its type, its range), or the flags an unknown one
    may have meant (TRL's spellings get rlzoo's). An event of a kind this does not know gets a generic line."""
    from rlzoo.trainer.spellings import spelling_hint

    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    switches = {"--" + n.replace("_", "-") for n, h in fields.items() if h is bool}
    known = [*("--" + n.replace("_", "-") for n, h in fields.items() if not _is_dotted(h)),
             *("--no-" + s[2:] for s in switches), *(f"--{prefix}.NAME" for prefix in dotted)]
    more = f"{prog} --help lists the options"
    kind = type(event).__name__
    argument = getattr(event, "argument", None)
    names = argument.lowered.name_or_flags if argument is not None else ()
    flag = names[0] if names else None
    if kind == "UnrecognizedArgs":
        tokens = list(event.tokens)
        flags = [t for t in tokens if t.startswith("-")]
        if flags:
            hint = spelling_hint(flags, flags=True, fields=fields)
            if hint:
                return f"unknown option: {hint}"
            close = difflib.get_close_matches(flag_name(flags[0]), known, n=3, cutoff=0.6)
            meant = f" (did you mean {' or '.join(close)}?)" if close else ""
            return f"unknown option {flags[0].split('=', 1)[0]}{meant}; {more}"
        token = tokens[0]
        where = args.index(token) if token in args else 0
        before = flag_name(args[where - 1]) if where else ""
        switch = "--" + before.removeprefix("--").removeprefix("no-")
        if before and switch in switches:
            return f"{before} is a switch and takes no value, got {token!r} (give {switch} or --no-{switch[2:]})"
        if where >= 2 and flag_name(args[where - 2]) == "--report-to":  # TRL's list syntax: --report_to a b
            return (f"unexpected argument {token!r} after --report-to {args[where - 1]}: trackers are given "
                    f"comma-separated (--report-to {args[where - 1]},{token})")
        return f"unexpected argument {token!r} (options are given as --NAME VALUE); {more}"
    if kind == "InvalidChoice":
        return f"{flag}: invalid choice {event.value!r}; valid choices: {', '.join(map(str, event.choices))}"
    if kind == "BadValue" and flag is not None:
        if getattr(event, "reason", None) == "too_few_values":
            return f"{flag} needs a value: {_takes(argument.field.type_stripped)}"
        return f"{flag} cannot be set on the command line; {more}"
    if kind == "InstantiationFailure" and flag is not None:  # tyro could not convert the value
        return f"{flag} takes {_takes(argument.field.type_stripped)}, got {_given(flag, args)}"
    if kind == "InstantiationFailure":  # the config's own check (a range): it names the field
        message = str(event.message).strip().splitlines()[0]
        field = re.match(r"^([a-z_][a-z0-9_]*) must ", message)
        if field and field.group(1) in fields:
            as_flag = "--" + field.group(1).replace("_", "-")
            if any(flag_name(a) == as_flag for a in args):  # given as a flag, not from a config file
                message = as_flag + message[len(field.group(1)):]
        return message
    return f"invalid arguments ({kind}); {more}"


def _list_without_values(cls: type, args: list[str]) -> str | None:
    """The error line for a list-valued flag of ``cls`` (``tuple[str, ...]``: ``--reward-funcs A B``) given with no
    value (at the end of ``args`` or followed by another ``--`` option), else None.

    tyro reads such a flag with argparse's ``nargs="*"``, so ``--reward-funcs`` alone parsed as an empty list and the
    run failed later with an error not naming the flag (``RewardSet needs at least one reward function``). No
    list-valued option of rlzoo takes an empty list. ``--help`` anywhere: None (tyro prints the help)."""
    if "-h" in args or "--help" in args:
        return None
    hints = typing.get_type_hints(cls)  # Annotated stripped
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if _is_dotted(hint) or not _is_list(hint):
            continue
        flag = "--" + field.name.replace("_", "-")
        for i, arg in enumerate(args):
            if "=" not in arg and flag_name(arg) == flag and (i + 1 == len(args) or args[i + 1].startswith("--")):
                return f"{flag} needs a value: {_takes(hint)}; give the values after it, separated by spaces"
    return None


def _is_list(hint: Any) -> bool:
    """Whether ``hint`` is a variable-length tuple (``tuple[X, ...]``), or one or None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_is_list(h) for h in typing.get_args(hint) if h is not type(None))
    inner = typing.get_args(hint)
    return typing.get_origin(hint) is tuple and len(inner) == 2 and inner[1] is Ellipsis


def _is_dotted(hint: Any) -> bool:
    """Whether a field's annotation is a mapping given by dotted flags (hidden from tyro)."""
    from rlzoo.trainer.section import DottedOptions, OptionalDottedOptions

    return hint in (DottedOptions, OptionalDottedOptions)


def _takes(hint: Any) -> str:
    """What a flag of type ``hint`` takes, in words (``an integer``, ``one of 'a', 'b'``, ``a string, or None``)."""
    origin, inner = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        parts = [_takes(h) for h in inner if h is not type(None)]
        return " or ".join(parts) + (", or None" if type(None) in inner else "")
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, inner))
    if origin is tuple:
        return f"a list ({_takes(inner[0])} each)"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(hint, str(hint))


def _given(flag: str, args: list[str]) -> str:
    """The value(s) ``flag`` was given in ``args`` (its last occurrence), quoted, for an error message."""
    for i in range(len(args) - 1, -1, -1):
        if flag_name(args[i]) == flag:
            if "=" in args[i]:
                return repr(args[i].split("=", 1)[1])
            values = []
            for value in args[i + 1:]:
                if value.startswith("--"):
                    break
                values.append(value)
            return " ".join(map(repr, values)) or "no value"
    return "an invalid value"
