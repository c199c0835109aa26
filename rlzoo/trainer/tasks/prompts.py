"""Prompts: a question as the string the model is conditioned on, exactly as TRL 1.16 builds it."""

from collections.abc import Mapping
from typing import Any

from transformers import PreTrainedTokenizerBase

__all__ = ["format_prompt", "is_conversational", "prompt_messages", "render_prompt"]


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
        ValueError: ``system_prompt`` given for a tokenizer without a chat template, or a template that fails on
            the messages (one line: e.g. a template that takes no system role, with ``system_prompt``).
    """
    if getattr(tokenizer, "chat_template", None) is None:
        if system_prompt is not None:
            raise ValueError("system_prompt needs a tokenizer with a chat_template; this tokenizer has none")
        return question
    try:
        text = tokenizer.apply_chat_template(
            prompt_messages(question, system_prompt), tokenize=False, add_generation_prompt=True
        )
    except Exception as err:  # the template's own error (jinja2's raise_exception): one line
        hint = "; --system-prompt adds a system message, which this template may not take" if system_prompt else ""
        raise ValueError(f"the model's chat template failed on the task's prompt ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}){hint}") from err
    assert isinstance(text, str)
    return text



def is_conversational(prompt: Any) -> bool:
    """Whether a data set's prompt is in TRL's conversational format (a list of ``{"role", "content"}`` messages)
    rather than the standard one (a string); ``trl.data_utils.is_conversational`` of ``{"prompt": prompt}``."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], Mapping) and "role" in prompt[0]


def render_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str | list[dict[str, Any]],
                  system_prompt: str | None = None) -> str:
    """A data set's prompt as the string the model is conditioned on, as TRL 1.16 renders it.

    A string (TRL's standard format) is used as it is. A list of messages (conversational) gets
    ``system_prompt`` as a first system message when it has none, then the chat template: with
    ``add_generation_prompt`` after a user or tool turn, ``continue_final_message`` after an assistant turn
    (trl/data_utils.py ``apply_chat_template``, "prompt" key).

    Raises:
        ValueError: ``system_prompt`` with a standard-format prompt, a conversational prompt for a tokenizer
            without a chat template, a last message of another role, or a template that fails on the messages (a
            content given as a list of parts says so).
    """
    if not is_conversational(prompt):
        if system_prompt is not None:
            raise ValueError("system_prompt applies to conversational prompts (lists of messages); this data set's "
                             "prompts are strings (TRL's standard format, used as they are)")
        assert isinstance(prompt, str)
        return prompt
    messages = [dict(m) for m in prompt]
    added = system_prompt is not None and not any(m["role"] == "system" for m in messages)
    if added:
        messages.insert(0, {"role": "system", "content": system_prompt})
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("conversational prompts need a tokenizer with a chat_template; this tokenizer has none")
    last = messages[-1]["role"]
    if last not in ("user", "tool", "assistant"):
        raise ValueError(f"the last message of a conversational prompt must be user, tool or assistant, got {last!r}")
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=last != "assistant",
                                             continue_final_message=last == "assistant")
    except Exception as err:  # the template's own error (jinja2, or Python inside it): one line, with the likely cause
        parts = any(not isinstance(m.get("content"), str) for m in messages)
        hint = ("; a message's content is not a string (a list of parts, the multimodal format), which a text "
                "model's template does not take: give each content as a string") if parts else ""
        hint += "; --system-prompt added a system message, which this template may not take" if added else ""
        raise ValueError(f"the model's chat template failed on a conversational prompt ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}){hint}") from err
    assert isinstance(text, str)
    return text
