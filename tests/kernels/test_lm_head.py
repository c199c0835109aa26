"""lm_head_spec on tiny random Hugging Face models: fused log-probs from the body's hidden states equal the
log-probs of the model's own logits (value and parameter gradients), for tied/untied heads, Gemma 2's
final-logit soft-capping, Cohere's logit scale and Granite's logits scaling."""

import pytest
import torch
from tolerances import tol

from rlzoo.kernels import (
    LMHeadSpec,
    causal_lm_logprobs,
    fused_linear_logprobs,
    lm_head_spec,
    logprobs_and_entropy_from_logits,
    verify_lm_head_spec,
)

transformers = pytest.importorskip("transformers")

COMMON = {"vocab_size": 97, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
          "num_attention_heads": 2, "num_key_value_heads": 2}


def _model(kind):
    torch.manual_seed(0)
    if kind == "llama_tied":
        cfg = transformers.LlamaConfig(**COMMON, tie_word_embeddings=True)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "llama_untied":
        cfg = transformers.LlamaConfig(**COMMON, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "gemma2":
        cfg = transformers.Gemma2Config(**COMMON, head_dim=8, final_logit_softcapping=0.5, query_pre_attn_scalar=8)
        model = transformers.Gemma2ForCausalLM(cfg)
    elif kind == "cohere":
        cfg = transformers.CohereConfig(**COMMON, logit_scale=3.0)
        model = transformers.CohereForCausalLM(cfg)
    elif kind == "granite":
        cfg = transformers.GraniteConfig(**COMMON, logits_scaling=0.25)
        model = transformers.GraniteForCausalLM(cfg)
    else:
        raise AssertionError(kind)
    return model.double().eval()


EXPECTED = {
    "llama_tied": (None, None),
    "llama_untied": (None, None),
    "gemma2": (None, 0.5),
    "cohere": (3.0, None),
    "granite": (4.0, None),
}


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_spec_reproduces_model_logprobs_and_gradients(kind):
    model = _model(kind)
    spec = lm_head_spec(model)
    assert (spec.logit_scale, spec.logit_softcap) == EXPECTED[kind]
    if kind in ("llama_tied", "gemma2", "cohere"):  # tied by default in these configs
        assert spec.weight is model.get_input_embeddings().weight
    ids = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(1))
    assert verify_lm_head_spec(model, ids, spec) < 1e-8
    targets, inputs = ids[:, 1:], ids

    def plain():
        logits = model(input_ids=inputs).logits[:, :-1]
        return logprobs_and_entropy_from_logits(logits, targets, 0.9)

    def fused():
        hidden = model.get_decoder()(input_ids=inputs).last_hidden_state[:, :-1]
        return fused_linear_logprobs(hidden, token_ids=targets, temperature=0.9, chunk_size=10, **spec)

    grads = []
    for fn in (plain, fused):
        model.zero_grad()
        lp, ent = fn()
        (lp.sum() + 0.3 * ent.sum()).backward()
        grads.append(({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, lp, ent))
    (g_plain, lp_p, ent_p), (g_fused, lp_f, ent_f) = grads
    torch.testing.assert_close(lp_f, lp_p, **tol(torch.float64))
    torch.testing.assert_close(ent_f, ent_p, **tol(torch.float64))
    assert g_plain.keys() == g_fused.keys()
    for name in g_plain:
        torch.testing.assert_close(g_fused[name], g_plain[name], **tol(torch.float64), msg=name)


def test_spec_is_a_mapping_of_keyword_arguments():
    spec = LMHeadSpec(weight=torch.zeros(5, 3), logit_softcap=2.0)
    assert dict(spec) == {"weight": spec.weight, "bias": None, "logit_scale": None, "logit_softcap": 2.0}
    with pytest.raises(KeyError):
        spec["temperature"]


def test_unknown_logit_transform_raises():
    """A family not known here that sets a logit-transform field must not be silently mis-scored."""
    model = _model("llama_untied")
    model.config.logits_scaling = 2.0
    with pytest.raises(NotImplementedError, match="logits_scaling"):
        lm_head_spec(model)


def test_verify_detects_a_wrong_spec():
    model = _model("gemma2")
    wrong = LMHeadSpec(weight=model.get_output_embeddings().weight)  # soft-cap forgotten
    with pytest.raises(ValueError, match="does not reproduce"):
        verify_lm_head_spec(model, torch.tensor([[1, 2, 3]]), wrong)


def test_model_without_head_raises():
    body = transformers.LlamaModel(transformers.LlamaConfig(**COMMON))
    with pytest.raises(ValueError, match="no output embeddings"):
        lm_head_spec(body)


@pytest.mark.parametrize("kind", ["llama_tied", "gemma2"])
def test_causal_lm_logprobs_fused_equals_plain(kind):
    """The trainer's switch: fused (body + fused_linear_logprobs) and plain (model logits) give the same
    completion log-probs, entropies and parameter gradients, with a temperature (and left padding)."""
    model = _model(kind)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 97, (3, 8), generator=g)
    mask = torch.ones(3, 8, dtype=torch.long)
    if kind != "gemma2":  # Gemma 2's eager attention gives NaN gradients at fully padded rows (both paths)
        mask[0, :2] = 0  # left padding of the prompt
    results = []
    for fused in (True, False):
        model.zero_grad()
        out = causal_lm_logprobs(model, ids, mask, 5, temperature=0.7, fused=fused, chunk_size=16)
        (out.logprobs.sum() + 0.5 * out.entropy.sum()).backward()
        results.append((out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (fused_out, fused_grads), (plain_out, plain_grads) = results
    assert fused_out.logprobs.shape == (3, 5)
    torch.testing.assert_close(fused_out.logprobs, plain_out.logprobs, **tol(torch.float64))
    torch.testing.assert_close(fused_out.entropy, plain_out.entropy, **tol(torch.float64))
    assert fused_grads.keys() == plain_grads.keys()
    for name in fused_grads:
        torch.testing.assert_close(fused_grads[name], plain_grads[name], **tol(torch.float64), msg=name)
    lp_only = causal_lm_logprobs(model, ids, mask, 5, temperature=0.7, return_entropy=False, fused=False)
    assert lp_only.entropy is None
    torch.testing.assert_close(lp_only.logprobs, plain_out.logprobs.detach(), **tol(torch.float64))


@pytest.mark.parametrize("k", [0, 8, 2.0])
def test_causal_lm_logprobs_rejects_bad_logits_to_keep(k):
    import inspect

    model = _model("llama_untied")
    with pytest.raises(ValueError, match="logits_to_keep"):
        inspect.unwrap(causal_lm_logprobs)(model, torch.zeros(1, 8, dtype=torch.long), None, k)
