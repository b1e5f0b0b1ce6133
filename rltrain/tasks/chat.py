"""Prompts as the model sees them: a row's prompt rendered with the tokenizer's chat template.

A dataset row's prompt is a string or a list of ``{role, content}`` messages. With a chat
template (``task.chat_template``; by default whenever the tokenizer has one) a string becomes
one user message, ``task.system_prompt`` goes first as a system message (unless the row's
messages start with their own), and the template renders the conversation with the assistant's
generation prompt at the end. Without one, string prompts are used as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rltrain.errors import ConfigError

#: How many bad rows a message lists before it only counts the rest.
MAX_LISTED = 5


def has_chat_template(tokenizer: Any) -> bool:
    """Whether a tokenizer carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def use_chat_template(setting: bool | None, tokenizer: Any, tokenizer_key: str = "") -> bool:
    """Decide ``task.chat_template``.

    Args:
        setting: the config value: True, False, or None (use the template when there is one).
        tokenizer: the model's tokenizer, or None when none was given.
        tokenizer_key: where the tokenizer came from (``model.tokenizer_path='...'``), for
            the message.

    Returns:
        Whether prompts are rendered with the chat template.

    Raises:
        ConfigError: ``task.chat_template=true`` but the tokenizer has no template.
    """
    if setting is None:
        return tokenizer is not None and has_chat_template(tokenizer)
    if setting and (tokenizer is None or not has_chat_template(tokenizer)):
        source = f" ({tokenizer_key})" if tokenizer_key else ""
        raise ConfigError(
            f"task.chat_template=true but the tokenizer{source} has no chat template: use a "
            f"chat checkpoint's tokenizer (model.path or model.tokenizer_path), or set "
            f"task.chat_template=false to feed the prompts as plain text"
        )
    return bool(setting)


def _messages(prompt: Any, system_prompt: str | None) -> list[dict[str, str]] | str:
    """The conversation of one prompt, or a string saying what is wrong with it."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, (list, tuple)) and prompt:
        messages = []
        for m in prompt:
            ok = isinstance(m, dict) and isinstance(m.get("role"), str)
            if not ok or not isinstance(m.get("content"), str):
                return (
                    "a message list must hold {role, content} objects with string values, "
                    f"got {m!r}"
                )
            messages.append({"role": m["role"], "content": m["content"]})
        if messages[-1]["role"] == "assistant":
            return (
                "the last message is the assistant's: an RL prompt ends with the user's turn "
                "(the model writes the assistant's)"
            )
    else:
        return f"the prompt must be a string or a non-empty list of messages, got {prompt!r:.80}"
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def conversation(prompt: Any, system_prompt: str | None = None) -> list[dict[str, str]]:
    """The messages of one prompt, as :func:`render_prompts` renders them with a chat
    template: a string is one user message; ``system_prompt`` goes first unless the prompt's
    messages start with their own.

    Raises:
        ConfigError: the prompt is neither a string nor a list of ``{role, content}``
            messages ending with a turn that is not the assistant's.
    """
    messages = _messages(prompt, system_prompt)
    if isinstance(messages, str):
        raise ConfigError(messages)
    return messages


def render_prompts(
    prompts: Sequence[Any],
    tokenizer: Any,
    chat: bool,
    system_prompt: str | None = None,
    where: Any = None,
) -> list[str]:
    """Render every prompt as the text the model is given.

    Args:
        prompts: each row's prompt: a string or a list of ``{role, content}`` messages.
        tokenizer: the model's tokenizer (its chat template); may be None when ``chat`` is
            False.
        chat: render with the chat template (:func:`use_chat_template`).
        system_prompt: ``task.system_prompt``: a system message put first.
        where: ``where(i)`` names row ``i`` in messages (default ``row i``).

    Returns:
        The rendered prompts, in order.

    Raises:
        ConfigError: every bad row (up to :data:`MAX_LISTED`, then a count): a message list
            without a chat template, a malformed message, a template that fails on the row;
            or ``task.system_prompt`` without a chat template.
    """
    name = where or (lambda i: f"row {i}")
    if not chat:
        if system_prompt:
            raise ConfigError(
                f"task.system_prompt={system_prompt!r:.60} needs a chat template to put it in, "
                f"but prompts are plain text (task.chat_template=false, or the tokenizer has "
                f"none): drop task.system_prompt or use a tokenizer with a chat template"
            )
        bad = [i for i, p in enumerate(prompts) if not isinstance(p, str)]
        return _or_raise(
            list(prompts),
            bad,
            name,
            "the prompt is a list of messages but prompts are not rendered with a chat template "
            "(task.chat_template=false, or the tokenizer has none): use a tokenizer with one, "
            "or give string prompts",
        )
    conversations, problems = [], []
    for i, p in enumerate(prompts):
        conv = _messages(p, system_prompt)
        if isinstance(conv, str):
            problems.append(f"{name(i)}: {conv}")
            conv = [{"role": "user", "content": ""}]  # keeps positions; the run is refused
        conversations.append(conv)
    if problems:
        raise ConfigError(_capped(problems))
    try:  # one call for all rows: the template is compiled once
        return list(
            tokenizer.apply_chat_template(conversations, tokenize=False, add_generation_prompt=True)
        )
    except Exception:  # noqa: BLE001 - find the rows the template refuses, below
        pass
    rendered, problems = [], []
    for i, conv in enumerate(conversations):
        try:
            rendered.append(
                tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
            )
        except Exception as exc:  # noqa: BLE001 - a template's own error, reported per row
            problems.append(
                f"{name(i)}: the tokenizer's chat template refuses this conversation "
                f"({type(exc).__name__}: {exc})"
            )
    if problems:
        raise ConfigError(_capped(problems))
    return rendered


def _or_raise(values: list[Any], bad: list[int], name: Any, text: str) -> list[Any]:
    if bad:
        raise ConfigError(_capped([f"{name(i)}: {text}" for i in bad]))
    return values


def _capped(problems: list[str]) -> list[str]:
    if len(problems) <= MAX_LISTED:
        return problems
    return [*problems[:MAX_LISTED], f"... and {len(problems) - MAX_LISTED} more rows like these"]
