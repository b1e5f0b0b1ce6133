"""Supervised fine-tuning: next-token cross-entropy on responses, prompts masked out.

RL post-training starts from a model that already follows the task's format (an instruct or
SFT checkpoint); :func:`supervised_finetune` makes such a starting point from worked examples.
``task.generate=gsm8k_tiny`` uses it to write its base checkpoint, the way a user brings an
instruct model.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

#: Label value the loss ignores (prompt and padding positions).
IGNORE = -100


def sft_batch(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]], pad_token_id: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Pack ``(prompt ids, response ids)`` pairs into one right-padded batch.

    Args:
        pairs: each example's prompt tokens and response tokens (the response ends with EOS
            when the model should learn to stop).
        pad_token_id: fills the padding.

    Returns:
        ``(input_ids, attention_mask, labels)``, each ``[B, T]`` long; ``labels`` equals
        ``input_ids`` on response tokens and :data:`IGNORE` on prompt and padding tokens.

    Raises:
        ValueError: no pairs, or a pair with an empty response.
    """
    if not pairs:
        raise ValueError("sft_batch needs at least one (prompt, response) pair")
    width = max(len(p) + len(r) for p, r in pairs)
    ids = torch.full((len(pairs), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    labels = torch.full((len(pairs), width), IGNORE, dtype=torch.long)
    for i, (prompt, response) in enumerate(pairs):
        if not response:
            raise ValueError(f"pair {i} has an empty response: nothing to learn from it")
        row = [*prompt, *response]
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
        labels[i, len(prompt) : len(row)] = torch.tensor(list(response), dtype=torch.long)
    return ids, mask, labels


def sft_loss(model: torch.nn.Module, ids: Tensor, mask: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy of the labelled tokens given everything before them.

    Args:
        model: a causal LM returning ``.logits`` ``[B, T, V]``.
        ids: ``[B, T]`` input tokens.
        mask: ``[B, T]`` attention mask.
        labels: ``[B, T]`` targets, :data:`IGNORE` where no loss is taken.

    Returns:
        A scalar: the mean over labelled tokens (every token weighs the same).
    """
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    target = labels[:, 1:]
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), ignore_index=IGNORE
    )


def supervised_finetune(
    model: torch.nn.Module,
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    pad_token_id: int,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
    trained: Sequence[Sequence[bool]] | None = None,
) -> list[float]:
    """Train ``model`` in place on random batches of ``pairs`` with AdamW.

    Args:
        model: a causal LM (left in eval mode afterwards).
        pairs: the examples, as for :func:`sft_batch`.
        pad_token_id: the tokenizer's padding id.
        steps: optimizer steps (0: the model is left as it is).
        batch_size: examples per step, drawn without replacement within a step.
        lr: AdamW learning rate (constant).
        seed: which batches, in which order; the caller's global RNG is untouched.
        on_step: called after every step with its number (from 1) and its loss (progress).
        trained: per pair, whether each response token is trained on (None: all are); a tool's
            result in a demonstration is shown to the model but not learned.

    Returns:
        The loss of every step, in order.

    Raises:
        ValueError: ``steps`` or ``batch_size`` out of range, or no pairs.
    """
    if steps < 0 or batch_size < 1:
        raise ValueError(f"steps={steps} must be >= 0 and batch_size={batch_size} >= 1")
    if not pairs:
        raise ValueError("supervised_finetune needs at least one example")
    rng = random.Random(seed)
    pool = list(pairs)  # once: rng.sample needs a sequence, and the pairs do not change
    if trained is not None and [len(k) for k in trained] != [len(r) for _, r in pool]:
        raise ValueError("trained needs one flag per response token of every pair")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    model.train()
    threads = torch.get_num_threads()
    # a model this small gains nothing from a second thread, and on a shared machine two
    # threads waiting on each other ran 30x slower (measured, as calc_tool's supervision)
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            # indices, not pairs: the same draws as sampling the pairs themselves
            picked = rng.sample(range(len(pool)), min(batch_size, len(pool)))
            ids, mask, labels = sft_batch([pool[i] for i in picked], pad_token_id)
            if trained is not None:
                _mask_untrained(labels, [(len(pool[i][0]), trained[i]) for i in picked])
            loss = sft_loss(model, ids, mask, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
            if on_step is not None:
                on_step(len(losses), losses[-1])
    finally:
        torch.set_num_threads(threads)
        model.eval()
    return losses


@contextmanager
def shown_steps(label: str, steps: int, progress: bool) -> Iterator[Callable[[int, float], None]]:
    """A progress bar named ``label`` over ``steps`` steps, yielding the ``on_step`` callback
    of :func:`supervised_finetune` that advances it with each step's loss: the warm starts of
    the generated tasks.

    Args:
        label: what the bar says is happening.
        steps: the steps the bar counts.
        progress: show the bar (``logging.progress``).

    Returns:
        A context manager whose value is the ``on_step`` callback.
    """
    from rltrain.telemetry.progress import StageProgress

    with StageProgress(label, steps, progress) as bar:
        yield lambda _, loss: bar.advance(status=f"loss {loss:.3f}")


def _mask_untrained(labels: Tensor, rows: Sequence[tuple[int, Sequence[bool]]]) -> None:
    """Set :data:`IGNORE` on the response tokens not trained on (``(prompt length, flags)``
    per row of ``labels``)."""
    for i, (start, keep) in enumerate(rows):
        for j, flag in enumerate(keep):
            if not flag:
                labels[i, start + j] = IGNORE
