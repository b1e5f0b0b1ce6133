"""Response-length distributions: how many tokens each sampled response has.

A distribution is anything with ``sample(rng, n) -> list[int]`` and ``mean()``
(:class:`LengthModel`); the simulator draws every request's length from it. Three ship
(``whatif.response_length``): :class:`Fixed` (every response runs to the budget), :class:`Uniform`
and :class:`LogNormal` (capped at the budget), and :class:`Empirical` replays lengths measured by
a run. A heavier tail plugs in as one more class and one entry in :data:`MODELS`.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class LengthModel(Protocol):
    """What the simulator asks of a length distribution."""

    def sample(self, rng: random.Random, n: int) -> list[int]: ...

    def mean(self) -> float: ...


@dataclass(frozen=True)
class Fixed:
    """Every response has ``tokens`` tokens."""

    tokens: int

    def sample(self, rng: random.Random, n: int) -> list[int]:
        return [self.tokens] * n

    def mean(self) -> float:
        return float(self.tokens)


@dataclass(frozen=True)
class Uniform:
    """Lengths uniform on ``lo..hi`` (inclusive)."""

    lo: int
    hi: int

    def sample(self, rng: random.Random, n: int) -> list[int]:
        return [rng.randint(self.lo, self.hi) for _ in range(n)]

    def mean(self) -> float:
        return (self.lo + self.hi) / 2


@dataclass(frozen=True)
class LogNormal:
    """Log-normal lengths with mean ``mean_tokens`` (before the cap) and log-spread ``sigma``,
    rounded, at least 1, at most ``cap`` (the response budget)."""

    mean_tokens: float
    sigma: float
    cap: int

    @property
    def mu(self) -> float:
        return math.log(self.mean_tokens) - self.sigma**2 / 2

    def sample(self, rng: random.Random, n: int) -> list[int]:
        """Inverse-CDF draws from a table of :data:`TABLE` quantiles (built once): a large
        cluster draws millions of lengths."""
        table = _quantiles(self.mu, self.sigma, self.cap)
        k, rand = len(table), rng.random
        return [table[int(rand() * k)] for _ in range(n)]

    def mean(self) -> float:
        """The capped mean, by the closed form of a truncated log-normal's partial mean."""
        mu, s, c = self.mu, self.sigma, float(self.cap)
        z = (math.log(c) - mu) / s
        below = self.mean_tokens * _phi(z - s)
        return below + c * (1 - _phi(z))


#: Quantiles a log-normal's sampling table holds.
TABLE = 4096


@functools.lru_cache(maxsize=64)
def _quantiles(mu: float, sigma: float, cap: int) -> tuple[int, ...]:
    """Rounded, capped lengths at the mid-points of ``TABLE`` equal-probability bins."""
    z = statistics.NormalDist()
    return tuple(
        min(cap, max(1, round(math.exp(mu + sigma * z.inv_cdf((i + 0.5) / TABLE)))))
        for i in range(TABLE)
    )


def _phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


@dataclass(frozen=True)
class Empirical:
    """Lengths resampled from measured ones (a profile's, a previous run's)."""

    lengths: tuple[int, ...]

    def sample(self, rng: random.Random, n: int) -> list[int]:
        pool = self.lengths
        return [pool[rng.randrange(len(pool))] for _ in range(n)]

    def mean(self) -> float:
        return sum(self.lengths) / len(self.lengths)


def expected_max(model: LengthModel, n: int, draws: int = 200, seed: int = 0) -> float:
    """The mean of the longest of ``n`` responses (Monte Carlo over ``draws`` batches): a
    static batch decodes until its longest response ends."""
    rng = random.Random(seed)
    return sum(max(model.sample(rng, n)) for _ in range(draws)) / draws


def busy_share(model: LengthModel, n: int) -> float:
    """The share of a static batch's slot-steps that decode: a batch of ``n`` rows decodes until
    its longest ends, so ``mean / E[max of n]``; the rest idles. ``trainer.partial_rollout=carry``
    keeps its slots busy instead, so its calls take about this share of a static batch's
    decoding (the cost model of ``placement=auto``, :mod:`rltrain.autoplace.cost`)."""
    if n <= 1:
        return 1.0
    longest = expected_max(model, n)
    return min(model.mean() / longest, 1.0) if longest > 0 else 1.0


#: ``whatif.response_length`` -> the model for a budget of ``cap`` tokens and the section.
MODELS: dict[str, Callable[[int, Any], LengthModel]] = {
    "max": lambda cap, w: Fixed(cap),
    "uniform": lambda cap, w: Uniform(1, cap),
    "lognormal": lambda cap, w: LogNormal(
        float(getattr(w, "response_length_mean", None) or cap / 2),
        float(getattr(w, "response_length_sigma", 0.8)),
        cap,
    ),
}


#: ``simulate.response_length_median``'s log-normal: its spread and its cap (x the median).
SIM_SIGMA = 1.0
SIM_CAP = 16


def simulated(median: float) -> LogNormal:
    """The heavy-tailed lengths of simulated devices (``simulate.response_length_median``):
    log-normal with this median (tokens), sigma :data:`SIM_SIGMA`, capped at :data:`SIM_CAP`
    x the median."""
    return LogNormal(
        median * math.exp(SIM_SIGMA**2 / 2), SIM_SIGMA, max(1, round(SIM_CAP * median))
    )


def from_config(run: Any) -> LengthModel:
    """The run's response-length model: ``simulate.response_length_median``'s when set (the
    modelled lengths of simulated devices, :func:`simulated`), else ``whatif.response_length``
    (``max`` without the section), capped at ``rollout.max_new_tokens``."""
    median = getattr(getattr(run, "simulate", None), "response_length_median", 0)
    if median:
        return simulated(float(median))
    w = getattr(run, "whatif", None)
    kind = getattr(w, "response_length", "max") if w is not None else "max"
    return MODELS[kind](int(run.rollout.max_new_tokens), w)


def empirical(lengths: Sequence[int]) -> Empirical:
    """An :class:`Empirical` model of measured lengths (at least one)."""
    if not lengths:
        raise ValueError("empirical lengths need at least one measured length")
    return Empirical(tuple(int(x) for x in lengths))
