"""Does every prompt, with the response budget after it, fit the model's context?

A sequence longer than the model's ``max_position_embeddings`` is one the memory plan did not
size (it caps sequences at the context) and positions the model never learned: RoPE models
run on without an error and train on garbage. So before Ray starts the longest prompt of the
task (tokens, chat template applied) plus the response budget is held against the context.

The response budget is ``rollout.max_new_tokens`` for single-turn runs; for multi-turn runs
(``task.env``) ``rollout.max_total_tokens`` (every turn and tool result), or, where that is
null, ``rollout.max_turns x rollout.max_new_tokens``. Tool results are then uncounted here, so
the rollout bounds them itself: an episode whose prompt, turns and tool results reach the
model's context ends there, truncated (:class:`rltrain.agents.interaction.ToolEpisodes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rltrain.placement.memory import checkpoint_dims, response_budget

#: How many prompts are tokenised at once (the bound below skips most of them).
CHUNK = 4096


def model_context(run: Any) -> tuple[int, str]:
    """The model's context in tokens and where it comes from.

    Returns:
        ``(max_position_embeddings, where)``: the ``model`` field for a built model, the
        checkpoint's ``config.json`` for ``model.path``.

    Raises:
        ConfigError: ``model.path`` has no readable ``config.json`` with the sizes.
    """
    m = run.model
    if m.path is None:
        return int(m.max_position_embeddings), "model.max_position_embeddings"
    dims = checkpoint_dims(str(m.path), str(m.dtype))
    return dims.max_position_embeddings, f"max_position_embeddings of model.path={m.path}"


def longest_prompt(prompts: Sequence[str], tokenizer: Any, room: int) -> tuple[int, str] | None:
    """The longest prompt over ``room`` tokens, as generation feeds it, or None if all fit.

    Only prompts that could be over are tokenised: no tokenizer gives a text more tokens than
    its UTF-8 bytes plus the special tokens it adds (the bound the prompt-length check uses).

    Args:
        prompts: the rendered prompt texts.
        tokenizer: the model's tokenizer.
        room: the most tokens a prompt may take.

    Returns:
        ``(tokens, prompt)`` of the longest prompt over ``room``, or None.
    """
    from rltrain.tasks.tokenizer import prompt_token_ids

    try:
        extra = int(tokenizer.num_special_tokens_to_add()) + 1
    except (AttributeError, TypeError, NotImplementedError):
        extra = 4
    maybe = sorted({p for p in prompts if len(p.encode()) + extra > room})
    worst: tuple[int, str] | None = None
    for start in range(0, len(maybe), CHUNK):
        chunk = maybe[start : start + CHUNK]
        for prompt, ids in zip(chunk, prompt_token_ids(tokenizer, chunk), strict=True):
            if len(ids) > room and (worst is None or len(ids) > worst[0]):
                worst = (len(ids), prompt)
    return worst


def context_problems(run: Any, task: Any, tokenizer: Any) -> list[str]:
    """What does not fit the model's context: the longest prompt plus the response budget.

    Args:
        run: a :class:`rltrain.config.schema.RunConfig` whose task built.
        task: the built :class:`rltrain.tasks.base.Task`.
        tokenizer: the model's tokenizer.

    Returns:
        At most one message, naming the keys, the values and the fixes; empty when it fits.

    Raises:
        ConfigError: ``model.path`` has no readable ``config.json``.
    """
    context, where = model_context(run)
    budget, keys = response_budget(run)
    room = context - budget
    if room < 1:
        return [
            f"{keys} leaves no room for a prompt in the model's context of {context} tokens "
            f"({where}): lower the response budget, or use a model with a longer context"
        ]
    prompts = [ex.prompt for ex in (*task.train, *task.eval)]
    worst = longest_prompt(prompts, tokenizer, room)
    if worst is None:
        return []
    tokens, prompt = worst
    return [
        f"the longest prompt is {tokens} tokens ({prompt!r:.60}), and with {keys} a sequence "
        f"reaches {tokens + budget} tokens, over the model's context of {context} ({where}): "
        f"lower the response budget to at most {context - tokens}, shorten or drop the long "
        f"prompts, or use a model with a longer context"
    ]
