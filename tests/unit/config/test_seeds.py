"""Every seed derived from ``seed`` / ``task.seed`` is a valid 32-bit seed for every accepted
value (validation accepts ``[0, 2**32)``), and nothing derives one outside rltrain.config.seeds."""

from __future__ import annotations

import inspect
import pathlib
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rltrain.config import seeds
from rltrain.config.seeds import DERIVATIONS, SEED_SPACE

ROOT = pathlib.Path(__file__).resolve().parents[3]

#: The range each argument takes in a run: seeds as validation accepts them, counters and ranks
#: far beyond any real run.
ARGS = {
    "seed": st.integers(0, SEED_SPACE - 1),
    "task_seed": st.integers(0, SEED_SPACE - 1),
    "step": st.integers(0, 2**40),
    "epoch": st.integers(0, 2**40),
    "rank": st.integers(0, 2**20),
    "env_rank": st.integers(0, 2**20),
    "stage": st.integers(0, 2**10),
    "num_stages": st.integers(1, 2**10),
    "envs_per_stage": st.integers(1, 2**16),
    "episodes": st.integers(1, 2**16),
    "version": st.integers(0, 2**16),
    "round_": st.integers(0, 2**10),
    "prompt": st.integers(0, 2**16 - 1),
    "n": st.integers(1, 2**10),
    "part": st.integers(0, 2**10),
    "row": st.integers(0, 2**20),
    "call": st.integers(0, 2**10),
    "turn": st.integers(0, 2**10),
}


def _args(fn) -> st.SearchStrategy[dict[str, int]]:
    return st.fixed_dictionaries({p: ARGS[p] for p in inspect.signature(fn).parameters})


@pytest.mark.parametrize("name", sorted(DERIVATIONS))
def test_every_derived_seed_is_a_32_bit_seed(name: str) -> None:
    fn, room_arg = DERIVATIONS[name]

    @settings(max_examples=300, deadline=None)
    @given(_args(fn), st.sampled_from([0, SEED_SPACE - 1]))
    def check(kwargs: dict[str, int], edge: int) -> None:
        for args in (kwargs, {**kwargs, "seed": edge} if "seed" in kwargs else kwargs):
            value = fn(**args)
            room = args[room_arg] if room_arg else 1
            # what the consumer adds (a vector env's sub-environment i) stays inside too
            assert 0 <= value and value + room - 1 < SEED_SPACE, (name, args, value)
            np.random.seed(value + room - 1)  # NumPy (and vLLM's engine) accept it

    check()


def test_derivations_keep_the_seeds_small_runs_always_had() -> None:
    # wrapping changes nothing below 2**32: runs with small seeds are reproduced exactly
    assert seeds.engine_seed(7, 3) == 7 * 1_000_003 + 3
    assert seeds.sampling_seed(1, 250, 1) == 1_000_003 + 250 * 1_009 + 1
    assert seeds.item_seed(0, 0, 3, 1, 5) == ((3 * 131 + 1) * 100_003) + 5
    assert seeds.env_stage_seed(2, 1, 2, 8, 1) == 2 * 100_003 + (1 * 2 + 1) * 8
    # and the largest accepted seed, which overflowed before, is a seed NumPy takes
    assert seeds.engine_seed(SEED_SPACE - 1, 0) < SEED_SPACE


#: ``seed * <number>``: a derivation written inline instead of in rltrain.config.seeds.
INLINE = re.compile(r"\bseed\s*\*\s*[\d_]+")


def test_no_seed_is_derived_outside_the_seeds_module() -> None:
    # plain_grpo is the baseline loop that imports nothing from rltrain: it spells out
    # epoch_order_seed itself (test_plain_loop checks it agrees, at the largest seed too)
    allowed = {"rltrain/config/seeds.py", "rltrain/bench/plain_grpo.py"}
    found = []
    for path in sorted((ROOT / "rltrain").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in allowed:
            continue
        for no, line in enumerate(path.read_text().splitlines(), 1):
            if INLINE.search(line):
                found.append(f"{rel}:{no}: {line.strip()}")
    assert not found, "derive seeds in rltrain.config.seeds:\n" + "\n".join(found)
