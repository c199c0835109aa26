"""The Hugging Face generation backend: EOS masking, left padding, the shared-prefix prefill."""

import warnings

import torch

from rlzoo.trainer.generation import HFGenerator, completion_mask_from_eos
from rlzoo.trainer.models import load_model

PROMPTS = ["What is 2 + 3?", "Count the legs of 2 spiders and 1 cat, please.", "7 - 4 = ?"]


def _chat(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def test_completion_mask_ends_at_the_first_eos_inclusive():
    eos = [5, 9]
    ids = torch.tensor([[1, 2, 5, 3, 5],    # EOS at 2: tokens 0..2 count
                        [9, 1, 1, 1, 1],    # EOS first
                        [1, 2, 3, 4, 6],    # no EOS: all count, truncated
                        [1, 1, 1, 1, 9]])   # EOS last
    mask, truncated = completion_mask_from_eos(ids, eos)
    assert mask.tolist() == [[True, True, True, False, False],
                             [True, False, False, False, False],
                             [True, True, True, True, True],
                             [True, True, True, True, True]]
    assert truncated.tolist() == [False, False, True, False]


def test_prompts_are_left_padded_and_truncated_from_the_left():
    _, tok = load_model("tiny-random")
    prompts = [_chat(tok, p) for p in PROMPTS]
    ids, mask = HFGenerator(tok, max_completion_length=4).encode_prompts(prompts, "cpu")
    lengths = mask.sum(-1)
    assert int(lengths.max()) == ids.shape[1] and int(lengths.min()) < ids.shape[1]
    for row_ids, row_mask, prompt in zip(ids, mask, prompts, strict=True):
        n = int(row_mask.sum())
        assert not bool(row_mask[: ids.shape[1] - n].any()) and bool(row_mask[ids.shape[1] - n:].all())
        assert row_ids[row_mask].tolist() == tok(prompt, add_special_tokens=False)["input_ids"]
    short_ids, short_mask = HFGenerator(tok, max_completion_length=4, max_prompt_length=7).encode_prompts(prompts, "cpu")
    assert short_ids.shape[1] == 7
    torch.testing.assert_close(short_ids, ids[:, -7:])
    assert torch.equal(short_mask, mask[:, -7:])


def test_shared_prefix_sampling_equals_per_row_prefill():
    """Prefilling each prompt once and copying its KV cache to the group samples the same completions (same
    seed) as prefilling every row; EOS handling and texts follow the completion mask."""
    model, tok = load_model("tiny-random")
    model.eval()
    prompts = [_chat(tok, p) for p in PROMPTS]
    outputs = []
    for share in (True, False):
        torch.manual_seed(11)
        generator = HFGenerator(tok, max_completion_length=12, temperature=1.0, share_prefix=share)
        with warnings.catch_warnings():  # the cache goes by the keyword this transformers takes: no deprecation
            warnings.simplefilter("error", FutureWarning)
            outputs.append(generator.generate(model, prompts, 4))
    shared, plain = outputs
    assert torch.equal(shared.completion_ids, plain.completion_ids)
    assert torch.equal(shared.completion_mask, plain.completion_mask)
    assert shared.texts == plain.texts
    assert shared.group_index.tolist() == [i for i in range(len(PROMPTS)) for _ in range(4)]
    expected_mask, expected_truncated = completion_mask_from_eos(shared.completion_ids, [tok.eos_token_id])
    assert torch.equal(shared.completion_mask, expected_mask)
    assert torch.equal(shared.is_truncated, expected_truncated)
    for ids, mask, text in zip(shared.completion_ids, shared.completion_mask, shared.texts, strict=True):
        assert text == tok.decode(ids[mask], skip_special_tokens=True)


def test_a_prompt_past_the_models_positions_warns_once(caplog):
    """A 10k-token prompt on tiny-random (2048 positions) trained silently, only transformers' tokenizer warning
    hinting at it (helper trial): one warning naming the lengths and --max-prompt-length, once per model (the
    sampling and evaluation generators of a run warned once each)."""
    import logging

    model, tok = load_model("tiny-random")
    model.config.max_position_embeddings = 40  # a short model: the prompts below reach past it
    generator = HFGenerator(tok, max_completion_length=8, share_prefix=False)
    evaluation = HFGenerator(tok, max_completion_length=8, share_prefix=False)  # a run's second generator
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        for _ in range(2):
            generator.generate(model, [_chat(tok, "x " * 20)], 1, greedy=True)
            evaluation.generate(model, [_chat(tok, "x " * 20)], 1, greedy=True)
    warned = [r.getMessage() for r in caplog.records if "max_position_embeddings" in r.getMessage()]
    assert len(warned) == 1 and "+ max_completion_length 8 exceeds the model's 40 positions" in warned[0]
    caplog.clear()
    other, _ = load_model("tiny-random")  # another run's model is warned about again
    other.config.max_position_embeddings = 40
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        evaluation.generate(other, [_chat(tok, "x " * 20)], 1, greedy=True)
    assert caplog.text.count("max_position_embeddings") == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlzoo.train"):
        HFGenerator(tok, max_completion_length=8, max_prompt_length=30).generate(model, [_chat(tok, "x " * 20)], 1,
                                                                                greedy=True)
    assert "max_position_embeddings" not in caplog.text  # cut to 30 + 8 <= 40
