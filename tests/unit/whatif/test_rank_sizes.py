"""``mode=plan``'s ranking sizes each candidate's null micro-batches for its own layout, as the
same layout set by hand (or chosen by ``placement=auto``) is sized."""

from __future__ import annotations

from composed import composed_run

from rltrain.placement.types import ClusterSpec
from rltrain.runners.layout import decide_for_user
from rltrain.whatif import report
from rltrain.whatif.calibrate import DEFAULT


def _sizes(monkeypatch, sized, unsized) -> dict[str, int]:
    seen: dict[str, int] = {}
    predict = report.predict

    def spy(cand_run, plan, **kwargs):
        where = cand_run.placement.component_placement
        seen[f"{where['actor']}/{where['rollout']}"] = cand_run.actor.micro_batch_size
        return predict(cand_run, plan, **kwargs)

    monkeypatch.setattr(report, "predict", spy)
    rows = report.rank(
        sized, ClusterSpec.from_config(sized.cluster), lambda r, p: True, DEFAULT, unsized
    )
    assert {r.status for r in rows} == {"ok"}
    return seen


def test_each_candidate_gets_the_micro_batch_of_its_own_layout(monkeypatch):
    unsized = composed_run("placement=collocated")  # actor.micro_batch_size: null
    sized, _ = decide_for_user(unsized)
    assert (unsized.actor.micro_batch_size, sized.actor.micro_batch_size) == (None, 64)
    # a device of its own: the actor's largest micro-batch that fits is twice the shared one's
    assert _sizes(monkeypatch, sized, unsized) == {"0-1/0-1": 64, "0/1": 128, "0-1/1": 64}
    # without the unsized run, every candidate keeps the configured layout's
    assert set(_sizes(monkeypatch, sized, None).values()) == {64}
