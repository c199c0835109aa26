"""Prompts: a question as the string the model is conditioned on, exactly as TRL 1.16 builds it."""

from transformers import PreTrainedTokenizerBase

__all__ = ["format_prompt", "prompt_messages"]


def prompt_messages(question: str, system_prompt: str | None = None) -> list[dict[str, str]]:
    """The conversational prompt of one question: ``[system?, user]`` messages (TRL's "prompt" column)."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
    return [*messages, {"role": "user", "content": question}]


def format_prompt(tokenizer: PreTrainedTokenizerBase, question: str, system_prompt: str | None = None) -> str:
    """The prompt string a model is conditioned on, exactly as TRL 1.16's GRPOTrainer builds it.

    For a tokenizer with a chat template, TRL renders the conversational prompt :func:`prompt_messages`
    with ``apply_chat_template(..., add_generation_prompt=True)`` (trl/data_utils.py
    ``apply_chat_template`` for a last "user" message; GRPOTrainer._tokenize_prompts), so with
    ``system_prompt=None`` the template's default system prompt applies (SmolLM2: "You are a helpful AI
    assistant named SmolLM, trained by Hugging Face"). Tokenize the result with
    ``add_special_tokens=False`` (what ``apply_chat_template(tokenize=True)`` does) to get TRL's prompt ids.
    Without a chat template the question is returned unchanged (TRL's standard, non-conversational format).

    Raises:
        ValueError: ``system_prompt`` given for a tokenizer without a chat template.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        if system_prompt is not None:
            raise ValueError("system_prompt needs a tokenizer with a chat_template; this tokenizer has none")
        return question
    text = tokenizer.apply_chat_template(
        prompt_messages(question, system_prompt), tokenize=False, add_generation_prompt=True
    )
    assert isinstance(text, str)
    return text

