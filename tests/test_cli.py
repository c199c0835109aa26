"""The ``rlzoo`` command: list, explain, train/eval argument parsing, a tiny end-to-end train and eval."""

import dataclasses
import json
import logging
import math
import re
from pathlib import Path

import pytest
import torch

import rlzoo
from rlzoo.cli import CommandLineError, console_main, lay_over, main, parse_train_args
from rlzoo.registry import UnknownNameError
from rlzoo.trainer import TrainConfig, Trainer


def test_list_shows_presets_estimators_and_parts(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in rlzoo.list_losses() + rlzoo.list_advantages():
        assert name in out
    assert "arXiv:2503.14476" in out and "seq-mean-token-sum-norm" in out and "k3+" in out


def test_list_summaries_are_whole_first_sentences(capsys):
    """rlzoo list took each estimator's first docstring line: "dr_grpo ... GRPO without the std (``grpo`` with",
    "reinforce_pp ... whitened over every counted token of the"."""
    assert main(["list"]) == 0
    lines = {line.split()[0]: line.split(None, 1)[1] for line in capsys.readouterr().out.splitlines()
             if line.startswith("  ") and not line.startswith("   ") and len(line.split()) > 1}
    assert lines["dr_grpo"] == ("Dr. GRPO's advantage ``A_i = r_i - mean(group)``: GRPO without the std (``grpo`` "
                                "with ``scale=\"none\"``).")
    assert lines["reinforce_pp"].endswith("whitened over every counted token of the batch.")
    for name in rlzoo.list_advantages():
        assert lines[name].endswith((".", "...")), lines[name]
    from rlzoo.cli import _summary

    assert _summary("One ``x = 1. 2``, e.g. a. Two.\n\nMore.") == "One ``x = 1. 2``, e.g. a."
    assert _summary("A first\n    sentence over lines. Then.") == "A first sentence over lines."
    long = _summary("word " * 40, limit=30)
    assert long == "word word word word word..." and len(long) <= 30


def test_explain_prints_the_card(capsys):
    assert main(["explain", "gspo"]) == 0
    out = capsys.readouterr().out
    assert "2507.18071" in out and "sequence()" in out and "epsilon_low=0.0003" in out


def test_explain_all_markdown_is_docs_algorithms(capsys):
    assert main(["explain", "--all", "--markdown"]) == 0
    assert capsys.readouterr().out == rlzoo.losses.algorithms_markdown()


def test_explain_one_markdown_is_its_section_of_docs_algorithms(capsys):
    """`rlzoo explain dapo --markdown` printed the plain card (the flag was read with --all only)."""
    assert main(["explain", "DAPO", "--markdown"]) == 0
    section = capsys.readouterr().out
    assert section.startswith("## dapo\n") and "- Defined in: `rlzoo/algorithms/dapo.py`." in section
    assert f"\n{section}" in rlzoo.losses.algorithms_markdown()
    for argv, says in ((["explain", "k3", "--markdown"], "'k3' is a KL estimator"),
                       (["explain", "dapo", "--markdown", "--loss.beta", "0.1"], "drop the --loss.NAME options")):
        with pytest.raises(ValueError, match=says):
            main(argv)


def test_explain_without_a_name_says_what_it_takes(capsys):
    """`rlzoo explain` said "give a preset name or --all", though it explains parts and advantage estimators too."""
    assert main(["explain"]) == 2
    err = capsys.readouterr().err
    assert "a preset, a part or an advantage estimator" in err and "--all" in err


def test_explain_unknown_name_lists_presets():
    with pytest.raises(UnknownNameError, match=r"^rlzoo explain: 'not-a-loss' is no preset, part, option value or "
                                               r"advantage estimator .*valid names: .*dapo"):
        main(["explain", "not-a-loss"])


@pytest.mark.parametrize(("name", "kind", "also"), [
    ("grpo", "advantage", "an advantage estimator"), ("dr_grpo", "advantage", "an advantage estimator"),
    ("gpg", "advantage", "an advantage estimator"), ("cispo", "part", "a surrogate part of PolicyLoss"),
    ("dppo_tv", "part", "a surrogate part of PolicyLoss"), ("m2po", "part", "a rejections part of PolicyLoss"),
])
def test_explain_reaches_every_meaning_of_a_name_and_names_the_others_on_stderr(name, kind, also, capsys):
    """A name that is a preset and an advantage estimator (grpo) or a surrogate part (cispo) showed only the preset,
    although rlzoo list says "rlzoo explain PART": --kind picks the meaning, and a line on stderr says how."""
    from rlzoo.losses import presets

    assert main(["explain", name]) == 0
    out, err = capsys.readouterr()
    card = presets.get(name).card()
    assert out == f"{card}\n"  # stdout is the card (rlzoo explain's contract); the other meanings go to stderr
    assert err == f"\n{name} is also {also}: rlzoo explain {name} --kind {kind}\n"
    assert main(["explain", name.upper(), "--kind", "preset"]) == 0
    assert capsys.readouterr().out == out
    assert main(["explain", name, "--kind", kind]) == 0
    other = capsys.readouterr().out
    assert other.startswith(f"{name} (advantage estimator)\n\n" if kind == "advantage" else f"{name} (") and (
        "PolicyLoss." in other.splitlines()[0] if kind == "part" else True)
    assert card not in other and "is also" not in other


def test_explain_of_one_meaning_is_unchanged_and_a_wrong_kind_says_what_the_name_is(capsys):
    from rlzoo.losses import presets

    assert main(["explain", "dapo"]) == 0
    assert capsys.readouterr().out == presets.get("dapo").card() + "\n"
    assert main(["explain", "ppo_clip"]) == 0 and "is also" not in capsys.readouterr().out
    assert main(["explain", "seq_mean_token_mean", "--kind", "part"]) == 0  # spelt with _ as registries take it
    assert capsys.readouterr().out.startswith("seq-mean-token-mean (Aggregation, PolicyLoss.aggregation; ")
    with pytest.raises(UnknownNameError, match=r"^rlzoo explain --kind advantage: 'cispo' is no advantage estimator "
                                               r"\(it is a loss preset and a surrogate part of PolicyLoss\); valid "
                                               r"names: dr_grpo, gae, "):
        main(["explain", "cispo", "--kind", "advantage"])
    with pytest.raises(UnknownNameError, match=r"^rlzoo explain --kind part: 'ppo_clp' is no part; did you mean "
                                               r"'ppo_clip'.*\?; valid names: "):
        main(["explain", "ppo_clp", "--kind", "part"])
    with pytest.raises(ValueError, match="go with one preset name"):
        main(["explain", "grpo", "--kind", "advantage", "--loss.beta", "0.1"])
    with pytest.raises(ValueError, match="go with a preset, and 'rloo' is an advantage estimator here"):
        main(["explain", "rloo", "--loss.beta", "0.1"])  # printed the estimator and ignored the option
    with pytest.raises(ValueError, match=r"^rlzoo explain --all shows every preset: give no NAME or --kind"):
        main(["explain", "--all", "--kind", "part"])


def test_explain_takes_the_option_values_rlzoo_list_shows_under_parts(capsys):
    """rlzoo list shows is_correction's modes and the KL estimators under "rlzoo explain PART"; explain refused
    them as unknown loss presets."""
    assert main(["explain", "sequence_mask"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sequence_mask (option is_correction of the is_correction part is; ") and "TRL" in out
    assert main(["explain", "low_var_kl+"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("low_var_kl+ (KL estimator: --loss.kl_estimator of the kl penalty") and "Schulman" in out


def test_a_dotted_option_takes_pythons_none_as_null():
    """``--loss.dual_clip None`` (Python's spelling, as TRL users type it) failed: "got str 'None'"."""
    assert parse_train_args(["--loss.dual_clip", "None", "--loss.beta", "null"]).loss == {"dual_clip": None,
                                                                                           "beta": None}


def test_a_lowercase_none_for_an_option_that_takes_none_says_how_to_spell_it():
    """``--loss.dual_clip none`` stays a string (``--advantage.scale none`` is a name), and the error said only
    "must be a number, got str 'none'": it says how to give no value."""
    from strategies import runtime_type_checker_off

    with runtime_type_checker_off(), pytest.raises(ValueError, match=r"^ppo_clip: dual_clip must be a number, got str "
                                                                     r"'none'; for no value pass None \(on the command "
                                                                     r"line: null or None\)$"):
        rlzoo.get_loss("ppo", dual_clip="none")
    with runtime_type_checker_off(), pytest.raises(ValueError, match=r"must be a number, got str 'none'$"):
        rlzoo.get_loss("ppo", epsilon_high="none")  # epsilon_high takes no None


def test_config_given_twice_says_it_takes_one_file(tmp_path):
    """A second --config was "unknown option --config"."""
    for argv in (["--config", "a.toml", "--config", "b.toml"], ["--config=a.toml", "--config=b.toml"]):
        with pytest.raises(CommandLineError, match=r"^--config is given once: one file"):
            parse_train_args(argv)


def test_a_dotted_option_given_two_values_says_how_to_give_a_list():
    """``--peft.target_modules q_proj v_proj`` (argparse's list habit) said "unexpected argument 'v_proj'" without
    saying that a dotted option takes one value and a list is comma-separated."""
    with pytest.raises(CommandLineError, match=r"^unexpected argument 'v_proj' after --peft.target_modules q_proj: a "
                       r"dotted option takes one value; a list is given comma-separated \(--peft.target_modules "
                       r"q_proj,v_proj\)$"):
        parse_train_args(["--peft.target_modules", "q_proj", "v_proj", "--max-steps", "2"])
    assert parse_train_args(["--peft.target_modules", "q_proj,v_proj"]).peft == {"target_modules": "q_proj,v_proj"}


def test_a_dotted_option_takes_a_negative_number():
    """A value that begins with ``--`` is the next flag; one with a single ``-`` (a negative number) is a value."""
    config = parse_train_args(["--loss.beta", "-0.1", "--advantage.scale=none", "--loss.dual_clip", "-1e-3",
                               "--max-steps", "1"])
    assert (config.loss, config.max_steps) == ({"beta": -0.1, "dual_clip": -0.001}, 1)


def test_train_flags_are_kebab_case_and_dotted_options_are_parsed():
    config = parse_train_args([
        "--algorithm", "dapo", "--max-steps", "7", "--num-generations", "4", "--num-iterations", "2",
        "--learning-rate", "1e-4", "--seed", "3", "--model", "tiny-random", "--output-dir", "/tmp/x",
        "--loss.epsilon_high", "0.3", "--loss.beta=0.01", "--loss.is-correction", "null",
        "--advantage", "grpo", "--advantage.scale", "none", "--task.max_terms", "3",
    ])
    assert (config.algorithm, config.max_steps, config.num_generations, config.num_iterations) == ("dapo", 7, 4, 2)
    assert config.learning_rate == 1e-4 and config.seed == 3 and config.output_dir == "/tmp/x"
    assert dict(config.loss) == {"epsilon_high": 0.3, "beta": 0.01, "is_correction": None}
    assert dict(config.advantage_options) == {"scale": "none"}
    assert dict(config.task_kwargs) == {"max_terms": 3}


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_config_file_then_flags(tmp_path, suffix):
    """Precedence: defaults < --config FILE < flags; dotted flags merge into the file's mappings."""
    path = tmp_path / f"run{suffix}"
    if suffix == ".toml":
        path.write_text('algorithm = "cispo"\nmax_steps = 5\n[loss]\nepsilon_high = 3.0\nbeta = 0.02\n')
    else:
        path.write_text("algorithm: cispo\nmax_steps: 5\nloss:\n  epsilon_high: 3.0\n  beta: 0.02\n")
    config = parse_train_args(["--config", str(path), "--max-steps", "9", "--loss.beta", "0.5"])
    assert config.algorithm == "cispo" and config.max_steps == 9
    assert dict(config.loss) == {"epsilon_high": 3.0, "beta": 0.5}


def test_peft_none_turns_a_config_files_lora_off(tmp_path):
    """A config file's LoRA options could be turned off only in a file (`peft: null`): --peft none was an unknown
    option and --peft.r null a type error. --peft none (or null) sets peft None; anything else, or with
    --peft.NAME options, is one line."""
    path = tmp_path / "lora.yaml"
    path.write_text("peft:\n  r: 4\n  lora_alpha: 8\n")
    assert parse_train_args(["--config", str(path)]).peft == {"r": 4, "lora_alpha": 8}
    for flags in (["--peft", "none"], ["--peft=null"], ["--peft", "None"]):
        assert parse_train_args(["--config", str(path), *flags]).peft is None
    with pytest.raises(CommandLineError, match=r"^--peft takes none \(no LoRA: train the whole model\), got 'yes'"):
        parse_train_args(["--peft", "yes"])
    with pytest.raises(CommandLineError, match=r"^--peft none turns LoRA off: give it or --peft.NAME options"):
        parse_train_args(["--peft", "none", "--peft.r", "4"])


def test_unknown_config_key_is_named(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("max_step = 3\n")
    with pytest.raises(ValueError, match="max_step"):
        parse_train_args(["--config", str(path)])
    # a dotted flag written as a key (YAML's `task.prompt_column: q`): where its option goes in a file
    path = tmp_path / "bad.yaml"
    for key, option, table in [("task.prompt_column", "prompt_column", "task_kwargs"), ("loss.beta", "beta", "loss"),
                               ("advantage.scale", "scale", "advantage_options"), ("peft.r", "r", "peft")]:
        path.write_text(f"{key}: 1\n")
        with pytest.raises(ValueError, match=rf"unknown config keys \['{re.escape(key)}'\] \({re.escape(key)} is a "
                                             rf"dotted flag's option: in a config file it is '{option}' in the table "
                                             rf"'{table}' \({table}: \{{{option}: \.\.\.\}}\)\)"):
            parse_train_args(["--config", str(path)])


def test_train_and_eval_end_to_end(tmp_path, capsys):
    """`rlzoo train` on the tiny model writes a run; `rlzoo eval` scores its checkpoint with an interval."""
    out_dir = tmp_path / "run"
    assert main(["train", "--model", "tiny-random", "--max-steps", "1", "--num-generations", "4",
                 "--per-device-train-batch-size", "8", "--max-completion-length", "4", "--eval-size", "4",
                 "--output-dir", str(out_dir), "--no-progress", "--loss.beta", "0"]) == 0
    assert "held-out greedy accuracy" in capsys.readouterr().out
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 1
    checkpoint = out_dir / "checkpoints" / "step-000001" / "model"
    assert main(["eval", "--model", str(checkpoint), "--eval-size", "4", "--max-completion-length", "4"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["n"] == 4
    assert "greedy accuracy" in captured.err and "95% CI" in captured.err and "n=4" in captured.err
    # the checkpoint directory stands for its model/, as for `rlzoo train --model` and `rlzoo export`
    assert main(["eval", "--model", str(checkpoint.parent), "--eval-size", "4", "--max-completion-length", "4"]) == 0
    from_checkpoint = json.loads(capsys.readouterr().out)
    assert from_checkpoint["checkpoint"] == str(checkpoint.parent)
    assert {k: v for k, v in from_checkpoint.items() if k not in ("model", "checkpoint")} == {
        k: v for k, v in result.items() if k not in ("model", "checkpoint")}


def test_exponent_numbers_are_numbers_in_flags_and_yaml(tmp_path):
    """YAML 1.1 reads ``1e-3`` as a string; flags and YAML files read it as the number it is."""
    path = tmp_path / "run.yaml"
    path.write_text("learning_rate: 1e-4\nloss:\n  beta: 2E-3\nsystem_prompt: hello\n")
    config = parse_train_args([f"--config={path}", "--loss.epsilon_high", "3e-1"])
    assert config.learning_rate == 1e-4 and config.system_prompt == "hello"
    assert dict(config.loss) == {"beta": 2e-3, "epsilon_high": 0.3}


def test_a_list_option_takes_one_value_in_a_config_file_as_on_the_command_line(tmp_path):
    """``reward_funcs = "format"`` was refused ("must be a list") though ``--reward-funcs format`` takes one value."""
    path = tmp_path / "run.toml"
    path.write_text('reward_funcs = "format"\nreward_weights = 2\n')
    config = parse_train_args(["--config", str(path)])
    assert config.reward_funcs == ("format",) and config.reward_weights == (2.0,)
    path.write_text('reward_weights = true\n')
    with pytest.raises(ValueError, match="reward_weights"):
        parse_train_args(["--config", str(path)])


def test_config_file_values_are_type_checked(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[advantage]\nscale = "none"\n')
    with pytest.raises(ValueError, match="advantage must be a string.*advantage_options"):
        parse_train_args(["--config", str(path)])
    path.write_text('dtype = "fp8"\n')
    with pytest.raises(ValueError, match="dtype must be one of 'auto', 'float32', 'bf16-mixed'"):
        parse_train_args(["--config", str(path)])


def test_a_bad_option_in_a_config_files_table_names_the_file(tmp_path):
    """A bad option inside the file's loss, advantage_options, peft or task_kwargs table failed when the trainer
    built the part, without naming the file (a top-level key's error names it); now the parse builds them from the
    file's options and says where. A dotted flag's option fails in the trainer, naming no file (also one whose
    message quotes a file's key, reviewer)."""
    from strategies import runtime_type_checker_off

    path = tmp_path / "run.yaml"
    for table, message in [("loss:\n  epsilon_lo: 0.2", "unknown option 'epsilon_lo' for loss 'grpo'"),
                           ("loss:\n  epsilon_low: abc", "ppo_clip: epsilon_low must be a number"),
                           ("advantage_options:\n  foo: 1", "advantage estimator 'grpo' has no option 'foo'"),
                           ("peft:\n  r: abc", "--peft.r takes int, got 'abc'"),
                           ("task_kwargs:\n  max_term: 3", r"unknown option\(s\) \['max_term'\] for reasoning-gym task")]:
        path.write_text("model: tiny-random\n" + table + "\n")
        with runtime_type_checker_off(), pytest.raises(ValueError, match=f"^{re.escape(str(path))}: {message}"):
            parse_train_args(["--config", str(path)])
    path.write_text("model: tiny-random\nloss:\n  epsilon_low: 0.1\npeft:\n  r: 4\n")
    for flags, message in [(["--loss.epsilon_high", "abc"], "ppo_clip: epsilon_high must be a number"),
                           (["--loss.epsilon_low", "abc"], "ppo_clip: epsilon_low must be a number"),  # overridden
                           (["--loss.epsilon_lo", "0.1"], "unknown option 'epsilon_lo' .*'epsilon_low'"),  # near a key
                           (["--peft.r", "abc"], "--peft.r takes int, got 'abc'")]:
        with runtime_type_checker_off(), pytest.raises(ValueError, match=f"^{message}"):  # at the parse or in the
            config = parse_train_args(["--config", str(path), *flags])  # trainer: never naming the file
            Trainer(dataclasses.replace(config, output_dir=str(tmp_path / "run")))
    assert parse_train_args(["--config", str(path)]).loss == {"epsilon_low": 0.1}
    with runtime_type_checker_off(), pytest.raises(ValueError, match="^grpo: scale must be one of"):  # another table's
        parse_train_args(["--config", str(path), "--advantage.scale", "bogus"])  # flag, beside the file's loss table
    path.write_text("task: chain_sum\ntask_kwargs:\n  min_terms: 5\n")  # valid only with the flag: accepted
    assert parse_train_args(["--config", str(path), "--task.max_terms", "6"]).task_kwargs == {"min_terms": 5,
                                                                                               "max_terms": 6}


def test_console_script_reports_bad_input_without_a_traceback(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["rlzoo", "train", "--algorithm", "not-a-loss", "--model", "tiny-random"])
    monkeypatch.delenv("RLZOO_DEBUG", raising=False)
    assert console_main() == 2
    err = capsys.readouterr().err
    assert err.startswith("rlzoo: error: ") and "not-a-loss" in err and "dapo" in err
    assert "Traceback" not in err


def test_the_vllm_backend_without_vllm_is_one_line(monkeypatch, capsys, tmp_path):
    """--backend vllm without vllm printed two tracebacks (ImportError, then RuntimeError, not a user error); a vllm
    that is installed but does not import (a CUDA / torch mismatch) is said to be so, with its own error."""
    import builtins

    real = builtins.__import__
    for error, says in ((ModuleNotFoundError("No module named 'vllm'", name="vllm"),
                         "--backend vllm needs vllm: pip install 'rlzoo[vllm]'"),
                        (ImportError("_C.so: undefined symbol"),
                         "--backend vllm: vllm is installed but does not import: _C.so: undefined symbol")):
        monkeypatch.setattr(builtins, "__import__", lambda name, *a, e=error, **k: (_ for _ in ()).throw(e)
                            if name == "vllm" else real(name, *a, **k))
        monkeypatch.setattr("sys.argv", ["rlzoo", "train", "--model", "tiny-random", "--backend", "vllm",
                                         "--max-steps", "1", "--eval-size", "0", "--output-dir", str(tmp_path / "run")])
        monkeypatch.delenv("RLZOO_DEBUG", raising=False)
        assert console_main() == 2
        err = capsys.readouterr().err
        assert err.startswith(f"rlzoo: error: {says}") and err.count("\n") == 1


def test_an_error_under_torchrun_names_its_rank(monkeypatch, capsys):
    """A rank-local error (a reward function raising on one rank) ends the job through torchrun, whose summary
    names the rank that failed first; rlzoo's own line names it too."""
    monkeypatch.setattr("sys.argv", ["rlzoo", "train", "--algorithm", "not-a-loss", "--model", "tiny-random"])
    monkeypatch.delenv("RLZOO_DEBUG", raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert console_main() == 2
    assert capsys.readouterr().err.startswith("rlzoo: error (rank 1): ")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert console_main() == 2
    assert capsys.readouterr().err.startswith("rlzoo: error: ")


_CLOSED = ("[/w/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:44188. This is "
           "typically caused by a remote worker crashing.")
_TIMED_OUT = ("[/w/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 15000ms for recv "
              "operation to complete")


@pytest.mark.parametrize(("said", "why"), [
    (_CLOSED, "another rank stopped (its own error is the 'rlzoo: error (rank N)' line above"),
    (_TIMED_OUT, "another rank did not reach it within --distributed-timeout"),
])
def test_a_collective_another_rank_left_is_one_line_on_the_surviving_rank(said, why, monkeypatch, capsys):
    """The rank that survived another's error (or waited past --distributed-timeout for a stuck one) printed ~40
    lines of gloo traceback (user trial): one line says where in rlzoo, why in rlzoo's terms and gloo's words;
    outside torchrun, or for another RuntimeError, the traceback stays (a bug)."""
    from rlzoo.trainer.distributed import Distributed
    from rlzoo.trainer.evaluation import held_out_rewards
    from rlzoo.trainer.rewards import RewardSet

    def lost(*args, **kwargs):
        raise RuntimeError(said)

    monkeypatch.setattr(Distributed, "_device", lambda self: torch.device("cpu"))
    monkeypatch.setattr(Distributed, "all_reduce", lost)  # torch.distributed's all-reduce, another rank gone
    monkeypatch.setattr("rlzoo.cli.main", lambda: held_out_rewards(RewardSet(["format"]), [], Distributed(world_size=2)))
    monkeypatch.delenv("RLZOO_DEBUG", raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert console_main() == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and why in err, err
    assert err.startswith("rlzoo: error (rank 0): a collective failed (reduce_floats) in rlzoo/trainer/evaluation.py:")
    assert "(held_out_rewards): " in err and said.split("] ", 1)[1].split(" [")[0] in err and "/w/third_party" not in err
    monkeypatch.setenv("RLZOO_DEBUG", "1")
    with pytest.raises(RuntimeError, match="gloo"):
        console_main()
    monkeypatch.delenv("RLZOO_DEBUG")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(RuntimeError, match="gloo"):
        console_main()
    monkeypatch.setenv("WORLD_SIZE", "2")
    own = ("shape mismatch", "[gloo/transport/tcp/device.cc:81] connectFullMesh failed", "NCCL: unhandled cuda error")
    for other in own:  # this rank's own failure (review): its traceback stays
        monkeypatch.setattr("rlzoo.cli.main", lambda e=other: (_ for _ in ()).throw(RuntimeError(e)))
        with pytest.raises(RuntimeError, match=re.escape(other)):
            console_main()


def test_max_completion_length_0_is_named_itself_not_overlong_buffer():
    """`--max-completion-length 0` said "overlong_buffer must be in [0, max_completion_length), got 0", a flag not
    given; overlong_buffer's range names the length it is below."""
    with pytest.raises(ValueError, match=r"^--max-completion-length must be >= 1, got 0$"):
        parse_train_args(["--max-completion-length", "0"])
    with pytest.raises(ValueError, match=re.escape("--overlong-buffer must be in [0, max_completion_length) = [0, 4), "
                                                   "got 4")):
        parse_train_args(["--max-completion-length", "4", "--overlong-buffer", "4"])


@pytest.mark.parametrize("flag", ["--max-prompt-length", "--num-threads"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_prompt_length_and_threads_are_positive(flag, value):
    """--max-prompt-length -3 cut the prompt's first 3 tokens and 0 meant no limit; --num-threads -2 ended in
    torch's traceback and 0 was ignored (docs trial)."""
    with pytest.raises(ValueError, match=rf"^{flag} must be >= 1, got {value}$"):
        parse_train_args([flag, value])


def test_bench_without_the_bench_extra_says_what_to_install(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pytest_benchmark" else real(name, *a))
    assert main(["bench"]) == 2
    err = capsys.readouterr().err
    assert "pytest-benchmark" in err and "[bench]" in err


def test_bench_saves_the_json_and_renders_the_docs(tmp_path, monkeypatch, capfd):
    """One fast CPU case end to end: pytest-benchmark JSON at --output (moved into place from .partial), rendered
    by benchmarks/render.py into --docs. The case has no plot, and render.py says it wrote the page alone (it
    said 'wrote X.md and X.png' with no X.png written)."""
    monkeypatch.setenv("RLZOO_BENCH_MEMORY", "0")
    monkeypatch.setenv("RLZOO_BENCH_THREADS", "1")
    out, docs = tmp_path / "results.json", tmp_path / "benchmarks.md"
    status = main(["bench", "--output", str(out), "--docs", str(docs), "-q", "-k", "loss_eager and grpo and cpu"])
    printed = capfd.readouterr().out
    assert status == 0, printed
    assert not docs.with_suffix(".png").exists()
    assert f"wrote {docs} (no plot" in printed and ".png" not in printed.split(f"wrote {docs}")[1]
    data = json.loads(out.read_text())
    assert [b["extra_info"]["impl"] for b in data["benchmarks"]] == ["loss_eager"]
    assert not (tmp_path / "results.json.partial").exists()
    page = docs.read_text()
    # render.py names a results file inside the checkout relative to it (as the committed docs name
    # benchmarks/results/cpu.json), so with a --basetemp inside the checkout the page has the relative path
    checkout, shown = Path(__file__).resolve().parents[1], out.resolve()
    shown = shown.relative_to(checkout) if shown.is_relative_to(checkout) else shown
    assert f"`{shown}`" in page and "## Results: CPU" in page and "#### PolicyLoss: eager vs torch.compile" in page


@pytest.mark.parametrize("selection", [["-k", "dapo"], ["-kdapo"], ["-vk", "dapo"], ["-m", "slow"], ["--lf"],
                                       ["--sw-skip"], ["--deselect=benchmarks/x.py::y"]])
def test_bench_refuses_a_subset_over_the_committed_results(selection, monkeypatch):
    """`rlzoo bench -k dapo` replaced the committed full benchmarks/results/cpu.json with one case: a selection
    needs --output (refused before pytest starts)."""
    import subprocess

    monkeypatch.setattr(subprocess, "call", lambda *a, **k: pytest.fail("pytest started"))
    with pytest.raises(ValueError, match=r"a subset of the suite would replace the committed full results.*--output"):
        main(["bench", *selection])


_RESULTS = str(Path(__file__).resolve().parents[1] / "benchmarks" / "results")


@pytest.mark.parametrize("args, needs", [
    (["--output", "/tmp/x.json", "-k", "loss_eager and cpu"], "--docs FILE for this run's page, or --no-render"),
    (["--output", "/tmp/x.json"], "--docs FILE for this run's page, or --no-render"),
    (["--output", f"{_RESULTS}/cpu.json", "--docs", "/tmp/x.md", "-k", "dapo"], "outside benchmarks/results/"),
    (["--output", f"{_RESULTS}/subset.json", "--no-render", "-k", "dapo"], "outside benchmarks/results/"),
])
def test_bench_never_renders_other_results_over_the_committed_page(args, needs, monkeypatch):
    """`rlzoo bench -k "loss_eager and cpu" --output /tmp/x.json` rendered a 2-case docs/benchmarks.md over the
    committed page: the committed page (the default --docs) is rendered from benchmarks/results/ only, and a subset
    never writes there (refused before pytest starts)."""
    import subprocess

    monkeypatch.setattr(subprocess, "call", lambda *a, **k: pytest.fail("pytest started"))
    with pytest.raises(ValueError, match=re.escape(needs)):
        main(["bench", *args])


def test_bench_arguments_that_select_nothing_are_not_refused():
    """A file or node id (benchmarks/ is collected as well), option values with '/' and plain flags select nothing."""
    from rlzoo.cli import _selects_a_subset

    for args in (["benchmarks/test_bench_losses.py"], ["--basetemp", "/tmp/x"], ["-o", "cache_dir=/x"], ["-q", "-x"],
                 ["--benchmark-min-rounds", "5"], ["-v"]):
        assert not _selects_a_subset(args), args


def test_bench_failed_run_keeps_previous_results_and_partial_ones(tmp_path, monkeypatch, capsys):
    """pytest failing half-way (simulated: it wrote its JSON, then exited 1) leaves --output as it was, keeps the
    partial JSON beside it and renders nothing."""
    import subprocess

    out = tmp_path / "results.json"
    out.write_text("previous")
    commands = []

    def fake_pytest(command, **kwargs):
        commands.append(command)
        partial = next(a.split("=", 1)[1] for a in command if a.startswith("--benchmark-json="))
        Path(partial).write_text('{"benchmarks": [{"name": "x"}]}')
        return 1

    monkeypatch.setattr(subprocess, "call", fake_pytest)
    assert main(["bench", "--output", str(out), "--no-render", "-k", "fused"]) == 1
    assert len(commands) == 1 and commands[0][-2:] == ["-k", "fused"]  # pytest ran; render did not
    assert out.read_text() == "previous" and (tmp_path / "results.json.partial").exists()
    assert "unchanged" in capsys.readouterr().err


def test_version_and_case_insensitive_presets_with_did_you_mean(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"rlzoo {rlzoo.__version__}"
    assert main(["explain", "DAPO"]) == 0 and "2503.14476" in capsys.readouterr().out
    assert rlzoo.get_loss("Dr-GRPO").name == "dr_grpo"
    with pytest.raises(UnknownNameError, match="did you mean 'dapo'"):
        rlzoo.get_loss("dapoo")


@pytest.mark.parametrize(("flag", "pointer"), [("--loss_type", "--algorithm"), ("--beta", "--loss.beta"),
                                               ("--lr", "--learning-rate"), ("--model_name_or_path", "--model"),
                                               ("--generation_batch_size", "--steps-per-generation N"),
                                               ("--warmup_ratio", "--warmup-steps N"),
                                               ("--num_train_epochs", "--max-steps N"),
                                               ("--lr_scheduler_type", "--lr-scheduler"),
                                               ("--per_device_eval_batch_size", "--eval-batch-size"),
                                               ("--dataset_test_split", "--task.eval_split"),
                                               ("--logging_steps", None), ("--sync_ref_model", None)])
def test_trl_spellings_point_to_rlzoos(flag, pointer, tmp_path):
    said = f"TRL's {flag} is {pointer}" if pointer else f"TRL's {flag} has no counterpart in rlzoo \\("
    with pytest.raises(ValueError, match=said):
        parse_train_args([flag, "x"])
    path = tmp_path / "trl.yaml"
    path.write_text(f"{flag.lstrip('-')}: 1\n")
    with pytest.raises(ValueError, match=f"TRL's {flag.lstrip('-')} (is|has no counterpart)"):
        parse_train_args(["--config", str(path)])


@pytest.mark.parametrize(("flag", "hint", "key"), [
    ("--epsilon_high", "--epsilon_high is a loss option: --loss.epsilon_high", "loss.epsilon_high"),
    ("--use_bias_correction_kl", "is a loss option: --loss.use_bias_correction_kl", "loss.use_bias_correction_kl"),
    ("--off_policy_mask_threshold", "is a loss option: --loss.off_policy_mask_threshold", None),
    ("--kl_estimator", "--kl_estimator is a loss option: --loss.kl_estimator", "loss.kl_estimator"),
    ("--mean_level", "--mean_level is an advantage option: --advantage.mean_level", "advantage_options.mean_level"),
    ("--sapo_temperature_pos", "TRL's --sapo_temperature_pos is --loss.tau_pos in rlzoo", "loss.tau_pos"),
    ("--vllm_importance_sampling_clip_max", "TRL's --vllm_importance_sampling_clip_max is --loss.is_max", None),
])
def test_a_loss_or_advantage_option_given_as_a_plain_flag_points_to_its_section(flag, hint, key, tmp_path):
    """Every loss field of TRL's GRPOConfig and every rlzoo loss / advantage option, not a hand-kept few:
    --epsilon_high (the README's DAPO option) was a bare "unknown option", --sapo_temperature_pos a did-you-mean of
    the sampling --temperature."""
    with pytest.raises(ValueError, match=re.escape(hint)):
        parse_train_args([flag, "1"])
    if key is not None:
        path = tmp_path / "c.yaml"
        path.write_text(f"{flag.lstrip('-')}: 1\n")
        with pytest.raises(ValueError, match=f"unknown config keys .*{re.escape(key)}"):
            parse_train_args(["--config", str(path)])


def test_a_runs_config_json_starts_a_new_run_and_eval_run_writes_json(tmp_path, capsys):
    """`rlzoo train --config RUN/config.json` reuses the run's settings (not its directory or bookkeeping);
    `rlzoo eval --run RUN` evaluates its checkpoint with its task and extraction and writes JSON."""
    run = tmp_path / "run"
    assert main(["train", "--model", "tiny-random", "--max-steps", "1", "--num-generations", "4",
                 "--per-device-train-batch-size", "8", "--max-completion-length", "4", "--eval-size", "3",
                 "--answer-extraction", "first_number", "--task.max_terms", "3", "--output-dir", str(run),
                 "--no-progress"]) == 0
    capsys.readouterr()
    config = parse_train_args(["--config", str(run / "config.json"), "--max-steps", "2"])
    assert (config.max_steps, config.answer_extraction, dict(config.task_kwargs), config.output_dir) == (
        2, "first_number", {"max_terms": 3}, None)
    out_file = tmp_path / "eval.json"
    assert main(["eval", "--run", str(run), "--max-completion-length", "4", "--output", str(out_file)]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result == json.loads(out_file.read_text())
    assert result["checkpoint"].endswith("step-000001") and result["answer_extraction"] == "first_number"
    assert result["task_kwargs"] == {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1} and result["n"] == 3 and 0 <= result["accuracy"] <= 1
    assert result["reward"] == result["reward_metrics"]["rewards/accuracy/mean"] == pytest.approx(result["accuracy"])
    assert "greedy accuracy" in captured.err and f"reward {result['reward']:.3f}" in captured.err
    with pytest.raises(CommandLineError, match="^unknown option --learning-rate"):  # only evaluation flags
        main(["eval", "--run", str(run), "--learning-rate", "1e-3"])
    # `rlzoo eval --config FILE`: the file's evaluation settings (a run's config.json: its model, task, options and
    # extraction), under the flags; its training settings are checked as rlzoo train checks them, not used
    assert main(["eval", "--config", str(run / "config.json"), "--eval-size", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["model"], result["checkpoint"], result["answer_extraction"], result["n"]) == (
        "tiny-random", None, "first_number", 2)
    assert result["task_kwargs"]["max_terms"] == 3
    settings = tmp_path / "eval.yaml"
    settings.write_text("model: tiny-random\neval_size: 2\nmax_completion_length: 4\nlearning_rate: 0.5\n"
                        "output: " + str(tmp_path / "from-file.json") + "\n")
    assert main(["eval", "--config", str(settings), "--task.max_terms", "3"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((tmp_path / "from-file.json").read_text())
    # with --run, the file's model (a train config's, the run's base) is not what is evaluated: the checkpoint is
    assert main(["eval", "--config", str(run / "config.json"), "--run", str(run), "--eval-size", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["checkpoint"].endswith("step-000001") and result["model"] == result["checkpoint"] + "/model"
    # a run's config.json whose rewards included Python callables records their weights after the named ones':
    # left out with a warning, as --run does (it failed: "reward_weights has 2 entries but there are 1")
    from rlzoo.trainer.eval_run import eval_args_from_file

    args = eval_args_from_file({"reward_funcs": ["accuracy"], "reward_weights": [1.0, 0.5]}, source="run.json",
                               python_rewards=True)
    assert (args.reward_funcs, args.reward_weights) == (("accuracy",), (1.0,))
    mistake = eval_args_from_file({"reward_funcs": ["accuracy"], "reward_weights": [1.0, 0.5]}, source="eval.yaml")
    assert mistake.reward_weights == (1.0, 0.5)  # another file's extra weight is its mistake: the rewards refuse it
    # rlzoo train's dotted options are refused (they were dropped silently)
    for flag in ("--peft.r", "--loss.beta", "--advantage.scale"):
        with pytest.raises(CommandLineError, match=f"^rlzoo eval takes --task.NAME options only; {re.escape(flag)} is "
                                                   "rlzoo train's$"):
            main(["eval", "--model", "tiny-random", flag, "1"])
    for text, message in [("eval_sise: 2\n", "unknown config keys \\['eval_sise'\\].*did you mean 'eval_size'"),
                          ("eval_size: many\n", "eval_size must be an integer"),
                          ("output: 3\n", "output must be a path")]:
        settings.write_text("model: tiny-random\n" + text)
        with pytest.raises(ValueError, match=f"^{re.escape(str(settings))}: {message}"):
            main(["eval", "--config", str(settings)])


def test_another_task_leaves_the_runs_task_options_and_eval_size_0_names_the_run(tmp_path, monkeypatch, capsys,
                                                                                   caplog):
    """`rlzoo eval --run RUN --task other.jsonl` (and `rlzoo train --config RUN/config.json --task other.jsonl`)
    applied the run's chain_sum options to the data set: "unknown option(s) ['max_terms'] for data set task". They
    are dropped now, with an INFO line naming them; --task.NAME flags still apply, laid over the run's options
    (eval replaced them: a run trained with --task.prompt_column question evaluated with --task.split failed for
    want of a 'prompt' column), and the same task, a path as typed or absolute, keeps them. A run
    trained with --eval-size 0 said "eval_size must be >= 1 to evaluate, got 0": the message names the run's
    setting and --eval-size N, and for a data set trained on in full, that its rows were trained on."""
    from rlzoo.trainer.eval_run import EvalArgs, eval_config

    monkeypatch.chdir(tmp_path)
    Path("std.jsonl").write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                                         for i in range(30)))
    run = tmp_path / "run"
    assert main(["train", "--model", "tiny-random", "--max-steps", "1", "--num-generations", "2",
                 "--per-device-train-batch-size", "4", "--max-completion-length", "4", "--eval-size", "0",
                 "--task", "chain_sum", "--task.max_terms", "3", "--output-dir", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    with pytest.raises(ValueError, match=rf"^--run {re.escape(str(run))} was trained with eval_size 0 \(its "
                                         r"config.json\): .* pass --eval-size N to evaluate N problems$"):
        main(["eval", "--run", str(run)])
    with caplog.at_level("INFO", logger="rlzoo.train"):
        assert main(["eval", "--run", str(run), "--task", "std.jsonl", "--eval-size", "2",
                     "--max-completion-length", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["task_kwargs"] == {}
    assert re.search(r"task options \{'max_terms': 3\} dropped: they are those of its task 'chain_sum', not of "
                     r"--task std.jsonl", caplog.text)

    def task_options(**given):
        return eval_config(EvalArgs(run=str(run), eval_size=2, **given))[0].task_kwargs

    assert task_options(task="std.jsonl", task_kwargs={"prompt_column": "prompt"}) == {"prompt_column": "prompt"}
    assert task_options(task="chain_sum") == {"max_terms": 3}
    assert task_options(task_kwargs={"min_terms": 3}) == {"max_terms": 3, "min_terms": 3}  # as train --config

    config = str(run / "config.json")
    assert parse_train_args(["--config", config, "--task", "std.jsonl"]).task_kwargs is None
    assert parse_train_args(["--config", config, "--task=std.jsonl", "--task.prompt_column", "prompt"]
                            ).task_kwargs == {"prompt_column": "prompt"}
    assert parse_train_args(["--config", config, "--task", "chain_sum", "--task.min_terms", "2"]
                            ).task_kwargs == {"max_terms": 3, "min_terms": 2}  # as before: laid over the file's
    data = Path("data.yaml")
    data.write_text("task: std.jsonl\ntask_kwargs: {prompt_column: prompt}\n")
    for task in ("std.jsonl", str(tmp_path / "std.jsonl")):
        assert parse_train_args(["--config", str(data), "--task", task]).task_kwargs == {"prompt_column": "prompt"}

    trained = tmp_path / "data_run"  # a data set's rows were all trained on (only its config.json is read)
    trained.mkdir()
    (trained / "config.json").write_text(json.dumps({"task": str(tmp_path / "std.jsonl"), "eval_size": 0,
                                                     "segments": []}))
    with pytest.raises(ValueError, match=r"pass --eval-size N to evaluate N problems \(of '.*std.jsonl', a data set "
                                         r"the run trained on in full, those are rows it trained on\)$"):
        eval_config(EvalArgs(run=str(trained)))


def test_eval_output_is_refused_where_it_would_break_a_run(tmp_path):
    """`rlzoo eval --output RUN/config.json` replaced the run's config with its result (the run could no longer be
    resumed or evaluated by name), and `--output DIR` failed after the whole evaluation with a temporary file's name.
    Both are refused before anything loads; a file beside the run's own is taken."""
    from rlzoo.trainer.eval_run import _check_output

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"task": "chain_sum", "segments": []}))
    (run / "metrics.jsonl").write_text("")
    for output, says in [(run / "config.json", "is the config.json of the training run"),
                         (run / "checkpoints" / "x.json", "is inside the checkpoints of the training run"),
                         (run, "is a directory; name a file")]:
        with pytest.raises(ValueError, match=f"^--output {re.escape(repr(str(output)))} {says}"):
            main(["eval", "--run", str(run), "--output", str(output)])
    assert json.loads((run / "config.json").read_text())["task"] == "chain_sum"
    _check_output(run / "eval.json")  # beside them: fine
    results = tmp_path / "results"  # a directory of the user's whose metrics.jsonl an earlier eval wrote: no run
    results.mkdir()
    (results / "metrics.jsonl").write_text(json.dumps({"model": "m", "eval_size": 2, "accuracy": 0.5}))
    _check_output(results / "metrics.jsonl")
    (tmp_path / "link.json").symlink_to(run / "config.json")  # the write replaces the link, not the run's file
    _check_output(tmp_path / "link.json")
    # user trial: any other existing file was replaced silently, the task's data or the model's weights included;
    # an earlier result of rlzoo eval is replaced, an empty file taken
    (tmp_path / "data.jsonl").write_text('{"prompt": "1 + 1 =", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"^--output '.*data.jsonl' exists and is not a result of rlzoo eval"):
        main(["eval", "--model", "tiny-random", "--eval-size", "1", "--output", str(tmp_path / "data.jsonl")])
    assert (tmp_path / "data.jsonl").read_text().startswith('{"prompt"')
    (tmp_path / "empty.json").write_text("")
    for output in ("empty.json", "empty.json"):  # the second time: its own earlier result
        assert main(["eval", "--model", "tiny-random", "--eval-size", "1", "--output", str(tmp_path / output)]) == 0
    assert json.loads((tmp_path / "empty.json").read_text())["eval_size"] == 1


def test_tasks_lists_tasks_and_options(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert "chain_sum" in out and "--task.answer_column" in out and "max_terms" in out
    assert main(["tasks", "chain_sum"]) == 0
    assert "--task.max_terms 2" in capsys.readouterr().out  # the built-in job's, not reasoning-gym's 6


def test_tasks_of_a_data_set_file_lists_the_data_set_options(tmp_path, capsys):
    """`rlzoo tasks data.jsonl` said "unknown reasoning-gym task" for a file that exists."""
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "1 + 1 =", "answer": "2"}\n')
    assert main(["tasks", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{path} (data set): --task {path}\n") and "--task.answer_column" in out
    assert main(["tasks", "openai/gsm8k"]) == 0  # a hub id (not looked up)
    assert capsys.readouterr().out.startswith("openai/gsm8k (data set): --task openai/gsm8k\n")


def test_tasks_unknown_name_has_a_did_you_mean_and_the_names():
    """`rlzoo tasks chain_su` said only "rlzoo tasks lists them", where `--algorithm dapoo` has a did-you-mean."""
    with pytest.raises(UnknownNameError, match=r"unknown reasoning-gym task 'chain_su'; did you mean 'chain_sum'.*"
                                               r"valid names: .*basic_arithmetic, .*chain_sum"):
        main(["tasks", "chain_su"])
    with pytest.raises(UnknownNameError, match=r"split is an option of data set tasks: --task\.split"):
        main(["tasks", "split"])


def test_help_is_plain_text(capsys, monkeypatch):
    """No reST markup; a field docstring wrapped over lines reads as one paragraph (tyro kept each indented
    continuation line's break: "a .gguf" / "file, 'smollm2-135m'")."""
    monkeypatch.setenv("COLUMNS", "400")  # wide: any line break left is the docstring's
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    assert "``" not in text and ":class:" not in text and "`" not in text
    assert "a .gguf file, 'smollm2-135m' or 'tiny-random'" in text
    assert "mse or k2, low_var_kl or k3 (both clamped" in text
    assert "'pkg.module.function', 'module:function'" in text  # a continuation line starting with a quote
    assert "--peft none turns a config file's LoRA off" in text


def test_inf_and_nan_flag_values_are_floats_as_python_reads_them(capsys):
    """--loss.epsilon_high inf (M2PO's unclipped side, as TRL users type Python's float) said "must be a number, got
    str 'inf'" (YAML spells it .inf); nan said the same instead of refusing NaN as NaN."""
    from rlzoo.cli import _scalar

    assert [_scalar(t, numeric=True) for t in ("inf", "-inf", "+Infinity", "INF", ".inf")] == [
        math.inf, -math.inf, math.inf, math.inf, math.inf]
    assert math.isnan(_scalar("nan", numeric=True)) and _scalar("information", numeric=True) == "information"
    assert _scalar("nan") == "nan" and _scalar("inf") == "inf"  # --task.split nan: a name, as written
    assert parse_train_args(["--task.name", "inf", "--loss.epsilon_high", "inf"]).task_kwargs == {"name": "inf"}
    assert main(["explain", "dapo", "--loss.epsilon_high", "inf"]) == 0
    assert "epsilon_high=inf" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"^ppo_clip: epsilon_high must be a number, got NaN$"):
        main(["explain", "dapo", "--loss.epsilon_high", "nan"])


def test_verl_threshold_strings_stay_strings_on_the_command_line_and_in_yaml(tmp_path):
    """YAML 1.1 reads ``_`` as a digit separator (``0.5_5`` -> 0.55); verl's "lower_upper" rollout-correction bounds
    must reach the loss as written, from a flag and from a YAML config file, while numbers stay numbers."""
    from rlzoo.cli import _scalar
    from rlzoo.trainer.config_files import load_config_file

    assert _scalar("0.5_5") == "0.5_5" and _scalar("1_5") == "1_5" and _scalar("0.5_2.0") == "0.5_2.0"
    assert _scalar("0.28") == 0.28 and _scalar("1e-3") == 0.001 and _scalar("3") == 3 and _scalar("true") is True
    path = tmp_path / "run.yaml"
    path.write_text("loss:\n  rollout_is_threshold: 0.5_5\n  rollout_rs_threshold: 1_5\n  epsilon_high: 0.28\n")
    assert load_config_file(path)["loss"] == {"rollout_is_threshold": "0.5_5", "rollout_rs_threshold": "1_5",
                                               "epsilon_high": 0.28}


def test_yaml_merge_keys_work_and_only_a_key_written_twice_is_refused(tmp_path):
    """The duplicate-key check (a key written twice was kept silently, the last one) refused YAML merge keys
    (``<<:``, "could not determine a constructor", helper trial): a key of the mapping itself overrides a merged one,
    as YAML says; one written twice in the same mapping, at any depth, is the error."""
    from rlzoo.trainer.config_files import load_config_file

    path = tmp_path / "run.yaml"
    path.write_text("base: &base {epsilon_high: 0.3, beta: 0.0}\nloss:\n  <<: *base\n  epsilon_high: 0.28\n")
    assert load_config_file(path)["loss"] == {"epsilon_high": 0.28, "beta": 0.0}
    path.write_text("base: &base {epsilon_high: 0.3, beta: 0.0}\npresets: {mine: &mine {<<: *base, epsilon_high: "
                    "0.28}}\nloss: {<<: *mine}\n")  # a merged mapping that itself merges (reviewer)
    assert load_config_file(path)["loss"] == {"epsilon_high": 0.28, "beta": 0.0}
    for text, line in (("max_steps: 1\n'max_steps': 2\n", 2), ("loss:\n  beta: 1\n  beta: 2\n", 3),
                       ("loss:\n  1: a\n  1: b\n", 3)):
        path.write_text(text)
        with pytest.raises(ValueError, match=rf"run\.yaml:{line}:\d+: YAML syntax error: duplicate key"):
            load_config_file(path)


@pytest.mark.parametrize("name, text", [("run.yaml", ""), ("run.yaml", "# nothing yet\n"), ("run.toml", "\n"),
                                        ("run.json", "{}")])
def test_a_config_file_without_settings_is_refused(tmp_path, name, text):
    """An empty config file ran the default job (the SmolLM2 main job: a model conversion, minutes of training)
    with no word; a file that sets nothing is refused naming it."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"^config file {re.escape(str(path))} holds no settings; give options as"):
        parse_train_args(["--config", str(path)])


def test_num_generations_0_is_a_range_error_not_a_division_by_zero(tmp_path, monkeypatch, capsys):
    """It used to be a ZeroDivisionError traceback (the batch-divisibility check divided by it)."""
    with pytest.raises(ValueError, match="^num_generations must be >= 2, got 0$"):
        TrainConfig(num_generations=0)
    path = tmp_path / "run.yaml"
    path.write_text("num_generations: 0\n")
    monkeypatch.delenv("RLZOO_DEBUG", raising=False)
    monkeypatch.setattr("sys.argv", ["rlzoo", "train", "--config", str(path)])
    assert console_main() == 2
    assert capsys.readouterr().err.startswith(f"rlzoo: error: {path}: num_generations must be >= 2, got 0")
    with pytest.raises(CommandLineError, match="^--num-generations must be >= 2, got 0$"):  # a flag: named as one
        parse_train_args(["--num-generations", "0"])


@pytest.mark.parametrize(("command", "expected"), [
    (["train", "--max-stepz", "3"], "unknown option --max-stepz (did you mean --max-steps or "),
    (["train", "--loss", "0.2"], "unknown option --loss (did you mean --loss.NAME"),
    (["train", "--dtype", "fp8"], "--dtype: invalid choice 'fp8'; valid choices: auto, float32, bf16-mixed, "),
    (["train", "--num-generations", "0"], "--num-generations must be >= 2, got 0"),
    (["train", "--top-p", "2"], "--top-p must be in (0, 1], got 2.0"),
    (["train", "--report-to", "foo"], "--report-to must be a comma-separated list of tensorboard, trackio, wandb"),
    (["train", "--max-steps", "abc"], "--max-steps takes an integer, got 'abc'"),
    (["train", "--temperature=hot"], "--temperature takes a number, got 'hot'"),
    (["train", "--reward-weights", "1", "x"], "--reward-weights takes a list (a number each), or None, got '1' 'x'"),
    (["train", "--max-steps"], "--max-steps needs a value: an integer"),
    # a list-valued flag given nothing: tyro took it as an empty list ("RewardSet needs at least one reward function")
    (["train", "--reward-funcs"], "--reward-funcs needs a value: a list (a string each); give the values after it"),
    (["train", "--reward-funcs", "--max-steps", "1"], "--reward-funcs needs a value: a list (a string each)"),
    (["train", "--reward-weights"], "--reward-weights needs a value: a list (a number each), or None; give the"),
    (["train", "--progress", "x"], "--progress is a switch and takes no value, got 'x' (give --progress or --no"),
    (["train", "stray"], "unexpected argument 'stray'"),
    # TRL's list syntax (--report_to tensorboard trackio): say the comma form
    (["train", "--report_to", "tensorboard", "trackio"], ("unexpected argument 'trackio' after --report-to tensorboard: "
                                                         "trackers are given comma-separated (--report-to tensorboard,trackio)")),
    (["train", "--config"], "--config needs a file"),
    (["train", "--loss.beta"], "--loss.beta needs a value"),
    # a flag after a dotted one is not its value: it said "unexpected argument '1'", or "epsilon_high must be a
    # number, got str '--dynamic-sampling'"
    (["train", "--loss.beta", "--max-steps", "1"], "--loss.beta needs a value (read as YAML: 0.28, 1e-3, true, null)"),
    (["train", "--loss.epsilon_high", "--dynamic-sampling"], "--loss.epsilon_high needs a value (read as YAML"),
    (["train", "--loss.beta=0.1", "--advantage.scale", "--max-steps=1"], "--advantage.scale needs a value"),
    (["eval", "--task.max_terms", "--eval-size", "2"], "--task.max_terms needs a value (read as YAML"),
    (["explain", "dapo", "--loss.beta", "--kind", "preset"], "--loss.beta needs a value (read as YAML"),
    (["train", "--lr", "1e-3"], "unknown option: TRL's --lr is --learning-rate in rlzoo"),
    (["train", "--loss_type", "dapo"], "unknown option: TRL's --loss_type is --algorithm NAME"),
    (["eval", "--eval-size", "x"], "--eval-size takes an integer, or None, got 'x'"),
    (["eval", "--learning-rate", "1e-3"], "unknown option --learning-rate; rlzoo eval --help lists the options"),
    # eval said "TRL's --lr is --learning-rate in rlzoo", which it refuses in turn
    (["eval", "--lr", "1e-3"], "unknown option --lr"),
    (["eval", "--beta", "0.1"], "unknown option --beta"),
    # inf passed the ">= 0" checks: a run of non-finite weights that exited 0 (--temperature failed after step 0)
    (["train", "--learning-rate", "inf"], "--learning-rate must be >= 0 and finite, got inf"),
    (["train", "--weight-decay", "inf"], "--weight-decay must be >= 0 and finite, got inf"),
    (["train", "--temperature", "inf"], "--temperature must be > 0 and finite, got inf"),
    (["train", "--overlong-penalty", "nan"], "--overlong-penalty must be finite, got nan"),
])
def test_a_bad_flag_is_one_error_line_naming_the_flag_and_what_it_takes(command, expected, monkeypatch, capsys):
    """tyro's errors used to be its boxed multi-line panel (╭─ Value error ─╮ ...), not rlzoo's one line."""
    monkeypatch.setattr("sys.argv", ["rlzoo", *command])
    monkeypatch.delenv("RLZOO_DEBUG", raising=False)
    assert console_main() == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"rlzoo: error: {expected}"), err
    assert "RLZOO_DEBUG" not in err  # a flag has no traceback worth showing


def test_an_event_the_flag_wording_does_not_know_is_still_one_line(monkeypatch, capsys):
    """tyro's error events are a private API (rlzoo/trainer/flags.py): an event shaped otherwise gets a generic line,
    not a traceback out of the wording."""
    def broken(*args, **kwargs):
        raise AttributeError("an event of another tyro")

    monkeypatch.setattr("rlzoo.trainer.flags.flag_error", broken)
    monkeypatch.setattr("sys.argv", ["rlzoo", "train", "--max-steps", "abc"])
    monkeypatch.delenv("RLZOO_DEBUG", raising=False)
    assert console_main() == 2
    assert capsys.readouterr().err == "rlzoo: error: invalid arguments; rlzoo train --help lists the options\n"


def test_a_closed_pipe_ends_quietly(tmp_path):
    """``rlzoo tasks | head -1`` used to end with ``rlzoo: error: [Errno 32] Broken pipe``."""
    import subprocess
    import sys

    script = "import sys; from rlzoo.cli import console_main; sys.argv = ['rlzoo', 'tasks']; sys.exit(console_main())"
    proc = subprocess.run(f"{sys.executable} -c \"{script}\" | head -c 10", shell=True, capture_output=True,
                          text=True, check=False, cwd=tmp_path)
    assert proc.stdout and proc.stderr == "", proc.stderr


def test_a_broken_pipe_that_is_not_stdout_is_an_error(monkeypatch, capsys):
    """Only stdout's reader going away is quiet: a BrokenPipeError from anywhere else (a tracker's socket) is
    reported, not swallowed."""
    def broken(argv=None):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("rlzoo.cli.main", broken)
    monkeypatch.delenv("RLZOO_DEBUG", raising=False)
    assert console_main() == 2
    assert capsys.readouterr().err.startswith("rlzoo: error: [Errno 32] Broken pipe")


def test_mappings_lay_over_option_by_option():
    below = {"loss": {"epsilon_high": 0.28, "beta": 0.0}, "peft": {"r": 4}, "task_kwargs": {"max_terms": 3},
             "max_steps": 1}
    assert lay_over(below, {"loss": {"beta": 0.1}, "peft": None, "max_steps": 2, "seed": 3}) == {
        "loss": {"epsilon_high": 0.28, "beta": 0.1}, "peft": None, "task_kwargs": {"max_terms": 3}, "max_steps": 2,
        "seed": 3}
    assert below["loss"] == {"epsilon_high": 0.28, "beta": 0.0}  # not modified


def test_eval_model_of_a_run_directory_points_to_run(tmp_path):
    """A run directory given as --model used to be read as a model ("module 'torch' has no attribute 'auto'")."""
    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "step-000001"
    (checkpoint / "model").mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    (run / "config.json").write_text(json.dumps({"model": "tiny-random", "dtype": "auto"}))
    with pytest.raises(ValueError, match=f"^--model {run} is an rlzoo run directory, not a model: evaluate its newest "
                                         f"checkpoint with --run {run}"):
        main(["eval", "--model", str(run)])


def test_eval_config_and_run_the_files_task_is_the_runs_when_it_names_the_same_file(tmp_path, monkeypatch):
    """A train config names its data file relative, the run's config.json records it absolute: with --run the
    file's task is the run's own (its held-out set), not an override evaluating every row (reviewer)."""
    from rlzoo.trainer.eval_run import EvalArgs, with_run

    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.jsonl").write_text('{"prompt": "q", "answer": "1"}\n')
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"task": str(tmp_path / "d.jsonl")}))
    from_file = EvalArgs(model="tiny-random", task="d.jsonl")
    for task in ("d.jsonl", "./d.jsonl"):
        args = with_run(dataclasses.replace(from_file, run="run", task=task), from_file, set(), source="train.yaml")
        assert (args.model, args.task) == (None, None), task
    other = with_run(EvalArgs(run="run", task="chain_sum"), EvalArgs(task="chain_sum"), set(), source="train.yaml")
    assert other.task == "chain_sum"  # another task is an override
    kept = with_run(EvalArgs(run="run", model="m", task="d.jsonl"), from_file, {"--model", "--task"}, source="x")
    assert (kept.model, kept.task) == ("m", "d.jsonl")  # flags are never dropped


def test_eval_of_a_run_without_a_checkpoint_says_so_in_evals_terms(tmp_path):
    """`rlzoo eval --run RUN` of a run trained with --max-steps 0 (or killed before its first checkpoint) said
    "--resume latest: no checkpoint ...; pass --output-dir of the run, give --resume auto ..., or start over with
    --overwrite": rlzoo train's advice, in flags rlzoo eval does not have."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": "tiny-random", "task": "chain_sum", "eval_size": 4,
                                                 "segments": []}))
    for where in ("does not exist", "holds no complete checkpoint"):
        with pytest.raises(FileNotFoundError, match=rf"^rlzoo eval --run {re.escape(str(run))}: the run has no "
                           rf"checkpoint \({re.escape(str(run / 'checkpoints'))} {where}\): train it first, or "
                           r"evaluate a model with --model MODEL$"):
            main(["eval", "--run", str(run)])
        (run / "checkpoints" / "step-000002.tmp").mkdir(parents=True, exist_ok=True)  # an interrupted write
    with pytest.raises(FileNotFoundError, match=r"^rlzoo eval --checkpoint .*step-000009: no such checkpoint; "
                                                rf"--run {re.escape(str(run))} has no checkpoint$"):
        main(["eval", "--run", str(run), "--checkpoint", str(run / "checkpoints" / "step-000009")])
    (run / "checkpoints" / "step-000001" / "model").mkdir(parents=True)
    (run / "checkpoints" / "step-000001" / "trainer_state.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"^rlzoo eval --checkpoint .*step-000002.tmp: not an rlzoo checkpoint "
                                                r"\(no trainer_state.json and model/\); .*checkpoints holds "
                                                r"step-000001$"):
        main(["eval", "--run", str(run), "--checkpoint", str(run / "checkpoints" / "step-000002.tmp")])
    with pytest.raises(ValueError, match=r"^--checkpoint evaluates a checkpoint of --run RUN"):  # was ignored
        main(["eval", "--model", "tiny-random", "--checkpoint", str(run / "checkpoints" / "step-000001")])
    from rlzoo.trainer.eval_run import EvalArgs, eval_config

    # a checkpoint's name, as the listing above shows it, is one of the run's
    config, checkpoint = eval_config(EvalArgs(run=str(run), checkpoint="step-000001"))
    assert (checkpoint, config.model) == (str(run / "checkpoints" / "step-000001"),
                                          str(run / "checkpoints" / "step-000001" / "model"))


@pytest.mark.parametrize("stop", ["finished", "signal", "non-finite", "other"])
def test_rlzoo_train_leaves_the_process_group_when_every_rank_stops_together(stop, tmp_path, monkeypatch):
    """A run that ends, or stops on every rank after the same step (RunInterrupted: a signal the ranks agreed on;
    FloatingPointError: a non-finite reduced loss), leaves the torchrun process group before ``rlzoo train``
    returns or re-raises (the 2-rank end-to-end case is tests/trainer/test_distributed.py's); any other error
    does not (the other ranks would wait in the barrier)."""
    from rlzoo.trainer.interrupts import RunInterrupted

    errors = {"signal": RunInterrupted(15, 3, str(tmp_path)), "non-finite": FloatingPointError("step 3"),
              "finished": None, "other": OSError("disk")}

    def train(config):
        if errors[stop] is not None:
            raise errors[stop]
        return []

    left: list[int] = []
    monkeypatch.setattr("rlzoo.trainer.train", train)
    monkeypatch.setattr("rlzoo.trainer.distributed.leave_process_group", lambda: left.append(1))
    argv = ["train", "--model", "tiny-random", "--output-dir", str(tmp_path / "run")]
    if errors[stop] is None:
        assert main(argv) == 0
    else:
        with pytest.raises(type(errors[stop])):
            main(argv)
    assert left == ([] if stop == "other" else [1])


@pytest.mark.parametrize(("flags", "message"), [
    (["--eval-size", "-1"], "--eval-size must be >= 0, got -1"),
    (["--max-completion-length", "0"], "--max-completion-length must be >= 1, got 0"),
])
def test_rlzoo_eval_names_a_bad_value_by_its_flag(flags, message):
    """rlzoo eval's values are checked as rlzoo train's, after the parse: the error named the field (eval_size), not
    the flag the user typed."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        main(["eval", "--model", "tiny-random", *flags])


def test_rlzoo_eval_leaves_other_errors_as_they_are(tmp_path):
    """The flag naming is for a value's check only: "task file 'e.jsonl' is empty" became "--task file ..." (review)."""
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"^task file '.*e.jsonl' is empty"):
        main(["eval", "--model", "tiny-random", "--task", str(tmp_path / "e.jsonl")])


def test_reward_weights_on_the_command_line_are_one_per_reward_function_at_parse_time(tmp_path):
    """Python callables (which may take the weights after the names) exist only in the Python API: on the command
    line a wrong count is refused before any model loads, naming where the weights are: the flag, or the --config
    file (rlzoo eval named --reward-weights, which was not given, for a file's weights)."""
    with pytest.raises(ValueError, match=r"^--reward-weights gives 2 weight\(s\) for 1 reward function\(s\) "
                                         r"\['accuracy'\] \(the default's; --reward-funcs gives others\)"):
        parse_train_args(["--model", "tiny-random", "--reward-weights", "1", "2"])
    file = tmp_path / "c.json"
    file.write_text(json.dumps({"model": "tiny-random", "reward_weights": [1, 2], "eval_size": 2}))
    for command in ("train", "eval"):
        with pytest.raises(ValueError, match=rf"^{re.escape(str(file))}: reward_weights gives 2 weight\(s\) for 1 "):
            main([command, "--config", str(file)] + (["--output-dir", str(tmp_path / "r")] if command == "train" else []))
    file.write_text(json.dumps({"model": "tiny-random", "reward_weights": [1, 2], "reward_funcs": ["accuracy"]}))
    with pytest.raises(ValueError, match=rf"\(reward_funcs of {re.escape(str(file))}\): give one weight"):
        parse_train_args(["--config", str(file)])
    assert parse_train_args(["--reward-funcs", "accuracy", "format", "--reward-weights", "1", "0.5"]).reward_weights \
        == (1.0, 0.5)


_WITHOUT_TRAIN_EXTRA = """
import sys
for module in ("transformers", "yaml", "tyro", "datasets", "peft", "reasoning_gym", "accelerate", "safetensors",
               "tqdm", "gguf"):
    sys.modules[module] = None  # as on `pip install rlzoo` without the train extra
from rlzoo.cli import console_main
sys.argv = ["rlzoo", *sys.argv[1:]]
sys.exit(console_main())
"""


@pytest.mark.parametrize(("argv", "code", "says"), [
    (["explain", "dapo"], 0, "dapo: Decoupled Clip"),
    (["list"], 0, "loss presets"),
    (["train", "--max-steps", "1"], 2, "this command needs the train extra, pip install 'rlzoo[train]'"),
])
def test_the_zoo_commands_work_without_the_train_extra(argv, code, says):
    """A core install (torch, numpy, einops, jaxtyping) has the zoo: `rlzoo list` and `explain` ran into the trainer's
    imports (yaml, tyro, transformers) and failed with a traceback; the trainer's commands name the extra."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _WITHOUT_TRAIN_EXTRA, *argv], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert says in (proc.stdout if code == 0 else proc.stderr)
    assert "Traceback" not in proc.stderr


def _fake_run(run: Path, config: dict) -> tuple[Path, torch.nn.Module]:
    """A run directory holding ``config`` as its config.json and one checkpoint (step 2) of a tiny random model:
    the checkpoint and the model."""
    from rlzoo.trainer.models import build_tiny_random

    checkpoint = run / "checkpoints" / "step-000002"
    model, tokenizer = build_tiny_random()
    model.save_pretrained(checkpoint / "model")
    tokenizer.save_pretrained(checkpoint / "model")
    (checkpoint / "trainer_state.json").write_text("{}")
    (run / "config.json").write_text(json.dumps({**config, "segments": []}))
    return checkpoint, model


def test_train_and_export_take_a_checkpoint_for_its_model_and_refuse_a_run_directory(tmp_path):
    """--model RUN (train, export) used to be read as a model (AttributeError: module 'torch' has no attribute
    'auto', from rlzoo's own config.json); --model RUN/checkpoints/step-N said "not a loadable checkpoint". A
    checkpoint now stands for its model/, and a run directory names its newest checkpoint's model."""
    from rlzoo.trainer.models import load_model

    run = tmp_path / "run"
    checkpoint, model = _fake_run(run, {"model": "tiny-random", "dtype": "auto"})
    loaded, _ = load_model(str(checkpoint))
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values(), strict=True))
    with pytest.raises(ValueError, match=f"^model '{run}' is an rlzoo run directory, not a model \\(its newest "
                                         f"checkpoint's model is {checkpoint / 'model'}; pass that"):
        main(["export", str(run), str(tmp_path / "out")])
    assert main(["export", str(checkpoint), str(tmp_path / "out")]) == 0


def test_eval_checks_what_it_evaluates_and_where_it_writes_before_evaluating(tmp_path, monkeypatch, caplog):
    """User trial: --checkpoint of another run was evaluated with --run's task and held-out set; --run RUN --model M
    evaluated M but reported RUN's checkpoint and step; --output into an unwritable place evaluated first and then
    lost the result (naming a temporary file); a --config file's loss, estimator and LoRA tables and its algorithm
    were not checked as rlzoo train checks them."""
    from rlzoo.trainer.eval_run import EvalArgs, eval_config
    from rlzoo.trainer.io import atomic_write_text

    monkeypatch.setattr("rlzoo.trainer.evaluation.evaluate", lambda *a, **k: pytest.fail("evaluated"))
    runs = {}
    for name in ("a", "b"):
        runs[name], _ = _fake_run(tmp_path / name, {"model": "tiny-random", "task": "chain_sum", "eval_size": 4})
    for checkpoint in (runs["b"], runs["b"] / "model"):
        with pytest.raises(ValueError, match=rf"^rlzoo eval --checkpoint {re.escape(str(checkpoint))}: not a "
                                             rf"checkpoint of --run {re.escape(str(tmp_path / 'a'))} "):
            main(["eval", "--run", str(tmp_path / "a"), "--checkpoint", str(checkpoint)])
    config, checkpoint = eval_config(EvalArgs(run=str(tmp_path / "a"), checkpoint=str(runs["a"] / "model")))
    assert (config.model, checkpoint) == (str(runs["a"] / "model"), str(runs["a"]))  # a checkpoint's model/: it
    config, checkpoint = eval_config(EvalArgs(run=str(tmp_path / "a"), model="tiny-random"))
    assert (config.model, config.eval_size, checkpoint) == ("tiny-random", 4, None)
    with pytest.raises(ValueError, match="--checkpoint and --model both name the model to evaluate"):
        eval_config(EvalArgs(run=str(tmp_path / "a"), model="tiny-random", checkpoint="step-000002"))
    (tmp_path / "afile").write_text("")
    for output in (tmp_path / "afile" / "x.json", Path("/proc/x.json")):
        with pytest.raises(OSError, match=rf"^\[Errno \d+\] --output '{re.escape(str(output))}': its directory is not "
                                          r"writable \(.*\): "):
            main(["eval", "--model", "tiny-random", "--output", str(output)])
    with pytest.raises(OSError, match=r"cannot write .*/afile/x.json \(.*\): '.*afile'$"):  # at the write itself
        atomic_write_text(tmp_path / "afile" / "x.json", "{}")
    for content, says in (("loss:\n  bogus: 1\n", "unknown option 'bogus' for loss 'grpo'"),
                          ("advantage_options:\n  bogus: 1\n", "advantage estimator 'grpo' has no option 'bogus'"),
                          ("peft:\n  bogus: 2\n", "unknown --peft option"),
                          ("algorithm: dapo\nadvantage: nosuch\n", "unknown advantage estimator 'nosuch'")):
        (tmp_path / "e.yaml").write_text(content)
        with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / 'e.yaml'))}: .*{says}"):
            main(["eval", "--config", str(tmp_path / "e.yaml"), "--model", "tiny-random"])
    (tmp_path / "e.yaml").write_text("algorithm: nosuch\nloss:\n  bogus: 1\npeft:\n  r: abc\n")
    with pytest.raises(ValueError, match=r"e.yaml: --peft.r takes int, got 'abc'"):  # the LoRA options still are
        main(["eval", "--config", str(tmp_path / "e.yaml"), "--model", "tiny-random"])
    (tmp_path / "e.yaml").write_text("algorithm: nosuch\nloss:\n  bogus: 1\n")  # eval builds no loss: a warning
    monkeypatch.setattr("rlzoo.trainer.eval_run.eval_result", lambda args: pytest.fail("reached"))
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"), pytest.raises(pytest.fail.Exception, match="reached"):
        main(["eval", "--config", str(tmp_path / "e.yaml"), "--model", "tiny-random"])
    assert "algorithm 'nosuch' is no registered preset here; its loss options are not checked" in caplog.text
    monkeypatch.setenv("WORLD_SIZE", "2")  # under torchrun every rank evaluated the whole set and printed it
    with pytest.raises(ValueError, match=r"^rlzoo eval runs in one process: run it without torchrun"):
        main(["eval", "--model", "tiny-random"])
    with pytest.raises(ValueError, match=r"^rlzoo export runs in one process: run it without torchrun"):
        main(["export", str(tmp_path / "ckpt"), str(tmp_path / "out")])  # every rank wrote OUTPUT at once


def _no_nan(text: str) -> object:
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))


def test_eval_of_a_task_without_answers_scores_it_with_the_reward_functions(tmp_path, capsys):
    """A data set with --task.answer_column null has no reference answers: rlzoo eval used to print "accuracy nan%
    (n=0)" and write NaN into its JSON (not valid JSON), then refused it, though the trainer evaluates such a held-out
    set with the reward functions. rlzoo eval scores it with them now (--run: the run's), as the trainer did on the
    same checkpoint, and writes null for what has no value; without a function that can score it, it is refused."""
    from rlzoo.trainer.eval_run import EvalArgs, eval_result

    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i} + {i} ="}) + "\n" for i in range(12)))
    rewards = tmp_path / "rw.py"
    rewards.write_text("def short(completions, **kw):\n    return [1.0 / (1 + len(c)) for c in completions]\n")
    with pytest.raises(ValueError, match=r"reward 'accuracy' needs reference answers; .*--task.answer_column"):
        main(["eval", "--model", "tiny-random", "--task", str(path), "--task.answer_column", "null",
              "--output", str(tmp_path / "out.json")])
    assert not (tmp_path / "out.json").exists()
    run = tmp_path / "run"
    assert main(["train", "--model", "tiny-random", "--max-steps", "1", "--num-generations", "2",
                 "--per-device-train-batch-size", "4", "--max-completion-length", "4", "--task", str(path),
                 "--task.answer_column", "null", "--task.split", "train[4:]", "--task.eval_split", "train[:4]",
                 "--reward-funcs", f"{rewards}:short", "--output-dir", str(run), "--no-progress"]) == 0
    final = [row for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "eval/reward" in row]
    capsys.readouterr()
    out_file = tmp_path / "eval.json"
    assert main(["eval", "--run", str(run), "--max-completion-length", "4", "--output", str(out_file)]) == 0
    captured = capsys.readouterr()
    result = _no_nan(out_file.read_text())
    assert result == _no_nan(captured.out)
    assert (result["accuracy"], result["ci_low"], result["ci_high"], result["n"]) == (None, None, None, 4)
    assert result["reward"] == pytest.approx(final[-1]["eval/reward"], rel=1e-6) and 0 < result["reward"] <= 1
    assert result["reward_metrics"] == {"rewards/short/mean": result["reward"]}
    assert [s["score"] for s in result["samples"]] == [None] * 3 and [s["answer"] for s in result["samples"]] == [None] * 3
    assert f"n=4, reward {result['reward']:.3f}" in captured.err
    out = _no_nan(json.dumps(eval_result(EvalArgs(
        model="tiny-random", task=str(path), task_kwargs={"answer_column": None}, reward_funcs=(f"{rewards}:short",),
        eval_size=2, max_completion_length=4))))
    assert out["n"] == 2 and out["reward"] is not None  # --model: rows of the data set itself, only evaluated


def test_eval_reward_of_a_run_whose_reward_function_moved_or_counts_steps(tmp_path, capsys, caplog):
    """rlzoo eval --run scored with the run's reward functions from a fresh trainer_state (global_step 0: a
    step-scheduled reward differed from the trainer's), and a run whose reward file had moved failed altogether,
    where it reported accuracy before: the functions see the checkpoint's step; one that cannot be loaded is left
    out with a warning for a task with answers; --reward-funcs none evaluates accuracy only. A logged inf is null
    in the JSON (not the invalid Infinity)."""
    rewards = tmp_path / "rw.py"
    rewards.write_text("import math\n"
                       "def step(completions, trainer_state, log_metric, **kw):\n"
                       "    log_metric('spread', math.inf)\n"
                       "    return [float(trainer_state.global_step)] * len(completions)\n")
    run = tmp_path / "run"
    assert main(["train", "--model", "tiny-random", "--max-steps", "2", "--num-generations", "2",
                 "--per-device-train-batch-size", "4", "--max-completion-length", "4", "--eval-size", "2",
                 "--task.max_terms", "2", "--reward-funcs", "accuracy", f"{rewards}:step", "--output-dir", str(run),
                 "--no-progress"]) == 0
    final = [row for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "eval/reward" in row]
    assert final[-1]["step"] == 2 and final[-1]["eval/rewards/step/mean"] == 2.0
    capsys.readouterr()
    assert main(["eval", "--run", str(run), "--max-completion-length", "4"]) == 0
    result = _no_nan(capsys.readouterr().out)
    assert result["reward_metrics"]["rewards/step/mean"] == 2.0 and result["reward"] == final[-1]["eval/reward"]
    assert result["reward_metrics"]["spread"] is None
    rewards.rename(tmp_path / "moved.py")
    with caplog.at_level("WARNING", logger="rlzoo.train"):
        assert main(["eval", "--run", str(run), "--max-completion-length", "4"]) == 0
    result = _no_nan(capsys.readouterr().out)
    assert result["reward"] is None and result["reward_metrics"] == {} and result["accuracy"] is not None
    assert "the held-out reward is not reported: " in caplog.text and "--reward-funcs none" in caplog.text
    caplog.clear()
    for none in ("none", "None"):  # (tyro reads None as "not given": the run's functions scored)
        with caplog.at_level("WARNING", logger="rlzoo.train"):
            assert main(["eval", "--run", str(run), "--max-completion-length", "4", "--reward-funcs", none]) == 0
        assert _no_nan(capsys.readouterr().out)["reward"] is None and "not reported" not in caplog.text
    with pytest.raises(ValueError, match="acuracy"):  # asked for, not inherited: an error, not a warning
        main(["eval", "--run", str(run), "--max-completion-length", "4", "--reward-funcs", "acuracy"])


def test_eval_of_a_run_with_python_reward_functions_scores_with_its_named_ones(tmp_path, caplog):
    """A run whose reward functions were partly Python callables records only their names: rlzoo eval --run scores
    with the named functions and their weights (a warning says which were left out); --reward-funcs replaces the
    run's functions and their weights."""
    from rlzoo.trainer.eval_run import EvalArgs, eval_config

    run = tmp_path / "run"
    _fake_run(run, {"model": "tiny-random", "reward_funcs": ["accuracy"], "reward_weights": [2.0, 0.5],
                    "resolved_python_reward_funcs": ["mine"]})
    with caplog.at_level("WARNING", logger="rlzoo.train"):
        config, _ = eval_config(EvalArgs(run=str(run)))
    assert (config.reward_funcs, config.reward_weights) == (("accuracy",), (2.0,))
    assert "reward functions ['mine'] were Python callables, which rlzoo eval cannot load: the reward is of " \
           "['accuracy'] only" in caplog.text
    config, _ = eval_config(EvalArgs(run=str(run), reward_funcs=("format",)))
    assert (config.reward_funcs, config.reward_weights) == (("format",), None)
    # --reward-weights of the wrong count: refused naming the flag and whose functions they weigh (too many was a
    # warning that the reward is not reported, exit 0; too few suggested Python callables, which eval never takes)
    for given, functions in [({"reward_weights": (1.0, 2.0)}, (r"1 reward function\(s\) \['accuracy'\] \(the run's; "
                                                              r"--reward-funcs gives others\)")),
                             ({"reward_funcs": ("accuracy", "format"), "reward_weights": (1.0,)},
                              r"2 reward function\(s\) \['accuracy', 'format'\]:")]:
        with pytest.raises(ValueError, match=rf"^--reward-weights gives {len(given['reward_weights'])} weight\(s\) for "
                                             rf"{functions}.*give one weight per reward function$"):
            eval_config(EvalArgs(run=str(run), **given))
    with pytest.raises(ValueError, match=r"for 1 reward function\(s\) \['accuracy'\] \(the default's"):
        eval_config(EvalArgs(model="tiny-random", reward_weights=(1.0, 2.0)))
    assert eval_config(EvalArgs(run=str(run), reward_weights=(3.0,)))[0].reward_weights == (3.0,)


def test_a_misspelt_config_key_or_task_gets_a_did_you_mean():
    """A config file's `learning-rate` or `max_step`, and `--task chain_sun` / `Chain_Sum`, got only the list of
    every valid name (70 keys, 100 tasks)."""
    from rlzoo.trainer.tasks import load_task

    for key, meant in (("learning-rate", "learning_rate"), ("max_step", "max_steps")):
        with pytest.raises(ValueError, match=rf"\({key!r}: did you mean {meant!r}\?\); valid keys: "):
            TrainConfig.from_dict({key: 1})
    for name in ("chain_sun", "Chain_Sum"):
        with pytest.raises(UnknownNameError, match=rf"unknown task {name!r}: .* did you mean 'chain_sum'\?; available"):
            load_task(name)


def test_explain_takes_loss_options_as_plot_and_train_do(capsys):
    """`rlzoo explain dapo --loss.epsilon_high 0.3` failed ("unrecognized arguments") while `rlzoo plot` and
    `rlzoo train` take --loss.*: it prints the card and the components the options build."""
    assert main(["explain", "DAPO", "--loss.epsilon_high", "0.3", "--loss.beta=0.04"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dapo: ") and "components (with --loss.epsilon_high 0.3 --loss.beta 0.04):" in out
    assert "ppo_clip(epsilon_low=0.2, epsilon_high=0.3" in out and "kl(beta=0.04" in out
    # what the options need too (the card's needs: line is the defaults'): a KL penalty reads ref_logprobs
    assert out.endswith("needs:     logprobs, advantages, completion_mask, ref_logprobs\n")
    with pytest.raises(ValueError, match="did you mean 'epsilon_high'"):
        main(["explain", "dapo", "--loss.epsilon_hihg", "0.3"])
    assert capsys.readouterr().out == ""  # the error comes alone: no card printed before it
    with pytest.raises(ValueError, match="go with one preset name"):
        main(["explain", "--all", "--loss.beta", "0.1"])
    with pytest.raises(ValueError, match=r"go with one preset name \(rlzoo list\), not with --kind advantage$"):
        main(["explain", "grpo", "--kind", "advantage", "--loss.beta", "0.1"])
    with pytest.raises(ValueError, match="takes loss options only"):
        main(["explain", "dapo", "--task.max_terms", "3"])


def test_the_docs_config_file_example_takes_another_task(tmp_path):
    """docs/trainer.md's TOML example with ``--task leg_counting`` said "unknown option(s) ['max_terms', 'min_terms']":
    the example names its task, so another --task drops its task options (a file naming no task keeps them)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "trainer.md").read_text()
    example = tmp_path / "run.toml"
    example.write_text(re.search(r"```toml\n(.*?)```", text, re.DOTALL).group(1))
    config = parse_train_args(["--config", str(example), "--task", "leg_counting", "--task.min_animals", "2"])
    assert config.task == "leg_counting" and dict(config.task_kwargs) == {"min_animals": 2}
    assert dict(parse_train_args(["--config", str(example)]).task_kwargs) == {"min_terms": 2, "max_terms": 3}
    untasked = tmp_path / "data.toml"
    untasked.write_text('[task_kwargs]\nanswer_column = "solution"\n')
    assert dict(parse_train_args(["--config", str(untasked), "--task", "train.jsonl"]).task_kwargs) == {
        "answer_column": "solution"}


def test_reward_funcs_none_in_train_says_what_it_means_in_eval():
    """`rlzoo train --reward-funcs none` (rlzoo eval's documented spelling) said "unknown reward function 'none';
    built-in: ...; or reward function 'none' must be 'module:function', ..." (two sentences run together; user
    trial): one line says training needs a reward function and what eval's none is."""
    with pytest.raises(CommandLineError, match=r"^--reward-funcs none: training needs a reward function \(rlzoo "
                                               r"eval's 'none' means its accuracy alone"):
        parse_train_args(["--model", "tiny-random", "--reward-funcs", "none"])


def test_adapter_options_a_run_cannot_honour_in_a_config_file_name_the_file(tmp_path):
    """A config file's peft table was checked for LoraConfig's types (naming the file) but not for what a run
    refuses (dropout, another task type): that error named the flag only (user trial). It names the file first."""
    file = tmp_path / "f.yaml"
    file.write_text("model: tiny-random\npeft:\n  r: 4\n  lora_dropout: 0.05\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(file))}: --peft.lora_dropout must be 0, got 0.05"):
        parse_train_args(["--config", str(file)])
    with pytest.raises(ValueError, match=r"^--peft.lora_dropout must be 0, got 0.1"):  # a flag's: the flag only
        parse_train_args(["--config", str(file), "--peft.lora_dropout", "0.1"])
