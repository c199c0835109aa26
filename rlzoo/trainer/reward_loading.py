"""Reward functions named on the command line: every spelling TRL 1.16 accepts, and rlzoo's own.

:func:`load_reward_function` resolves, in this order:

- TRL's registered names (``think_format_reward``, ``accuracy_reward``, ``reasoning_accuracy_reward``,
  ``get_soft_overlong_punishment``): the functions of ``trl.rewards`` (needs ``trl``), the last one built with
  the values TRL's script uses (``max_completion_len=1280``, ``soft_punish_cache=256``);
- ``module:function`` and ``path/to/file.py:function``;
- an existing directory: a reward model (``AutoModelForSequenceClassification``, :class:`RewardModel`);
- a dotted import path ``pkg.module.function`` (TRL's spelling, e.g. ``trl.rewards.think_format_reward``);
- a hub id ``org/name``: a reward model (downloaded when online; ``HF_HUB_OFFLINE`` as transformers honours it).

Source: trl/scripts/grpo.py (the registry and the dotted path) and ``GRPOTrainer.__init__`` (a string that is not
a function is a reward model id).
"""

import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any

import torch

from rlzoo.registry import WrongTypeError
from rlzoo.trainer.reward_functions import RewardFunctionError, factory_error

__all__ = ["TRL_REWARD_NAMES", "RewardModel", "load_reward_function", "recorded_module_reward"]

TRL_REWARD_NAMES = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward", "get_soft_overlong_punishment")
"""Names TRL's ``grpo`` script resolves to functions of ``trl.rewards`` without a module path."""

_TRL_FACTORY_ARGUMENTS = {"get_soft_overlong_punishment": {"max_completion_len": 1280, "soft_punish_cache": 256}}
"""TRL registry names that are factories, with the arguments TRL's script (trl/scripts/grpo.py) calls them with."""


def load_reward_function(spec: str, *, device: str | torch.device = "cpu") -> Any:
    """The reward function (or :class:`RewardModel`) ``spec`` names (see the module docstring).

    Args:
        spec: ``think_format_reward``, ``module:function``, ``file.py:function``, ``pkg.module.function``, a reward
            model directory or hub id.
        device: where a reward model runs.

    Raises:
        ValueError: ``spec`` fits none of the forms.
        ImportError: the module (or file) cannot be found or fails to import (its error is chained); a TRL name
            or ``trl.*`` path without ``trl`` (names the ``trl`` extra).
        RewardFunctionError: the module has no such attribute (the message lists its public callables), the
            attribute is not callable, or it is a factory of reward functions (says to call it first); a ``.py``
            file without ``:function`` (lists the file's public callables).
        OSError: a reward model that cannot be loaded (offline and not cached, not a checkpoint).
    """
    if spec in TRL_REWARD_NAMES:
        fn = _attribute(spec, "trl.rewards", spec)
        return fn(**_TRL_FACTORY_ARGUMENTS[spec]) if spec in _TRL_FACTORY_ARGUMENTS else fn
    module_name, sep, attr = spec.rpartition(":")
    if sep:
        if not module_name or not attr.isidentifier():
            raise ValueError(f"reward function {spec!r} must be 'module:function' (or 'file.py:function')")
        return _reward_attribute(spec, module_name, attr)
    if spec.endswith(".py"):  # not a hub id ("dir/file.py" looks like one): the function is missing
        listed = f"; {spec!r} does not exist"
        if Path(spec).is_file():
            module = _import_file(spec, Path(spec), spec)
            public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                            and getattr(v, "__module__", None) == module.__name__)  # its own, not what it imported
            listed = f"; its public callables: {', '.join(public) or '(none)'}"
        raise RewardFunctionError(f"reward function {spec!r} is a Python file: name the function in it, "
                                  f"'{spec}:FUNCTION'{listed}")
    if Path(spec).is_dir():
        return RewardModel(spec, device=device)
    if re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+", spec):
        module_name, _, attr = spec.rpartition(".")
        return _reward_attribute(spec, module_name, attr)
    if re.fullmatch(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+", spec):
        return RewardModel(spec, device=device)
    raise ValueError(f"reward function {spec!r} must be 'module:function', 'file.py:function', 'pkg.module.function', "
                     "a reward model (directory or hub id) or one of TRL's names: " + ", ".join(TRL_REWARD_NAMES))


def recorded_module_reward(spec: str) -> str:
    """``spec`` as a run's ``config.json`` records it, so that the config works from any directory: a module found
    in the working directory (or ``sys.path[0]``, the script's directory) as its absolute file
    (``myrewards.len_reward`` -> ``/abs/dir/myrewards.py:len_reward``; a module of a package there,
    ``pkg.mod:fn`` -> ``/abs/dir/pkg/mod.py:fn``, which :func:`load_reward_function` imports as ``pkg.mod``).

    Everything else is returned as given: installed modules (``trl.rewards.accuracy_reward``, ``pkg.module.fn``,
    an editable install in the working directory), other spellings, and modules that cannot be found (left for
    the loader to report). Nothing is imported (except the parents of a package module imported already).
    """
    if spec in TRL_REWARD_NAMES:
        return spec
    module_name, sep, attr = spec.rpartition(":")
    if not sep:
        if spec.endswith(".py") or Path(spec).is_dir() or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+", spec):
            return spec
        module_name, _, attr = spec.rpartition(".")
    if module_name.endswith(".py") or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", module_name):
        return spec
    path = _local_module_file(module_name)
    return f"{path}:{attr}" if path is not None else spec


def _local_dirs() -> list[Path]:
    """The directories a module "typed by the user" is imported from: the working directory, ``sys.path[0]``."""
    dirs = [Path.cwd().resolve()]
    if sys.path and sys.path[0]:
        dirs.append(Path(sys.path[0]).resolve())
    return dirs


def _local_module_file(module_name: str) -> Path | None:
    """The absolute source file of module ``module_name`` when its top-level module or package lies in one of
    :func:`_local_dirs` and is not installed (importable without them); else None."""
    local = _local_dirs()
    top = module_name.partition(".")[0]
    found = importlib.machinery.PathFinder.find_spec(top, [str(d) for d in local])
    if found is None:
        return None
    others = [p for p in sys.path if p and Path(p).resolve() not in local]
    if importlib.machinery.PathFinder.find_spec(top, others) is not None:
        return None
    for finder in sys.meta_path:  # an editable install's finder, built-in and frozen modules
        if finder is not importlib.machinery.PathFinder and hasattr(finder, "find_spec"):
            try:
                if finder.find_spec(top, None) is not None:
                    return None
            except (ImportError, TypeError, ValueError, AttributeError):  # a finder that cannot answer: installed
                return None
    loaded = sys.modules.get(top)
    if loaded is not None and (getattr(loaded, "__file__", None) is None
                               or Path(loaded.__file__).resolve() != Path(str(found.origin)).resolve()):
        return None  # imported already, from elsewhere
    parts = module_name.split(".")
    for i in range(1, len(parts)):
        if found is None or found.submodule_search_locations is None:
            return None
        found = importlib.machinery.PathFinder.find_spec(".".join(parts[:i + 1]),
                                                         list(found.submodule_search_locations))
    if found is None or not found.origin or not found.origin.endswith(".py"):
        return None
    return Path(found.origin).resolve()


def _import_file(spec: str, path: Path, shown: str) -> Any:
    """Import the Python file ``path`` of reward ``spec``: a file of a package (its directory has an
    ``__init__.py``) as that package's module, with the package's parent directory on ``sys.path`` (as a module
    of its own when that import gives another file); another file as a module of its own, with its directory on
    ``sys.path`` (appended), as when Python runs a script, so that it can import the modules beside it. A file
    imported already (under any name) is that module. ``shown``: the file as ``spec`` names it (for errors)."""
    path = path.resolve()
    for loaded in list(sys.modules.values()):  # imported already (by the script building the Trainer): that module,
        origin = getattr(loaded, "__file__", None)  # with its state, not a second copy
        if isinstance(origin, str) and os.path.basename(origin) == path.name and Path(origin).resolve() == path:
            return loaded
    parts = [] if path.stem == "__init__" else [path.stem]
    root = path.parent
    while (root / "__init__.py").is_file():
        parts.insert(0, root.name)
        root = root.parent
    if str(root) not in sys.path:
        sys.path.append(str(root))
    if len(parts) > 1 or path.stem == "__init__":
        dotted = ".".join(parts)
        try:
            module = importlib.import_module(dotted)
        except Exception:  # noqa: BLE001 - e.g. another package of that name: the file alone, below
            module = None
        origin = getattr(module, "__file__", None)
        if origin is not None and Path(origin).resolve() == path:
            return module
        # another package of that name comes first on sys.path, or the package fails to import: the file alone
    mod_spec = importlib.util.spec_from_file_location(f"rlzoo_reward_{path.stem}", path)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[mod_spec.name] = module
    try:
        mod_spec.loader.exec_module(module)
    except Exception as err:
        sys.modules.pop(mod_spec.name, None)
        raise ImportError(f"reward function {spec!r}: importing {shown!r} failed: {err!r}") from err
    return module


def _reward_attribute(spec: str, module_name: str, attr: str) -> Any:
    """:func:`_attribute`, refusing a factory (:func:`~rlzoo.trainer.reward_functions.factory_error`)."""
    fn = _attribute(spec, module_name, attr)
    error = factory_error(spec, fn)
    if error is not None:
        raise error
    return fn


def _attribute(spec: str, module_name: str, attr: str) -> Any:
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ImportError(f"reward function {spec!r}: file {module_name!r} does not exist")
        module = _import_file(spec, path, module_name)
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:  # TRL's script imports from the working dir
            sys.path.append(str(Path.cwd()))
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            hint = ': pip install "rlzoo[trl]"' if module_name.split(".")[0] == "trl" else ""
            raise ImportError(f"reward function {spec!r}: no module named {err.name!r}{hint}") from err
        except Exception as err:
            raise ImportError(f"reward function {spec!r}: importing {module_name!r} failed: {err!r}") from err
    if not hasattr(module, attr):
        package = Path(getattr(module, "__file__", None) or ".")
        if package.name == "__init__.py" and any(p.is_file() for p in (package.parent / f"{attr}.py",
                                                                      package.parent / attr / "__init__.py")):
            raise RewardFunctionError(f"reward function {spec!r}: {module.__name__}.{attr} is a module; name a "
                                      f"function in it ({module.__name__}.{attr}.FUNCTION)")
        names = getattr(module, "__all__", None) or dir(module)  # a lazy module (trl.rewards) has an empty vars()
        public = sorted(n for n in names if not n.startswith("_") and callable(getattr(module, n, None)))
        raise RewardFunctionError(f"reward function {spec!r}: module {module_name!r} has no attribute {attr!r}; "
                     f"its public callables: {', '.join(public) or '(none)'}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise RewardFunctionError(f"reward function {spec!r}: {attr!r} is a {type(fn).__name__}, not callable")
    return fn


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                    "spiece.model", "sentencepiece.bpe.model")
"""The files a tokenizer is loaded from (``AutoTokenizer.from_pretrained``): a reward model directory with none
of them has no tokenizer."""


def _offline(local: bool) -> str:
    """Why a hub id could not be loaded when offline (never said of a local directory)."""
    import huggingface_hub.constants

    return " (HF_HUB_OFFLINE is set and it is not cached)" if huggingface_hub.constants.HF_HUB_OFFLINE and not local else ""


def _one_line(err: Exception) -> str:
    """``err``'s message on one line (transformers' messages run over several; a long one is shortened)."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 400 else text[:397] + "..."


class RewardModel:
    """A sequence-classification model used as a reward function, as TRL 1.16 uses reward models.

    Each (prompt, completion) is one text: ``prompt + completion`` for standard-format data, the chat template of
    the prompt's messages followed by the completion's for conversational data; texts are right-padded without
    special tokens, and the reward is the first logit (``logits[:, 0]``).

    Args:
        model: a directory or a hub id (loaded with ``num_labels=1``), or a loaded sequence-classification model
            (a ``PreTrainedModel``, as TRL's ``reward_funcs`` takes one).
        tokenizer: the model's tokenizer (TRL's ``reward_processing_classes`` entry); None = loaded from the
            directory / hub id (for a model object, from its ``config._name_or_path``, as TRL does).
        device: where it runs (a model object is moved there).

    Attributes:
        model, tokenizer: the classifier (eval mode, no gradients) and its tokenizer (pad = EOS when unset).
        __name__: the model's name (the last component of its path or ``config._name_or_path``), as TRL names
            reward models.

    Raises:
        OSError: the model or its tokenizer cannot be loaded (names it; a hub id offline without a cached copy says
            so), or a directory has no tokenizer files (names the files looked for and how to give a tokenizer).
        ValueError: a checkpoint without the classification head (e.g. a causal LM's), which transformers would
            initialise at random (TRL 1.16 then rewards with that random head).
        WrongTypeError: (a ``TypeError`` and ``ValueError``) a model object that is not a ``PreTrainedModel``.

    Source: ``GRPOTrainer._calculate_rewards`` (the ``nn.Module`` branch) and ``GRPOTrainer.__init__``.
    """

    def __init__(self, model: Any, *, tokenizer: Any = None, device: str | torch.device = "cpu") -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel

        if isinstance(model, str):
            name = model
        elif isinstance(model, PreTrainedModel):
            name = str(model.config._name_or_path)
        else:
            raise WrongTypeError(f"a reward model must be a directory, a hub id or a PreTrainedModel, got "
                            f"{type(model).__name__}")
        local = Path(name).is_dir()
        give = (f"copy the tokenizer files of the model it was trained from into {name!r} "
                f"(tokenizer.save_pretrained({name!r})), or give the tokenizer from Python: Trainer(config, "
                f"reward_funcs=[RewardModel({'model' if not isinstance(model, str) else repr(name)}, tokenizer=tok)])")
        if isinstance(model, str) and local and not (Path(name) / "config.json").is_file():
            raise OSError(f"cannot load reward model {name!r}: the directory has no config.json (a reward model is a "
                          "sequence-classification checkpoint: config.json, weights and tokenizer files)")
        if tokenizer is None and local and not any((Path(name) / f).is_file() for f in _TOKENIZER_FILES):
            raise OSError(f"reward model {name!r} has no tokenizer files (looked for {', '.join(_TOKENIZER_FILES)}): "
                          f"{give}")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(name) if tokenizer is None else tokenizer
        except (OSError, ValueError) as err:
            how = give if local else ("pass its tokenizer as well: RewardModel(model, tokenizer=tok)"
                                      if not isinstance(model, str) else "")
            what = "the tokenizer of reward model" if local or not isinstance(model, str) else "reward model"
            raise OSError(f"cannot load {what} {name!r}{_offline(local)}: {_one_line(err)}"
                          + (f" ({how})" if how else "")) from err
        if isinstance(model, str):
            try:
                model, info = AutoModelForSequenceClassification.from_pretrained(name, num_labels=1,
                                                                                 output_loading_info=True)
            except (OSError, ValueError) as err:
                raise OSError(f"cannot load reward model {name!r}{_offline(local)}: {_one_line(err)}") from err
            except RuntimeError as err:  # a head of another size: transformers refuses num_labels=1
                raise RewardFunctionError(
                    f"reward model {name!r} cannot be loaded with one output (num_labels=1): its score head has "
                    "another size? a reward model gives one score per sequence, as TRL reads it (logits[:, 0] of a "
                    f"1-label AutoModelForSequenceClassification): {_one_line(err)}") from err
            if info["missing_keys"]:  # TRL scores with the random head transformers made; a silent wrong reward
                raise RewardFunctionError(
                    f"reward model {name!r} is not a sequence-classification checkpoint: "
                    f"{', '.join(sorted(info['missing_keys'])[:3])} would start at random (a causal LM's "
                    "checkpoint?); a reward model is one trained as AutoModelForSequenceClassification")
        self.model = model
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.to(device).eval().requires_grad_(False)
        self.__name__ = name.rstrip("/").split("/")[-1]

    def texts(self, prompts: list[Any], completions: list[Any]) -> list[str]:
        """The classifier's input text of each (prompt, completion)."""
        from rlzoo.trainer.tasks import is_conversational

        if is_conversational(prompts[0]):
            return [self.tokenizer.apply_chat_template(list(p) + list(c), tokenize=False)
                    for p, c in zip(prompts, completions, strict=True)]
        return [p + c for p, c in zip(prompts, completions, strict=True)]

    @torch.inference_mode()
    def __call__(self, prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
        inputs = self.tokenizer(self.texts(prompts, completions), return_tensors="pt", padding=True,
                                padding_side="right", add_special_tokens=False).to(self.model.device)
        return self.model(**inputs).logits[:, 0].float().tolist()
