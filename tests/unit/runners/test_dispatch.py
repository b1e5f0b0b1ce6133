"""``rollout.dispatch=length_aware``: the length model, the packing and the runner's dispatch
path, with hand-computed values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rltrain.runners.batch_stage import AllRows
from rltrain.runners.dispatch import Dispatcher, LengthModel, pack
from rltrain.runners.stages import ReasoningGroups, ReasoningStages


def test_the_length_model_is_a_moving_average_per_prompt_and_overall():
    m = LengthModel(decay=0.5)
    assert m.expected("a") is None  # nothing seen: nothing expected
    m.observe("a", 4.0)
    m.observe("a", 8.0)  # 0.5 * 4 + 0.5 * 8
    assert m.expected("a") == 6.0
    m.observe("b", 2.0)  # overall: 4, then 6, then 0.5 * 6 + 0.5 * 2
    assert m.expected("b") == 2.0 and m.expected("never seen") == 4.0


def test_pack_is_lpt_with_equal_counts_longest_first():
    # desc: 3 (7), 5 (6), 1 (5), 2 (3), 4 (2), 0 (1); loads r0: 7, 10, 12; r1: 6, 11, 12
    assert pack([1, 5, 3, 7, 2, 6], 2) == [[3, 2, 4], [5, 1, 0]]


def test_pack_fills_unknown_lengths_with_the_known_average():
    # [3, 4, 2, 3]: 1 -> r0, 0 -> r1, 3 -> r1 (3 < 4), 2 -> r0 (the only room left)
    assert pack([None, 4.0, 2.0, None], 2) == [[1, 2], [0, 3]]


def test_pack_with_nothing_known_is_the_in_order_split():
    assert pack([None] * 6, 2) == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="do not split evenly"):
        pack([1.0, 2.0, 3.0], 2)


def test_the_dispatcher_learns_from_the_shards_it_sent():
    d = Dispatcher(group_size=2)
    first = d.split(["a", "b", "c", "d"], 2)
    assert first == [["a", "b"], ["c", "d"]]
    d.sent(["k0", "k1"], first)
    # group means: a 2, b 4, c 2, d 7; nothing was expected yet
    seen = d.observe(["k0", "k1"], [torch.tensor([1, 3, 4, 4]), torch.tensor([2, 2, 6, 8])])
    assert seen == {"rollout/length_groups": 4.0, "rollout/length_known": 0.0}
    # d (7) -> r0, b (4) -> r1, a (2) -> r1, c (2) -> r0
    again = d.split(["a", "b", "c", "d"], 2)
    assert again == [["d", "c"], ["b", "a"]]
    d.sent(["k2", "k3"], again)
    # observed: d 5, c 2, b 4, a 4: errors 2, 0, 0, 2
    seen = d.observe(
        ["k2", "k3", "unknown"], [torch.tensor(v) for v in ([4, 6, 2, 2], [4, 4, 3, 5], [9])]
    )
    assert seen == {
        "rollout/length_groups": 4.0,
        "rollout/length_known": 1.0,
        "rollout/length_error": 1.0,
    }


# ------------------------------------------------------------- through the runner's dispatch
class _Group:
    def __init__(self) -> None:
        self.calls: list[list[tuple]] = []

    def call_each(self, method, args):
        self.calls.append(args)
        n = len(self.calls)
        return SimpleNamespace(refs=[f"call{n}rank{r}" for r in range(len(args))])


def _runner(dispatch: str) -> ReasoningStages:
    """The real :class:`ReasoningStages` dispatch methods on a stand-in state (no Ray)."""
    r = ReasoningStages.__new__(ReasoningStages)
    prompts = ["p0", "p1", "p2", "p3"]
    r.task = SimpleNamespace(sample_batch=lambda i, n: [SimpleNamespace(prompt=p) for p in prompts])
    r.sizes = SimpleNamespace(prompts_per_step=4, prompts_per_rollout_rank=2, rollout_dp=2)
    r.batch_stage, r.hub = AllRows(), SimpleNamespace(handed_to=lambda receiver: None)
    r.g = ReasoningGroups(actor=None, rollout=_Group())  # type: ignore[arg-type]
    r.dispatcher = Dispatcher(group_size=1) if dispatch == "length_aware" else None
    return r


def _sent(r: ReasoningStages) -> list[list[str]]:
    return [args[0] for args in r.g.rollout.calls[-1]]


@pytest.mark.parametrize("dispatch", ["in_order", "length_aware"])
def test_a_generation_sent_again_is_packed_by_the_lengths_seen(dispatch):
    r = _runner(dispatch)
    first = r.submit_generation(0, 0)
    assert _sent(r) == [["p0", "p1"], ["p2", "p3"]]  # nothing known: data order
    lengths = [SimpleNamespace(response_tokens=torch.tensor(v)) for v in ([1, 2], [8, 3])]
    metrics = r.observe_lengths(first.refs, lengths)
    r.submit_generation(0, 0)  # the same prompts (a restarted generation)
    if dispatch == "in_order":
        assert metrics == {} and _sent(r) == [["p0", "p1"], ["p2", "p3"]]
    else:  # p2 (8) -> r0, p3 (3) -> r1, p1 (2) -> r1, p0 (1) -> r0
        assert metrics["rollout/length_groups"] == 4.0
        assert _sent(r) == [["p2", "p0"], ["p3", "p1"]]
