"""Response-length distributions: means, caps, sampling and the config's choice."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics

import pytest

from rltrain.config.schema import RunConfig
from rltrain.whatif import lengths as L


def test_fixed_and_uniform():
    rng = random.Random(0)
    assert L.Fixed(7).sample(rng, 3) == [7, 7, 7]
    assert L.Fixed(7).mean() == 7.0
    u = L.Uniform(1, 9)
    xs = u.sample(rng, 20_000)
    assert min(xs) == 1 and max(xs) == 9
    assert u.mean() == 5.0
    assert statistics.fmean(xs) == pytest.approx(5.0, rel=0.02)


def test_lognormal_mean_and_cap():
    d = L.LogNormal(mean_tokens=100, sigma=1.0, cap=300)
    xs = d.sample(random.Random(1), 50_000)
    assert max(xs) == 300 and min(xs) >= 1
    # the capped mean is below the uncapped 100, and the closed form matches the draws
    assert d.mean() < 100
    assert statistics.fmean(xs) == pytest.approx(d.mean(), rel=0.02)
    # with a cap far above, the mean is the uncapped one
    assert L.LogNormal(100, 0.5, 10**6).mean() == pytest.approx(100, rel=1e-6)


def test_empirical_replays_measured_lengths():
    e = L.empirical([1, 2, 3, 10])
    assert set(e.sample(random.Random(2), 1000)) == {1, 2, 3, 10}
    assert e.mean() == 4.0
    with pytest.raises(ValueError):
        L.empirical([])


def test_expected_max_of_a_batch():
    assert L.expected_max(L.Fixed(5), 8) == 5.0
    # the longest of 2 uniform 1..2 draws is 2 unless both are 1: 1.75
    assert L.expected_max(L.Uniform(1, 2), 2, draws=20_000) == pytest.approx(1.75, abs=0.02)


def test_from_config_picks_the_model_and_caps_at_the_budget():
    run = RunConfig()
    assert L.from_config(run) == L.Fixed(run.rollout.max_new_tokens)
    w = dataclasses.replace(run.whatif, response_length="lognormal", response_length_mean=3.0)
    d = L.from_config(dataclasses.replace(run, whatif=w))
    assert isinstance(d, L.LogNormal) and d.cap == run.rollout.max_new_tokens
    assert d.mean_tokens == 3.0
    w = dataclasses.replace(run.whatif, response_length="uniform")
    assert L.from_config(dataclasses.replace(run, whatif=w)) == L.Uniform(1, 4)


def test_simulated_devices_modelled_lengths_are_the_simulators():
    run = RunConfig()
    sim = dataclasses.replace(run.simulate, response_length_median=8.0)
    d = L.from_config(dataclasses.replace(run, simulate=sim))
    assert d == L.simulated(8.0) and d.cap == 128 and d.sigma == 1.0
    assert d.mu == pytest.approx(math.log(8.0))  # the median is exp(mu)


def test_busy_share_is_the_mean_over_the_expected_longest():
    from rltrain.whatif.lengths import Fixed, busy_share, expected_max, simulated

    assert busy_share(Fixed(16), 8) == 1.0  # every row runs to the budget: nothing idles
    assert busy_share(simulated(8), 1) == 1.0  # one row: its slot is busy to its end
    heavy = simulated(8)
    assert busy_share(heavy, 8) == pytest.approx(heavy.mean() / expected_max(heavy, 8))
    assert busy_share(heavy, 8) < 0.5  # heavy tails: a static batch idles most of its slots
