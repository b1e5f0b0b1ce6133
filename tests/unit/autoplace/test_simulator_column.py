"""placement=auto's what-if column reads whatif.* as mode=plan's ranking does, says what it
predicts, and the ranking's first line says how a cached profile was measured (real composed
configs, a cached profile, no Ray)."""

from __future__ import annotations

import dataclasses

import pytest

from rltrain.autoplace import AutoSettings, choose
from rltrain.autoplace.choose import origin
from rltrain.autoplace.cost import ReasoningCosts, Scaling
from rltrain.autoplace.profile import Profile, profile_key, save_cached
from rltrain.bench.measures.trainer import compose

GEN_HEAVY = ReasoningCosts(
    generate=Scaling(1.2), train=Scaling(0.4), sync=0.02, overhead=0.01, fused_overhead=0.01
)
CALIBRATED = "what-if simulator, calibrated from the same profile (s/step):"


def _choose(tmp_path, *overrides: str, **measured):
    run = compose("placement=auto", *overrides)
    settings = dataclasses.replace(AutoSettings.from_run(run), cache_dir=str(tmp_path / "c"))
    profile = Profile(profile_key(run), "reasoning", GEN_HEAVY, (), created="then", **measured)
    save_cached(settings, profile)
    return choose(run, str(tmp_path), settings)


def _sim(choice) -> dict[str, float]:
    return {r["candidate"]: r["simulated_s_per_step"] for r in choice.ranking}


def test_rank_candidates_false_leaves_the_column_out(tmp_path):
    choice = _choose(tmp_path, "whatif.rank_candidates=false")
    assert "what-if simulator" not in choice.text
    assert set(_sim(choice).values()) == {None}


def test_calibrate_false_simulates_with_the_defaults_and_says_so(tmp_path):
    calibrated = _sim(_choose(tmp_path / "a"))
    choice = _choose(tmp_path / "b", "whatif.calibrate=false")
    assert CALIBRATED not in choice.text
    assert "default calibration (whatif.calibrate=false)" in choice.text
    name = choice.winner.candidate.name
    # calibrated, generation is the profile's 1.2 s; the defaults know nothing of it
    assert calibrated[name] == pytest.approx(1.2, rel=0.05)
    assert _sim(choice)[name] != pytest.approx(calibrated[name], rel=0.05)


def test_hardware_is_named_above_its_column(tmp_path):
    choice = _choose(tmp_path, "whatif.hardware=h100")
    assert CALIBRATED not in choice.text
    assert "what-if simulator on whatif.hardware=h100 (not this cluster" in choice.text


def test_a_cached_profile_says_how_it_was_measured(tmp_path):
    choice = _choose(tmp_path, "placement.auto.profile_steps=3", steps=5, passes=2)
    first = choice.text.splitlines()[0]
    assert "measured with placement.auto.profile_steps=5, placement.auto.profile_passes=2" in first
    assert (
        "not measured again with this run's placement.auto.profile_steps=3, "
        "placement.auto.profile_passes=1 (placement.auto.reprofile=true does that)"
    ) in first
    same = Profile("k", "reasoning", GEN_HEAVY, (), source="cache", steps=5, passes=1)
    assert "not measured again" not in origin(same, AutoSettings())
    back = Profile.from_dict(same.to_dict())
    assert (back.steps, back.passes) == (5, 1)
