"""Config files (TOML, YAML or JSON with the field names of :class:`~rlzoo.trainer.TrainConfig`), and the type
checks of the values they (and the Python API) give."""

import json
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

__all__ = ["coerce", "load_config_file", "yaml_numbers"]

_YAML11_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader without YAML 1.1's ``_`` digit separator, so that verl's ``"lower_upper"`` bounds
    (``rollout_is_threshold: 0.5_5``) stay strings instead of becoming the number 0.55, and refusing a key given
    twice in one mapping (PyYAML keeps the last silently; TOML refuses it too)."""

    def compose_mapping_node(self, anchor: Any) -> Any:
        node = super().compose_mapping_node(anchor)
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:  # as written, before a merge key's `<<:` mappings are folded in
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if (key_node.tag, key_node.value) in seen:
                    raise yaml.composer.ComposerError(None, None, f"duplicate key {key_node.value!r}",
                                                      key_node.start_mark)
                seen.add((key_node.tag, key_node.value))
        return node


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?(0|[1-9][0-9]*|0x[0-9a-fA-F]+)$"),
                              list("-+0123456789"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def yaml_load(text: str) -> Any:
    """``yaml.safe_load`` of ``text`` with numbers read as YAML 1.2 writes them: no ``_`` separators (``0.5_5`` is
    the string verl's thresholds use), and ``1e-3`` a float (:func:`yaml_numbers`).

    Raises:
        yaml.YAMLError: on a syntax error.
    """
    return yaml_numbers(yaml.load(text, Loader=_Loader))


def yaml_numbers(value: Any) -> Any:
    """Read the numbers YAML 1.1 leaves as strings (``1e-3``, ``5E4``: exponent without a dot) as floats,
    recursively through mappings and lists; everything else is returned unchanged. Never raises.

    Source: YAML 1.2's core-schema float rule (PyYAML implements YAML 1.1, whose float needs a dot).
    """
    if isinstance(value, str) and _YAML11_FLOAT.match(value):
        return float(value)
    if isinstance(value, Mapping):
        return {k: yaml_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [yaml_numbers(v) for v in value]
    return value


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a TOML (.toml), YAML (.yaml/.yml) or JSON (.json) config file into a dict.

    A run's own ``config.json`` is accepted as well: what describes that run rather than its settings (the
    ``resolved_*`` entries, ``segments``, ``output_dir``, ``resume``, ``overwrite``) is dropped, so
    ``--config RUN/config.json`` starts a new run with that run's settings.

    Raises:
        ValueError: unknown extension, a syntax error (the message names the file, line and column), text that
            is not UTF-8, a file that is not a mapping, or one without settings (empty, or comments only).
        FileNotFoundError: missing file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[: err.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: config file is not UTF-8 text ({err.reason})") from None
    if path.suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{path}: TOML syntax error: {err}") from None
    elif path.suffix in (".yaml", ".yml"):
        try:
            data = yaml_load(text) or {}
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ValueError(f"{path}{where}: YAML syntax error: {problem}") from None
    elif path.suffix == ".json":
        try:
            data = json.loads(text, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{err.lineno}:{err.colno}: JSON syntax error: {err.msg}") from None
        except ValueError as err:  # a duplicate key
            raise ValueError(f"{path}: {err}") from None
    else:
        raise ValueError(f"config file must be .toml, .yaml/.yml or .json, got {path.name!r}")
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping of options, got {type(data).__name__}")
    if not data:  # an empty file (or comments only) would start the default run: surely not what was meant
        raise ValueError(f"config file {path} holds no settings; give options as 'name: value' (YAML), 'name = "
                         "value' (TOML) or a JSON object")
    if "segments" in data:  # a run's config.json: keep the settings only
        data = {k: v for k, v in data.items()
                if not k.startswith("resolved_") and k not in ("segments", "output_dir", "resume", "overwrite")}
    return data


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice (``json`` keeps the last silently)."""
    seen = [key for key, _ in pairs]
    twice = sorted({key for key in seen if seen.count(key) > 1})
    if twice:
        raise ValueError(f"duplicate key(s) {twice} in one JSON object")
    return dict(pairs)


def coerce(name: str, value: Any, hint: Any) -> Any:
    """``value`` checked against the field's annotation (config files and the Python API bypass the CLI's
    parser): ints and numeric strings become floats where a float is expected (YAML 1.1 reads ``1e-4`` as a
    string), lists become tuples.

    Raises:
        ValueError: the value does not fit, naming the field, the expected type and the valid choices.
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        return coerce(name, value, args[0])
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(name, value, arg)
            except ValueError as err:
                errors.append(err)
        raise errors[0]
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, args))}; got {value!r}")
        return value
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ValueError(f"{name} must be a number, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{name} must be true or false, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        if name == "report_to" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            return ",".join(value) or "none"  # TRL's list form (report_to: [tensorboard, trackio]; [] = none)
        hint_text = {"advantage": " (estimator options go in advantage_options / --advantage.NAME)",
                     "task": " (data set options go in task_kwargs / --task.NAME)"}.get(name, "")
        raise ValueError(f"{name} must be a string, got {value!r}{hint_text}")
    if origin is tuple:
        if isinstance(value, (str, int, float)):  # one value, as on the command line (reward_funcs = "accuracy")
            return (coerce(name, value, args[0]),)
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} must be a list, got {value!r}")
        return tuple(coerce(name, v, args[0]) for v in value)
    if origin in (Mapping, dict) or hint in (Mapping, dict):
        if not isinstance(value, Mapping):
            raise ValueError(f"{name} must be a mapping of options, got {value!r}")
        return value
    return value
