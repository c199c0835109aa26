"""LoRA through peft: only the adapter trains, the reference is the base model with the adapter disabled (no copy),
the fused log-prob path works through the PEFT wrapper, checkpoints hold the adapter and resume exactly, the
adapter reloads onto its base and merges into a plain model. Tiny random model."""

import dataclasses
import json
import re
import shutil

import pytest
import torch
from peft import LoraConfig, get_peft_model
from tolerances import tol

from rlzoo.trainer import TrainConfig, Trainer
from rlzoo.trainer.adapters import AdapterDisabled, export_model, lora_config
from rlzoo.trainer.models import build_tiny_random, load_model
from rlzoo.trainer.scorer import completion_logprobs, model_logits

TINY = {"model": "tiny-random", "num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 5,
        "eval_size": 0, "progress": False, "learning_rate": 2e-2, "reward_funcs": (),
        "peft": {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}, "loss": {"beta": 0.04}}


def digit_fraction(prompts, completions, **columns):
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def _lora(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" in k}


def test_lora_trains_the_adapter_only_and_checkpoints_resume_exactly(tmp_path):
    common = {**TINY, "max_steps": 3, "save_steps": 1, "save_total_limit": 5}
    full = Trainer(TrainConfig(**common, output_dir=str(tmp_path / "a")), reward_funcs=[digit_fraction])
    assert isinstance(full.reference, AdapterDisabled) and full.reference.policy is full.model  # no second copy
    trainable = {n for n, p in full.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    want = full.train()
    assert want[0]["kl"] == 0.0 and want[-1]["kl"] > 0.0  # LoRA B starts at 0; then the policy leaves its base
    base, _ = build_tiny_random()
    for name, tensor in base.state_dict().items():  # every base weight unchanged
        assert torch.equal(full.model.get_base_model().state_dict()[name.replace("proj.weight", "proj.base_layer.weight")
                                                                     if "proj" in name else name], tensor), name
    from torch.distributed.checkpoint import FileSystemReader

    dcp_keys = [k for k in FileSystemReader(str(tmp_path / "a" / "checkpoints" / "step-000003" / "dcp"))
                .read_metadata().state_dict_metadata if k.startswith("model.")]  # the adapter, not the frozen base
    assert dcp_keys and all("lora_" in k for k in dcp_keys), [k for k in dcp_keys if "lora_" not in k][:3]
    saved = tmp_path / "a" / "checkpoints" / "step-000003" / "model"
    assert (saved / "adapter_model.safetensors").is_file() and not (saved / "model.safetensors").exists()
    assert json.loads((saved / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny-random"
    reloaded, _ = load_model(str(saved))  # onto its base, by the name rlzoo knows it
    for name, tensor in _lora(full.model).items():
        assert torch.equal(dict(reloaded.named_parameters())[name], tensor), name
    resumed = Trainer(TrainConfig(**common, output_dir=str(tmp_path / "b"),
                                  resume=str(tmp_path / "a" / "checkpoints" / "step-000002")),
                      reward_funcs=[digit_fraction])
    got = resumed.train()
    timing = ("step_time", "generation_time", "train_time", "tokens_per_second")
    assert {k: v for k, v in got[-1].items() if k not in timing} == {k: v for k, v in want[-1].items()
                                                                      if k not in timing}
    for name, tensor in _lora(full.model).items():
        assert torch.equal(_lora(resumed.model)[name], tensor), name


def test_the_merged_export_is_a_plain_model_with_the_adapters_outputs(tmp_path):
    Trainer(TrainConfig(**{**TINY, "loss": {}}, max_steps=1, output_dir=str(tmp_path / "run")),
            reward_funcs=[digit_fraction]).train()
    checkpoint = tmp_path / "run" / "checkpoints" / "step-000001"
    export_model(checkpoint, tmp_path / "merged")
    assert (tmp_path / "merged" / "model.safetensors").is_file() and not (tmp_path / "merged" /
                                                                          "adapter_config.json").exists()
    adapter, tok = load_model(str(checkpoint / "model"))
    merged, _ = load_model(str(tmp_path / "merged"))
    ids = tok(["3 + 4 = 7"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, adapter(ids).logits, **tol(torch.float32))


def test_export_never_deletes_what_it_must_not(tmp_path, monkeypatch):
    """rlzoo export replaces its OUTPUT as a whole (atomically): a directory with files of its own is refused
    unless --overwrite, a run directory, the source's own directory, its adapter's base and the current directory
    always; the files survive every refusal. The rlzoo command prints the refusal as one line."""
    from rlzoo.cli import console_main

    model, tokenizer = build_tiny_random()
    source = tmp_path / "model"
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.txt").write_text("important")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(FileExistsError, match=r"'.*mine' exists and is not empty.*--overwrite"):
        export_model(source, mine)
    with pytest.raises(ValueError, match=r"training run's directory"):
        export_model(source, run, overwrite=True)
    with pytest.raises(ValueError, match=r"holds the model being exported"):
        export_model(source, tmp_path, overwrite=True)
    monkeypatch.chdir(mine)
    with pytest.raises(ValueError, match=r"current directory"):
        export_model(source, ".", overwrite=True)
    monkeypatch.chdir(tmp_path)
    assert (mine / "thesis.txt").read_text() == "important" and (run / "metrics.jsonl").is_file()
    monkeypatch.setattr("sys.argv", ["rlzoo", "export", str(source), str(mine)])
    assert console_main() == 2
    assert (mine / "thesis.txt").is_file()
    monkeypatch.setattr("sys.argv", ["rlzoo", "export", str(source), str(mine), "--overwrite"])
    assert console_main() == 0
    assert (mine / "model.safetensors").is_file() and not (mine / "thesis.txt").exists()
    assert export_model(source, tmp_path / "new") == tmp_path / "new"  # a new directory needs no flag
    runs = tmp_path / "runs"  # a directory holding runs (a run of only its config.json too)
    (runs / "a").mkdir(parents=True)
    (runs / "a" / "config.json").write_text('{"max_steps": 1, "segments": []}')  # an rlzoo run's
    with pytest.raises(ValueError, match=r"holds a training run's directory"):
        export_model(source, runs, overwrite=True)
    with pytest.raises(ValueError, match=r"is a training run's directory"):
        export_model(source, runs / "a", overwrite=True)
    assert (runs / "a" / "config.json").is_file()
    adapter = tmp_path / "adapter"  # an adapter on the local base `source`: its base is never the OUTPUT (it was
    get_peft_model(load_model(str(source))[0], LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(adapter)
    tokenizer.save_pretrained(adapter)  # replaced by the merged model, silently, with --overwrite)
    with pytest.raises(ValueError, match=r"holds the base model of the adapter being exported"):
        export_model(adapter, source, overwrite=True)
    bases = tmp_path / "bases"  # a .gguf file base (load_model takes one) in a directory OUTPUT names
    bases.mkdir()
    (bases / "base.gguf").write_bytes(b"GGUF")
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(bases /
                                                                                                     "base.gguf")}))
    with pytest.raises(ValueError, match=r"holds the base model of the adapter being exported"):
        export_model(adapter, bases, overwrite=True)
    assert (bases / "base.gguf").read_bytes() == b"GGUF"
    assert load_model(str(source))[0].state_dict().keys() == model.state_dict().keys()


def test_export_refuses_a_runs_checkpoints_whatever_overwrite_says(tmp_path, monkeypatch):
    """User trial: `rlzoo export --overwrite CKPT runs/B/checkpoints` deleted every checkpoint of run B, one into
    runs/X/checkpoints/step-000002 replaced a real checkpoint with a merged model, and one into a new
    runs/X/checkpoints/step-000010 made `--resume latest` fail (not an rlzoo checkpoint). Anything inside a run's
    checkpoints/ or abandoned/ (or inside a checkpoint) is refused now, with --overwrite too; RUN/final works."""
    from rlzoo.cli import console_main
    from rlzoo.trainer.checkpoint import Checkpointer
    from rlzoo.trainer.config import CheckpointConfig

    model, tokenizer = build_tiny_random()
    source = tmp_path / "model"
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    runs = {}
    for name in ("X", "B"):
        run = runs[name] = tmp_path / "runs" / name
        for step in (2, 3):
            checkpoint = run / "checkpoints" / f"step-00000{step}"
            (checkpoint / "model").mkdir(parents=True)
            (checkpoint / "trainer_state.json").write_text(json.dumps({"step": step, "settings": {}}))
        (run / "abandoned" / "after-step-1" / "step-000001").mkdir(parents=True)
        (run / "config.json").write_text('{"max_steps": 3, "segments": []}')
    before = sorted(str(p) for p in (tmp_path / "runs").rglob("*"))
    targets = [runs["B"] / "checkpoints", runs["X"] / "checkpoints" / "step-000002",
               runs["X"] / "checkpoints" / "step-000010", runs["X"] / "abandoned", runs["X"] / "abandoned" / "new",
               runs["X"] / "checkpoints" / "step-000002" / "model"]
    for target in targets:
        for overwrite in (False, True):
            with pytest.raises(ValueError, match=r"^export: OUTPUT .* is (inside )?the (checkpoints|abandoned) of the "
                                                 r"training run .*; write it to a new directory outside them "
                                                 r"\(e\.g\. '.*final'\)$"):
                export_model(source, target, overwrite=overwrite)
    monkeypatch.setattr("sys.argv", ["rlzoo", "export", "--overwrite", str(source), str(runs["B"] / "checkpoints")])
    assert console_main() == 2
    assert sorted(str(p) for p in (tmp_path / "runs").rglob("*")) == before  # nothing deleted, nothing added
    assert Checkpointer(CheckpointConfig(), runs["X"] / "checkpoints").find("latest").name == "step-000003"
    copied = tmp_path / "copied" / "step-000003"  # a checkpoint outside any run
    (copied / "model").mkdir(parents=True)
    (copied / "trainer_state.json").write_text("{}")
    for target in (copied, copied / "model"):
        with pytest.raises(ValueError, match=r"rlzoo checkpoint .*which the export would replace"):
            export_model(source, target, overwrite=True)
    nested = tmp_path / "n2"  # user trial: --overwrite deleted a run two levels below OUTPUT (exp1/seed0/RUN)
    for left_out in ((), ("config.json",), ("checkpoints",)):  # a run is known by its config or its checkpoints
        shutil.copytree(runs["B"], nested / "d" / "B", ignore=shutil.ignore_patterns(*left_out))
        with pytest.raises(ValueError, match=r"^export: OUTPUT .*/n2' holds a training run's directory or checkpoint "
                                             r"\('.*n2/d/B'\), which the export would replace"):
            export_model(source, nested, overwrite=True)
        assert sorted(p.name for p in (nested / "d" / "B").iterdir()) == sorted({"abandoned", "checkpoints",
                                                                                  "config.json"} - set(left_out))
        shutil.rmtree(nested)
    for checkpoint in ("step-000002", "checkpoint-500"):  # a copied checkpoint, an HF Trainer's, below OUTPUT
        (nested / "exp1" / checkpoint).mkdir(parents=True)
        (nested / "exp1" / checkpoint / "trainer_state.json").write_text("{}")
        with pytest.raises(ValueError, match=rf"holds a training run's directory or checkpoint \('.*n2/exp1/{checkpoint}'"):
            export_model(source, nested, overwrite=True)
        shutil.rmtree(nested)
    assert export_model(source, runs["X"] / "final") == runs["X"] / "final"  # what the docs recommend
    assert export_model(source, runs["X"] / "final", overwrite=True) == runs["X"] / "final"


def test_fused_logprobs_through_the_peft_wrapper_equal_its_own_forward():
    model, _ = build_tiny_random()
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(3, 200, (2, 5), generator=g)
    prompt_mask = torch.ones(2, 5, dtype=torch.bool)
    group_index = torch.tensor([0, 0, 1, 1])
    completion_ids = torch.randint(3, 200, (4, 4), generator=g)
    mask = torch.ones(4, 4, dtype=torch.bool)
    fused, _ = completion_logprobs(model, prompt_ids=prompt_ids, prompt_mask=prompt_mask, group_index=group_index,
                                   completion_ids=completion_ids, completion_mask=mask)
    logits = model_logits(model, prompt_ids, prompt_mask, group_index, completion_ids)
    reference = torch.log_softmax(logits.float(), -1).gather(-1, completion_ids[..., None])[..., 0]
    torch.testing.assert_close(fused, reference, **tol(torch.float32))
    fused.sum().backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None}
    assert grads and all("lora_" in n for n in grads)
    with model.disable_adapter():  # the reference: the base model's log-probs
        base, _ = completion_logprobs(model, prompt_ids=prompt_ids, prompt_mask=prompt_mask, group_index=group_index,
                                      completion_ids=completion_ids, completion_mask=mask)
    plain, _ = build_tiny_random()
    expected, _ = completion_logprobs(plain, prompt_ids=prompt_ids, prompt_mask=prompt_mask, group_index=group_index,
                                      completion_ids=completion_ids, completion_mask=mask)
    torch.testing.assert_close(base, expected, **tol(torch.float32))


def test_bad_lora_options_name_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"unknown --peft option\(s\) \['rank'\].*lora_alpha"):
        Trainer(TrainConfig(**{**TINY, "peft": {"rank": 4}}, output_dir=str(tmp_path / "run")))
    with pytest.raises(ValueError, match=r"^--peft.lora_dropout must be 0, got 0.05: rlzoo trains with dropout off.*"
                                         r"ratio differ from 1 at the first iteration"):
        Trainer(TrainConfig(**{**TINY, "peft": {"r": 4, "lora_dropout": 0.05}}, output_dir=str(tmp_path / "run")))
    with pytest.raises(ValueError, match=r"^peft_config.lora_dropout must be 0, got 0.1"):
        Trainer(TrainConfig(**{**TINY, "peft": None}, output_dir=str(tmp_path / "run")),
                peft_config=LoraConfig(r=4, lora_dropout=0.1))
    # user trial: a SEQ_CLS adapter trained and saved one no causal-LM loader takes; bias 'all' with a KL trained
    # the biases the reference (the model with the adapter disabled) shares
    with pytest.raises(ValueError, match=r"^--peft.task_type SEQ_CLS: the policy is a causal LM"):
        Trainer(TrainConfig(**{**TINY, "peft": {"r": 4, "task_type": "SEQ_CLS"}}, output_dir=str(tmp_path / "run")))
    with pytest.raises(ValueError, match=r"^peft_config.bias 'lora_only' trains the model's biases, which disabling "
                                         r"the adapter does not restore"):
        Trainer(TrainConfig(**{**TINY, "peft": None}, output_dir=str(tmp_path / "run")),
                peft_config=LoraConfig(r=4, bias="lora_only"))
    assert not (tmp_path / "run").exists()
    no_kl = Trainer(TrainConfig(**{**TINY, "peft": {"r": 4, "bias": "all"}, "loss": {"beta": 0.0}},
                                output_dir=str(tmp_path / "run")), reward_funcs=[digit_fraction])  # no reference
    assert no_kl.model.peft_config["default"].bias == "all"
    for options, message in [({"r": "abc"}, "--peft.r takes int, got 'abc'"),
                             ({"r": 8.5}, "--peft.r takes int, got 8.5"),
                             ({"r": True}, "--peft.r takes int, got True"),
                             ({"r": 0}, "--peft.r must be a positive integer (the adapter's rank), got 0"),
                             ({"lora_alpha": "abc"}, "--peft.lora_alpha takes float, got 'abc'"),
                             ({"lora_alpha": 0}, ("--peft.lora_alpha must be a finite number > 0 (the adapter's "
                                                 "scale is lora_alpha / r), got 0")),
                             ({"use_dora": "yes_please"}, "--peft.use_dora takes bool, got 'yes_please'"),
                             ({"bias": "some"}, "--peft.bias takes one of 'none', 'all', 'lora_only', got 'some'"),
                             ({"layers_to_transform": [1, "a"]},
                              "--peft.layers_to_transform takes int or list[int], got [1, 'a']")]:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):  # before the model loads: no model given
            Trainer(TrainConfig(**{**TINY, "peft": options}, output_dir=str(tmp_path / "run")))
    # what the types allow: a float option given an int, a placeholder choice of init_lora_weights, lists
    config = lora_config({"r": 4, "lora_alpha": 16.0, "lora_dropout": 0, "init_lora_weights": "pissa_niter_4",
                          "target_modules": ["q_proj", "v_proj"], "use_dora": False})
    assert (config.r, config.init_lora_weights, set(config.target_modules)) == (4, "pissa_niter_4", {"q_proj", "v_proj"})
    with pytest.raises(ValueError, match="adapter on the output layer.*remove it from --peft.target_modules$"):
        Trainer(TrainConfig(**{**TINY, "peft": {"r": 4, "target_modules": ["q_proj", "lm_head"]}},
                            output_dir=str(tmp_path / "run2")))
    # a module the model lacks: peft's message with the option named and the model's (adaptable) linear layers
    with pytest.raises(ValueError, match=r"^--peft.target_modules: Target modules \{'foo_proj'\} not found.*The "
                                         r"model's linear layers: down_proj, gate_proj, k_proj, o_proj, q_proj, "
                                         r"up_proj, v_proj \(or all-linear\)$"):
        Trainer(TrainConfig(**{**TINY, "peft": {"r": 4, "target_modules": "foo_proj"}}, output_dir=str(tmp_path / "r3")))
    with pytest.raises(ValueError, match=r"^peft_config.target_modules: Target modules \{'foo_proj'\} not found"):
        Trainer(TrainConfig(**{**TINY, "peft": None}, output_dir=str(tmp_path / "r4")),
                peft_config=LoraConfig(r=4, target_modules=["foo_proj"]))
    # layers the model lacks (it has 2): the layer option is named too, with the model's layers (a user trial: the
    # message blamed target_modules alone, which were right)
    with pytest.raises(ValueError, match=r"^--peft.target_modules with --peft.layers_to_transform 5 \(the model's "
                                         r"layers: 0-1\): Target modules .* not found"):
        Trainer(TrainConfig(**{**TINY, "peft": {"r": 4, "layers_to_transform": 5}}, output_dir=str(tmp_path / "r3")))
    assert not (tmp_path / "r3").exists() and not (tmp_path / "r4").exists()


def test_an_adapter_that_starts_away_from_zero_is_refused_when_the_loss_needs_a_reference(tmp_path):
    """PiSSA / OLoRA rewrite the base weights to a residual (B A starts at the difference): the model with the adapter
    disabled, the KL's reference, was then not the initial policy (a user trial: kl 0.005 at step 1, where it is
    exactly 0). Refused when a reference is needed; an orthogonal init (B A zero up to rounding) and the default
    train; without a reference PiSSA is fine."""
    def config(init, **loss):
        return TrainConfig(**{**TINY, "peft": {**TINY["peft"], "init_lora_weights": init}, "loss": loss,
                              "output_dir": str(tmp_path / f"{init}-{len(loss)}"), "max_steps": 1})

    from peft import AdaLoraConfig

    for init, where in (("pissa", "every adapted layer"), ("olora", "every adapted layer"), (False, "layer .*")):
        with pytest.raises(ValueError, match=rf"^--peft.init_lora_weights={init!r}: the adapter starts with a non-zero "
                                             rf"update \({where}; .*\), so the model with the adapter disabled, which "
                                             r"is the reference .* is not the initial policy: use the default"):
            Trainer(config(init, beta=0.04), reward_funcs=[digit_fraction])
    for init, kl in (("orthogonal", 1e-10), (True, 0.0)):  # step 1: the policy is the reference (up to rounding)
        history = Trainer(config(init, beta=0.04), reward_funcs=[digit_fraction]).train()
        assert abs(history[-1]["kl"]) <= kl
    Trainer(config("pissa", beta=0.0), reward_funcs=[digit_fraction])  # no reference: nothing to compare with
    adalora = AdaLoraConfig(init_r=4, target_modules=["q_proj", "v_proj"], total_step=10)  # its E starts at zero
    ada = TrainConfig(**{**TINY, "peft": None, "max_steps": 1, "output_dir": str(tmp_path / "adalora")})
    assert Trainer(ada, reward_funcs=[digit_fraction], peft_config=adalora).train()[-1]["kl"] == 0.0


def test_an_adapter_that_rewrites_the_base_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """PiSSA's SVD of every adapted layer of a loaded model takes minutes on a large one: refused by name first."""
    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr("rlzoo.trainer.models.load_model", no_model)
    config = TrainConfig(**{**TINY, "peft": {**TINY["peft"], "init_lora_weights": "pissa_niter_4"},
                            "output_dir": str(tmp_path / "run")})
    with pytest.raises(ValueError, match=r"^--peft.init_lora_weights='pissa_niter_4': .*every adapted layer"):
        Trainer(config, reward_funcs=[digit_fraction])


def test_an_adapter_on_a_tied_embedding_is_refused(tmp_path):
    """User trial: LoRA on embed_tokens of a model that ties it to lm_head (tiny-random, SmolLM2) trained with
    lm_head reading the untouched shared weight, but the export merged the delta into it: logits off by 19. Refused
    now at start, naming the option and modules_to_save, which (checked here) exports what it trained."""
    model, _ = build_tiny_random()
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight  # tied
    message = (r"^an adapter on the input embedding \(embed_tokens\) of a model that ties it to its output layer "
               r"\(lm_head\) would export another model than it trains: .*; remove embed_tokens from {}, or train "
               r"the embedding whole with modules_to_save=\['embed_tokens'\] \(--peft.modules_to_save "
               r"\[embed_tokens\]\)$")
    with pytest.raises(ValueError, match=message.format(r"peft_config\.target_modules")):
        Trainer(TrainConfig(**{**TINY, "peft": None}, output_dir=str(tmp_path / "a")),
                peft_config=LoraConfig(r=4, target_modules=["q_proj", "embed_tokens"]), reward_funcs=[digit_fraction])
    with pytest.raises(ValueError, match=message.format(r"--peft\.target_modules")):
        Trainer(TrainConfig(**{**TINY, "peft": {"r": 4, "target_modules": ".*(q_proj|embed_tokens)"}},
                            output_dir=str(tmp_path / "b")), reward_funcs=[digit_fraction])
    run = tmp_path / "c"  # the alternative: the embedding trained as a copy, the head's weight left as trained
    peft = {"r": 4, "target_modules": ["q_proj"], "modules_to_save": ["embed_tokens"]}
    Trainer(TrainConfig(**{**TINY, "peft": peft, "learning_rate": 5e-2}, max_steps=2, output_dir=str(run)),
            reward_funcs=[digit_fraction]).train()
    checkpoint = run / "checkpoints" / "step-000002"
    export_model(checkpoint, run / "final")
    adapter, tok = load_model(str(checkpoint / "model"))
    merged, _ = load_model(str(run / "final"))
    ids = tok(["3 + 4 = 7"], return_tensors="pt")["input_ids"]
    embedding, head = merged.get_input_embeddings().weight, merged.get_output_embeddings().weight
    assert not torch.equal(embedding, head)  # the embedding trained; the head kept the base's weight
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, adapter(ids).logits, **tol(torch.float32))


@pytest.mark.parametrize(("field", "value", "fits"), [
    ("layers_to_transform", [1, 2], True), ("layers_to_transform", 3, True), ("layers_to_transform", None, True),
    ("layers_to_transform", [1, "a"], False), ("layers_to_transform", [1, True], False),  # every item, bool no int
    ("layers_to_transform", [[1]], False),
    ("layer_replication", [[0, 4], [2, 6]], True), ("layer_replication", [[0, 4, 5]], False),  # list[tuple[int, int]]
    ("trainable_token_indices", {"embed": [1, 2]}, True), ("trainable_token_indices", {"embed": [1, "x"]}, False),
    ("lora_dropout", 0, True), ("lora_dropout", True, False), ("r", 16.0, False), ("use_dora", 1, False),
    ("bias", "none", True), ("bias", None, False), ("init_lora_weights", 1, False), ("init_lora_weights", False, True),
    ("modules_to_save", ["lm_head"], True), ("modules_to_save", "lm_head", False),
])
def test_lora_option_types_are_checked_item_by_item(field, value, fits):
    """What rlzoo's own checker says of values a flag or a YAML / JSON file parses to, against peft.LoraConfig's
    declared types (beartype's is_bearable samples one item of a list: [1, 'a'] passed half the time)."""
    import typing

    from rlzoo.trainer.adapter_options import _fits

    assert _fits(value, typing.get_type_hints(LoraConfig)[field]) is fits


@pytest.mark.slow
def test_lora_on_smollm2_raises_the_reward(tmp_path):
    """LoRA (r 16, every linear layer) on SmolLM2-135M-Instruct, chain_sum, 5 GRPO steps with a KL to the
    adapter-less base: the mean training reward of the last two steps beats the first two (minutes on a CPU)."""
    config = TrainConfig(model="smollm2-135m", max_steps=5, eval_size=0, progress=False, learning_rate=1e-3,
                         peft={"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}, loss={"beta": 0.04},
                         output_dir=str(tmp_path / "run"), save_steps=0)
    history = Trainer(config).train()
    rewards = [row["reward"] for row in history]
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2, rewards
    assert history[-1]["kl"] > 0.0
    assert (tmp_path / "run" / "checkpoints" / "step-000005" / "model" / "adapter_model.safetensors").is_file()


def test_a_model_object_and_its_tokenizer_go_together(tmp_path):
    """A model object needs its tokenizer; a tokenizer without a model object (TRL's processing_class beside a model
    id) was dropped silently (a user trial's custom chat template never reached the prompts): refused, naming how
    to pass both."""
    model, tok = build_tiny_random()
    with pytest.raises(ValueError, match=r"^Trainer\(model=...\) needs its tokenizer too"):
        Trainer(TrainConfig(**TINY, output_dir=str(tmp_path / "a")), model=model)
    with pytest.raises(ValueError, match=r"^Trainer\(config, tokenizer=...\) without model=: a tokenizer goes with a "
                                         r"model object, Trainer\(config, model=AutoModelForCausalLM.from_pretrained\("
                                         r"'tiny-random'\), tokenizer=...\)"):
        Trainer(TrainConfig(**TINY, output_dir=str(tmp_path / "b")), tokenizer=tok, reward_funcs=[digit_fraction])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_python_model_object_is_what_its_run_records(tmp_path, monkeypatch):
    """A run of Trainer(config, model=obj) used to record the default model: `--config RUN/config.json` and a CLI
    resume loaded that model instead, and a LoRA adapter named no base (eval --run and export failed obscurely)."""
    from transformers import AutoModelForCausalLM

    from rlzoo.cli import main

    model, tok = build_tiny_random()
    run = tmp_path / "run"
    Trainer(TrainConfig(**TINY, max_steps=1, output_dir=str(run)), model=model, tokenizer=tok,
            reward_funcs=[digit_fraction]).train()
    saved = json.loads((run / "config.json").read_text())
    assert saved["model"] == saved["segments"][-1]["settings"]["model"] == "model:LlamaForCausalLM"
    adapter = run / "checkpoints" / "step-000001" / "model"
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == saved["model"]
    refusal = (r"^model 'model:LlamaForCausalLM' is a model object that was given from Python .* pass the model "
               r"again via the Python API \(a resume: Trainer\(resume_config\(RUN\), model=\.\.\., "
               r"tokenizer=\.\.\.\)\), or, for a new run or rlzoo eval, --model a checkpoint directory or hub id "
               r"\(a LoRA checkpoint of such a run: export_model\(CKPT, OUT, model=BASE\) in Python, then --model "
               r"OUT\)$")
    with monkeypatch.context() as patch:  # refused before any model loads
        def no_model(*args, **kwargs):
            raise AssertionError("a model loaded")

        patch.setattr("rlzoo.trainer.adapters.build_policy", no_model)
        with pytest.raises(ValueError, match=refusal):
            main(["train", "--config", str(run / "config.json"), "--output-dir", str(tmp_path / "copy"),
                  "--reward-funcs", "accuracy"])  # its Python reward replaced (else that is refused first)
        with pytest.raises(ValueError, match=refusal):
            main(["train", "--output-dir", str(run), "--resume", "latest", "--max-steps", "2",
                  "--reward-funcs", "accuracy"])  # its Python reward replaced: the model is what is refused
    with pytest.raises(ValueError, match=refusal):
        main(["eval", "--run", str(run), "--eval-size", "2"])
    with pytest.raises(ValueError, match=r"^export: the adapter .* was trained on a model object given from Python "
                                         r"\('model:LlamaForCausalLM'\).*adapters\.export_model\(.*, OUTPUT, model=BASE\)$"):
        main(["export", str(run / "checkpoints" / "step-000001"), str(tmp_path / "merged")])

    model.save_pretrained(tmp_path / "base")  # a model with a loadable name_or_path records that name
    tok.save_pretrained(tmp_path / "base")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    named = tmp_path / "named"
    Trainer(TrainConfig(**TINY, max_steps=1, output_dir=str(named)), model=loaded, tokenizer=tok,
            reward_funcs=[digit_fraction]).train()
    assert json.loads((named / "config.json").read_text())["model"] == str(tmp_path / "base")
    assert main(["export", str(named / "checkpoints" / "step-000001"), str(tmp_path / "merged")]) == 0


def test_an_adapter_trained_on_a_python_model_object_merges_from_python(tmp_path):
    """rlzoo export of a LoRA run on Trainer(config, model=obj) said "pass the model again via the Python API", but
    export_model took no model: it takes the base now, merges the adapter into a copy (the merged model gives the
    adapter's logits) and leaves the base unchanged; a trained object (LoRA layers injected in place), a model of
    another class, or model= for a checkpoint without an adapter are refused."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model, tok = build_tiny_random()
    run = tmp_path / "run"
    Trainer(TrainConfig(**{**TINY, "loss": {}}, max_steps=1, output_dir=str(run)), model=model, tokenizer=tok,
            reward_funcs=[digit_fraction]).train()
    checkpoint = run / "checkpoints" / "step-000001"
    with pytest.raises(ValueError, match=r"^export: model= carries LoRA layers .* the base model as it was before"):
        export_model(checkpoint, tmp_path / "merged", model=model)  # the trained object holds its adapter
    with pytest.raises(ValueError, match=r"was trained on a LlamaForCausalLM .*; model= is a Linear$"):
        export_model(checkpoint, tmp_path / "merged", model=torch.nn.Linear(2, 2))
    base, _ = build_tiny_random()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    assert export_model(checkpoint, tmp_path / "merged", model=base) == tmp_path / "merged"
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    assert all(torch.equal(before[k], v) for k, v in base.state_dict().items())  # the base itself is unchanged
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    adapter = PeftModel.from_pretrained(build_tiny_random()[0], str(checkpoint / "model"))
    ids = tok(["3 + 4 = 7"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, adapter(ids).logits, **tol(torch.float32))
        assert not torch.equal(merged(ids).logits, base(ids).logits)  # the adapter was merged: it moved the model
    with pytest.raises(ValueError, match=r"holds no adapter \(adapter_config.json\); export it without model="):
        export_model(tmp_path / "merged", tmp_path / "again", model=base)


def test_lora_checkpoints_save_without_looking_the_base_up(tmp_path, monkeypatch):
    """peft's save_embedding_layers='auto' checks the hub for the base's config on every save (a request online, a
    'Could not find a config file' warning offline): no embedding carries an adapter, so no lookup happens."""
    import warnings

    import peft.utils.save_and_load

    def no_lookup(*args, **kwargs):
        raise AssertionError("the hub was asked for the base model")

    monkeypatch.setattr(peft.utils.save_and_load, "check_file_exists_on_hf_hub", no_lookup)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(TrainConfig(**TINY, max_steps=2, save_steps=1, output_dir=str(tmp_path / "run")),
                reward_funcs=[digit_fraction]).train()
    assert (tmp_path / "run" / "checkpoints" / "step-000002" / "model" / "adapter_model.safetensors").is_file()
    assert not [w for w in caught if "config file" in str(w.message) or "embedding" in str(w.message)], \
        [str(w.message) for w in caught]


def test_the_plot_title_names_an_adapter_given_as_peft_config(tmp_path):
    """' + LoRA' was appended for --peft only, not for Trainer(peft_config=...)."""
    config = TrainConfig(**{**TINY, "peft": None}, output_dir=str(tmp_path / "run"))
    trainer = Trainer(config, peft_config=LoraConfig(r=4, lora_dropout=0.0, target_modules="all-linear"),
                      reward_funcs=[digit_fraction])
    assert trainer.logger.title.endswith(" - tiny-random + LoRA")


def test_a_peft_config_object_is_what_its_run_records_and_resumes(tmp_path):
    """Trainer(config, peft_config=LoraConfig(...)) used to record "peft": null: a resume with other LoRA options
    trained on with the adapter's scale changed, and one without the object failed loading the checkpoint into a
    whole model. Now config.json holds the object's options (as --peft options): a changed option is refused naming
    it, a resume without the object rebuilds the same adapter and continues exactly."""
    from rlzoo.trainer.resume import resume_config

    lora = {"r": 4, "lora_alpha": 16, "target_modules": "all-linear"}  # the options differing from LoraConfig's
    common = {**TINY, "peft": None, "max_steps": 2, "save_steps": 1}
    run = tmp_path / "run"
    want = Trainer(TrainConfig(**common, output_dir=str(run)), peft_config=LoraConfig(**lora),
                   reward_funcs=[digit_fraction]).train()
    saved = json.loads((run / "config.json").read_text())
    assert saved["peft"] == lora
    first = str(run / "checkpoints" / "step-000001")
    with pytest.raises(ValueError, match=r"cannot resume with changed settings: peft.lora_alpha 16 -> 64"):
        Trainer(_elsewhere(resume_config(run, first), tmp_path / "changed"),
                peft_config=LoraConfig(**{**lora, "lora_alpha": 64}), reward_funcs=[digit_fraction])
    for given in ({"peft_config": LoraConfig(**lora)}, {}):  # the same object, or none: the recorded options
        resumed = Trainer(_elsewhere(resume_config(run, first), tmp_path / f"b{len(given)}"),
                          reward_funcs=[digit_fraction], **given)
        got = resumed.train()
        assert got[-1]["loss"] == want[-1]["loss"] and got[-1]["kl"] == want[-1]["kl"]
        assert json.loads((tmp_path / f"b{len(given)}" / "config.json").read_text())["peft"] == lora
    with pytest.raises(ValueError, match=r"either as peft_config or as --peft options, not both"):
        Trainer(TrainConfig(**{**common, "peft": {"r": 8}}, output_dir=str(tmp_path / "both")),
                peft_config=LoraConfig(**lora))
    state = run / "checkpoints" / "step-000001" / "trainer_state.json"  # as written before the options were recorded
    old = json.loads(state.read_text())
    state.write_text(json.dumps({**old, "settings": {**old["settings"], "peft": None}}))
    got = Trainer(_elsewhere(resume_config(run, first), tmp_path / "older"), peft_config=LoraConfig(**lora),
                  reward_funcs=[digit_fraction]).train()
    assert got[-1]["loss"] == want[-1]["loss"]
    with pytest.raises(ValueError, match=r"^--peft.peft_type LOHA: --peft options build a LoRA adapter .* same object"):
        lora_config({"peft_type": "LOHA", "r": 4})  # (it spoke of resuming, on a fresh run's flag too)
    with pytest.raises(ValueError, match=r"^--peft.inference_mode true freezes the adapter, and nothing would train"):
        lora_config({"inference_mode": True, "r": 4})  # was "optimizer got an empty parameter list"
    with pytest.raises(ValueError, match=r"^peft_config.inference_mode=True freezes the adapter"):  # as peft saves it
        Trainer(TrainConfig(**{**TINY, "peft": None}, output_dir=str(tmp_path / "frozen")),
                peft_config=LoraConfig(r=4, target_modules="all-linear", inference_mode=True))


def _elsewhere(config: TrainConfig, output_dir) -> TrainConfig:
    """``config`` (a resume's) continuing into another output directory."""
    import dataclasses

    return dataclasses.replace(config, output_dir=str(output_dir))


def test_target_modules_given_as_names_in_a_string_are_a_list():
    """``--peft.target_modules q_proj`` failed inside peft ("Target modules q_proj not found in the base model"):
    peft reads a string as a pattern of the whole module name. A string of names (comma-separated) is the list
    of those names now; all-linear and patterns stay strings, and the adapter built is the list's."""
    import peft

    from rlzoo.trainer.adapters import built_adapter, lora_config
    from rlzoo.trainer.models import build_tiny_random

    assert lora_config({"target_modules": "q_proj"}).target_modules == {"q_proj"}
    assert lora_config({"target_modules": "q_proj, self_attn.v_proj"}).target_modules == {"q_proj", "self_attn.v_proj"}
    assert lora_config({"target_modules": ".*q_proj"}).target_modules == ".*q_proj"
    assert lora_config({"target_modules": "all-linear"}).target_modules == "all-linear"
    assert built_adapter({"target_modules": "v_proj,q_proj"}) == built_adapter({"target_modules": ["q_proj", "v_proj"]})
    model = peft.get_peft_model(build_tiny_random()[0], lora_config({"target_modules": "q_proj"}))
    adapted = {name.split(".lora_A")[0].rsplit(".", 1)[-1] for name, _ in model.named_parameters() if "lora_A" in name}
    assert adapted == {"q_proj"}


def test_training_on_from_a_trained_adapter_keeps_a_frozen_copy_of_it_as_the_reference(tmp_path, caplog):
    """--model RUN/checkpoints/step-N/model (or the checkpoint: an adapter trained already) trains that adapter on.
    Its reference was the model with the adapter disabled, the base, so the KL started above 0 (0.00115 in a
    helper's trial; only warned). As TRL 1.16 does, the adapter is copied, frozen, as a second adapter that scores
    the reference: the KL at step 1 is exactly 0, only the trained adapter trains, a resume keeps the starting
    adapter as the reference (its steps equal the uninterrupted run's), checkpoints and exports hold the trained
    adapter only."""
    import logging

    import peft

    from rlzoo.trainer.reference_adapter import REFERENCE_ADAPTER

    run = tmp_path / "run"
    Trainer(TrainConfig(**TINY, max_steps=1, output_dir=str(run)), reward_funcs=[digit_fraction]).train()
    adapter = str(run / "checkpoints" / "step-000001" / "model")
    caplog.set_level(logging.WARNING, logger="rlzoo.train")
    on = {**TINY, "peft": None, "model": adapter, "max_steps": 3, "save_steps": 1}
    for i, model in enumerate((adapter, str(run / "checkpoints" / "step-000001"))):
        trainer = Trainer(TrainConfig(**on, output_dir=str(tmp_path / f"on{i}")), reward_funcs=[digit_fraction])
        assert trainer.reference.adapter == REFERENCE_ADAPTER and "trained already" not in caplog.text
        copies = {k: p for k, p in trainer.model.named_parameters() if f".{REFERENCE_ADAPTER}." in k}
        assert copies and not any(p.requires_grad for p in copies.values())
        assert all(torch.equal(p, dict(trainer.model.named_parameters())[k.replace(f".{REFERENCE_ADAPTER}.",
                                                                                    ".default.")])
                   for k, p in copies.items())
        if i:
            break
        want = trainer.train()
        first = next(r for r in want if r["step"] == 1)
        assert first["kl"] == 0.0 and want[-1]["kl"] > 0.0  # the reference is the starting adapter, then it moves
        assert all(not p.requires_grad for p in copies.values())
        assert all(torch.equal(p, c) for p, c in zip(copies.values(), (dict(
            Trainer(TrainConfig(**on, output_dir=str(tmp_path / "x")), reward_funcs=[digit_fraction])
            .model.named_parameters())[k] for k in copies), strict=True))  # frozen: still the starting adapter
    saved = tmp_path / "on0" / "checkpoints" / "step-000002" / "model"
    assert not (saved / REFERENCE_ADAPTER).exists()  # the checkpoint holds the trained adapter only
    resumed = Trainer(TrainConfig(**on, output_dir=str(tmp_path / "resumed"), resume=str(saved.parent)),
                      reward_funcs=[digit_fraction]).train()
    timing = ("step_time", "generation_time", "train_time", "tokens_per_second")
    assert [{k: v for k, v in r.items() if k not in timing} for r in resumed if r["step"] == 3] == [
        {k: v for k, v in r.items() if k not in timing} for r in want if r["step"] == 3]
    export_model(saved.parent, tmp_path / "merged")
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    assert "is not the one checkpoint" not in caplog.text  # nothing changed: nothing said
    state = saved.parent / "trainer_state.json"  # a checkpoint of an older rlzoo (no digest): its reference was the base
    recorded = json.loads(state.read_text())
    state.write_text(json.dumps({k: v for k, v in recorded.items() if k != "model_digest"}))
    Trainer(TrainConfig(**on, output_dir=str(tmp_path / "old"), resume=str(saved.parent)), reward_funcs=[digit_fraction])
    assert f"checkpoint {saved.parent} was written by an older rlzoo, whose reference" in caplog.text
    state.write_text(json.dumps(recorded))
    shutil.copytree(saved, adapter, dirs_exist_ok=True)  # the --model adapter itself changed since the run started
    Trainer(TrainConfig(**on, output_dir=str(tmp_path / "moved"), resume=str(saved.parent)),
            reward_funcs=[digit_fraction])
    assert f"the adapter of {adapter} is not the one checkpoint {saved.parent} started from" in caplog.text
    caplog.clear()
    # a LoRA adapter just made (TRL users' get_peft_model(model, config)) starts at its base: no warning
    from rlzoo.trainer.models import build_tiny_random

    base, tokenizer = build_tiny_random()
    fresh = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    trainer = Trainer(TrainConfig(**{**TINY, "peft": None}, max_steps=1, output_dir=str(tmp_path / "fresh")),
                      model=fresh, tokenizer=tokenizer, reward_funcs=[digit_fraction])
    assert "trained already" not in caplog.text and trainer.reference.adapter is None  # disabled: no copy needed
    ada = peft.get_peft_model(build_tiny_random()[0], peft.AdaLoraConfig(total_step=10, target_modules=["q_proj"]))
    Trainer(TrainConfig(**{**TINY, "peft": None}, max_steps=1, output_dir=str(tmp_path / "ada")), model=ada,
            tokenizer=tokenizer, reward_funcs=[digit_fraction])
    assert "trained already" not in caplog.text  # AdaLoRA's update B (A E) starts at zero through E
    # a trained adapter given from Python with its lora_A frozen by the user: the copy's scoring leaves it frozen
    # (peft's set_adapter made the whole active adapter trainable); a second run of the object copies it again
    given = peft.get_peft_model(build_tiny_random()[0], peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for key, param in given.named_parameters():
            if "lora_B" in key:
                param.normal_(std=0.1)  # trained: its update is not zero
            param.requires_grad_(param.requires_grad and "lora_A" not in key)
    trainable = {k for k, p in given.named_parameters() if p.requires_grad}
    for i in range(2):
        trainer = Trainer(TrainConfig(**{**TINY, "peft": None}, max_steps=2, output_dir=str(tmp_path / f"given{i}")),
                          model=given, tokenizer=tokenizer, reward_funcs=[digit_fraction])
        assert trainer.reference.adapter == REFERENCE_ADAPTER
        rows = trainer.train()
        assert rows[0]["kl"] == 0.0 and {k for k, p in given.named_parameters() if p.requires_grad} == trainable
    assert "trained already" not in caplog.text
    Trainer(TrainConfig(**{**TINY, "peft": None, "model": adapter, "loss": {"beta": 0.0}}, max_steps=1,
                        output_dir=str(tmp_path / "nokl")), reward_funcs=[digit_fraction])
    assert "trained already" not in caplog.text


def test_a_lora_resume_or_export_onto_a_changed_base_warns(tmp_path, caplog):
    """A LoRA checkpoint holds only the adapter: a resume rebuilds the base from --model and an export merges onto
    the base adapter_config.json names. With that folder overwritten by another model both went on in silence
    (helper trial). The checkpoint records a digest of the base (trainer_state.json model_digest); a resume and an
    export onto a changed base warn, and onto the same base (or an older checkpoint without a digest) say nothing."""
    import logging

    from rlzoo.trainer.builtin_models import TinyRandomSpec

    base = tmp_path / "base"
    model, tokenizer = build_tiny_random()
    model.to(torch.bfloat16).save_pretrained(base)  # as hub models are: the run loads it in float32, export in bf16
    tokenizer.save_pretrained(base)
    run = tmp_path / "run"
    config = TrainConfig(**{**TINY, "model": str(base)}, max_steps=1, output_dir=str(run))
    Trainer(config, reward_funcs=[digit_fraction]).train()
    checkpoint = run / "checkpoints" / "step-000001"
    recorded = json.loads((checkpoint / "trainer_state.json").read_text())["model_digest"]
    assert recorded["dtype"] == "float32" and len(recorded["sha256"]) == 16
    caplog.set_level(logging.WARNING, logger="rlzoo.train")
    from rlzoo.trainer.eval_run import EvalArgs, eval_result

    export_model(checkpoint, tmp_path / "same")  # the same base: nothing said
    Trainer(dataclasses.replace(config, max_steps=2, resume="latest"), reward_funcs=[digit_fraction])
    eval_result(EvalArgs(model=str(checkpoint), eval_size=2))
    assert "is not the one checkpoint" not in caplog.text
    build_tiny_random(TinyRandomSpec(seed=7))[0].to(torch.bfloat16).save_pretrained(base)  # now another model
    export_model(checkpoint, tmp_path / "other")
    assert f"the model {base} is not the one checkpoint {checkpoint} started from (its weights differ" in caplog.text
    assert "the adapter is merged over the model as it is now" in caplog.text
    eval_result(EvalArgs(model=str(checkpoint), eval_size=2))  # rlzoo eval of the checkpoint: said too
    assert "the adapter is evaluated over the model as it is now" in caplog.text
    caplog.clear()
    Trainer(dataclasses.replace(config, max_steps=2, resume="latest"), reward_funcs=[digit_fraction]).train()
    assert f"checkpoint {checkpoint} started from" in caplog.text and "the run goes on over the model" in caplog.text
    later = json.loads((run / "checkpoints" / "step-000002" / "trainer_state.json").read_text())["model_digest"]
    assert later == recorded  # the model the run started from, not the one this segment loaded: still checked


def test_a_peft_model_given_with_another_adapter_name_or_frozen_is_refused():
    """A PeftModel whose adapter is named otherwise than 'default' wrote checkpoints that rlzoo eval and export could
    not load (peft saves it in a subfolder); one loaded with is_trainable=False failed with torch's "optimizer got an
    empty parameter list". Both are refused at start, saying what to do."""
    base, tokenizer = build_tiny_random()
    named = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"]), adapter_name="pol")
    with pytest.raises(ValueError, match=r"^the model's adapter is named 'pol': name it 'default'"):
        Trainer(TrainConfig(**{**TINY, "peft": None}, max_steps=1), model=named, tokenizer=tokenizer)
    frozen = get_peft_model(build_tiny_random()[0], LoraConfig(r=4, target_modules=["q_proj"])).requires_grad_(False)
    with pytest.raises(ValueError, match=r"^the model's adapter is frozen, so nothing would train .* "
                                         r"is_trainable=True"):
        Trainer(TrainConfig(**{**TINY, "peft": None}, max_steps=1), model=frozen, tokenizer=tokenizer)


def test_a_prompt_learning_adapter_is_refused_naming_what_trains(tmp_path, monkeypatch):
    """Prefix / prompt tuning add virtual tokens the scorer never feeds: training failed at the first backward with
    torch's "element 0 of tensors does not require grad". Refused before the model loads (as peft_config) or at
    start (a PeftModel given), naming the adapters that train."""
    from peft import PrefixTuningConfig, PromptTuningConfig

    message = r"is a prompt-learning method \(virtual tokens added to the input\).*use an adapter of the weights"
    with monkeypatch.context() as patch:
        patch.setattr("rlzoo.trainer.models.load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
        for config in (PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
                       PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)):
            with pytest.raises(ValueError, match=f"^peft_config: {type(config).__name__} {message}"):
                Trainer(TrainConfig(**{**TINY, "peft": None}, output_dir=str(tmp_path / "run")),
                        reward_funcs=[digit_fraction], peft_config=config)
    base, tokenizer = build_tiny_random()
    prompted = get_peft_model(base, PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))
    with pytest.raises(ValueError, match=f"^the model's adapter: PromptTuningConfig {message}"):
        Trainer(TrainConfig(**{**TINY, "peft": None}, max_steps=1, output_dir=str(tmp_path / "run2")), model=prompted,
                tokenizer=tokenizer, reward_funcs=[digit_fraction])


def test_wrapping_and_reloading_an_adapter_prints_no_deprecation_a_user_cannot_act_on(tmp_path):
    """peft reads transformers' deprecated ``is_gradient_checkpointing`` when it wraps a model: without
    ``peft_wrapping`` every LoRA run printed that FutureWarning (twice with a resume or export)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = Trainer(TrainConfig(**TINY, max_steps=1, save_steps=1, output_dir=str(tmp_path / "a")),
                          reward_funcs=[digit_fraction])
        trainer.train()
        load_model(str(tmp_path / "a" / "checkpoints" / "step-000001" / "model"))
        export_model(tmp_path / "a" / "checkpoints" / "step-000001" / "model", tmp_path / "merged")
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)], [str(w.message) for w in caught]
