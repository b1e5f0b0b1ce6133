"""What every ``generate`` hands vLLM 0.26.0, checked by vLLM's own code: the sampling
parameters (built and validated by ``SamplingParams``, and through the msgpack encoding an
``EngineCoreRequest`` travels in when vLLM runs its engine core in another process), the seeds
(vLLM seeds NumPy with the engine's), and the prompts (vLLM's prompt parsing)."""

from __future__ import annotations

import pytest
from side import use_vllm

use_vllm()

from vllm import SamplingParams  # noqa: E402
from vllm.renderers.inputs.preprocess import parse_dec_only_prompt, prompt_to_seq  # noqa: E402
from vllm.sampling_params import RequestOutputKind  # noqa: E402
from vllm.utils.torch_utils import set_random_seed  # noqa: E402
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder  # noqa: E402

from rltrain.backends.vllm_rollout import sampling_kwargs, token_prompts, vllm_settings  # noqa: E402
from rltrain.config.schema import RunConfig  # noqa: E402
from rltrain.config.seeds import SEED_SPACE, engine_seed, sampling_seed  # noqa: E402

LARGEST = SEED_SPACE - 1  # the largest `seed` validation accepts


def _params(**over) -> SamplingParams:
    kwargs = dict(
        n=4,
        temperature=1.0,
        top_p=0.9,
        max_new_tokens=16,
        seed=sampling_seed(LARGEST, 10**6, 7),
        logprobs=True,
        stop_token_ids=(1, 2),
    )
    return SamplingParams(**sampling_kwargs(**{**kwargs, **over}))


def test_sampling_params_are_built_and_validated_by_vllm() -> None:
    p = _params()
    assert (p.n, p.temperature, p.top_p, p.max_tokens) == (4, 1.0, 0.9, 16)
    assert p.logprobs == 0 and p.detokenize is False  # the sampled token's log-prob, ids only
    assert p.stop_token_ids == [1, 2] and p.all_stop_token_ids >= {1, 2}
    assert 0 <= p.seed < SEED_SPACE
    # evaluation's greedy call (VllmGeneration.greedy_batch): one completion per prompt, as
    # vLLM requires of greedy sampling
    greedy = _params(n=1, temperature=0.0, top_p=1.0, seed=None, logprobs=False, stop_token_ids=())
    assert greedy.logprobs is None and greedy.stop_token_ids == []
    with pytest.raises(ValueError, match="n must be 1 when using greedy"):
        _params(temperature=0.0)
    with pytest.raises(ValueError):  # vLLM's own argument checks run on what rltrain builds
        _params(top_p=0.0)


def test_sampling_params_cross_vllms_request_encoding_unchanged() -> None:
    greedy = _params(n=1, temperature=0.0, top_p=1.0, seed=None, logprobs=False)
    for p in (_params(), greedy):
        p.output_kind = RequestOutputKind.FINAL_ONLY  # as LLM.generate sets it
        back = MsgpackDecoder(SamplingParams).decode(MsgpackEncoder().encode(p))
        for key in ("n", "temperature", "top_p", "max_tokens", "seed", "logprobs"):
            assert getattr(back, key) == getattr(p, key), key
        assert back.stop_token_ids == p.stop_token_ids and back.detokenize is False


def test_the_engine_seed_of_any_accepted_seed_is_one_vllm_can_seed_with(monkeypatch) -> None:
    from vllm.platforms import current_platform

    seeded: list[int] = []  # the CUDA platform seeds every GPU last; record it here
    monkeypatch.setattr(current_platform, "manual_seed_all", seeded.append)
    run = RunConfig()
    run.rollout.backend, run.seed = "vllm", LARGEST
    seeds = [vllm_settings(run, "/models/policy", (1,), rank).seed for rank in range(8)]
    assert len(set(seeds)) == 8
    for s in seeds:
        set_random_seed(s)  # Python's, NumPy's and torch's generators, as the engine does
    assert seeded == seeds
    # the derivation rltrain used before: NumPy (so vLLM) refuses it
    with pytest.raises(ValueError, match="2\\*\\*32"):
        set_random_seed(LARGEST * 1_000_003 + 3)
    assert engine_seed(LARGEST, 3) == (LARGEST * 1_000_003 + 3) % SEED_SPACE


def test_prompts_are_token_prompts_to_vllms_parser() -> None:
    ids = [[5, 6, 7], [8]]
    prompts = token_prompts(ids)
    seq = prompt_to_seq(prompts)
    assert [parse_dec_only_prompt(p)["prompt_token_ids"] for p in seq] == ids
    assert all(set(p) == {"prompt_token_ids"} for p in seq)  # no text: vLLM loads no tokenizer


def test_a_paused_generations_rows_continue_as_token_prompts_vllm_accepts() -> None:
    # trainer.partial_rollout=continue on vLLM: the rows still decoding go back as their
    # prompt followed by the response so far, unpadded, n=1, with the rest of the budget
    import torch

    from rltrain.algorithms.batch import RolloutBatch
    from rltrain.backends.continuation import continuation_prompts, park
    from rltrain.backends.generation import continuation_token_ids
    from rltrain.config.seeds import continuation_seed

    paused = RolloutBatch(
        prompt_ids=torch.tensor([[0, 5], [6, 7]]),
        prompt_mask=torch.tensor([[0, 1], [1, 1]]),
        response_ids=torch.tensor([[11, 12], [21, 2]]),
        response_mask=torch.tensor([[1.0, 1.0], [1.0, 1.0]]),
        truncated=torch.tensor([True, False]),  # row 1 ended on its EOS (2)
    )
    ids = continuation_token_ids(*continuation_prompts(park(paused, 0, 0)))
    seq = prompt_to_seq(token_prompts(ids))
    assert [parse_dec_only_prompt(p)["prompt_token_ids"] for p in seq] == [[5, 11, 12]]
    seed = continuation_seed(LARGEST, 10**6, 7, 10**6)
    p = _params(n=1, max_new_tokens=16 - 2, seed=seed)
    assert (p.n, p.max_tokens, p.seed) == (1, 14, seed)


def test_rltrain_refuses_the_temperatures_vllm_would_raise() -> None:
    import math

    from vllm import sampling_params as sp

    from rltrain.kinds.vllm import VLLM_MAX_TEMPERATURE, VLLM_MIN_TEMPERATURE, _vllm_settings

    assert sp._MAX_TEMP == VLLM_MIN_TEMPERATURE
    assert SamplingParams(temperature=VLLM_MIN_TEMPERATURE / 2).temperature == VLLM_MIN_TEMPERATURE
    assert SamplingParams(temperature=VLLM_MIN_TEMPERATURE).temperature == VLLM_MIN_TEMPERATURE
    assert SamplingParams(temperature=VLLM_MAX_TEMPERATURE).temperature == VLLM_MAX_TEMPERATURE
    above = math.nextafter(VLLM_MAX_TEMPERATURE, math.inf)
    with pytest.raises(ValueError, match="temperature must be in"):
        SamplingParams(temperature=above)
    # rltrain's config check refuses exactly the temperatures vLLM raises or changes
    run = RunConfig()
    run.rollout.backend = "vllm"
    for value in (VLLM_MIN_TEMPERATURE / 2, VLLM_MIN_TEMPERATURE, VLLM_MAX_TEMPERATURE, above):
        run.rollout.temperature = value
        refused = any("rollout.temperature" in p for p in _vllm_settings(run))
        try:
            kept = SamplingParams(temperature=value).temperature == value
        except ValueError:
            kept = False
        assert refused == (not kept), value


def test_every_sample_of_two_ranks_of_a_step_gets_its_own_seed_from_vllm() -> None:
    """vLLM's ``ParentRequest`` gives sample ``i`` of a prompt its seed; the seeds rltrain
    builds for two ranks of one step never meet (one seed per call, as before, would repeat
    every prompt's seeds, and rank 1's would overlap rank 0's)."""
    from vllm.entrypoints.llm import LLM
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.parallel_sampling import ParentRequest

    from rltrain.backends.vllm_rollout import prompt_sampling_kwargs

    n, prompts = 4, [[5, 6], [7, 8], [5, 6]]  # equal lengths, and a prompt repeated

    def child_seeds(rank: int) -> list[int]:
        kwargs = prompt_sampling_kwargs(
            len(prompts), n=n, temperature=1.0, top_p=1.0, max_new_tokens=8,
            seed=sampling_seed(LARGEST, 5, rank), logprobs=True, stop_token_ids=(1,),
        )  # fmt: skip
        params = [SamplingParams(**k) for k in kwargs]
        # LLM.generate pairs a list of parameters with the prompts one by one
        assert object.__new__(LLM)._params_to_seq(params, len(prompts)) is params
        seeds = []
        for i, (ids, p) in enumerate(zip(prompts, params, strict=True)):
            request = EngineCoreRequest(
                request_id=f"{rank}-{i}", prompt_token_ids=ids, mm_features=None,
                sampling_params=p, pooling_params=None, arrival_time=0.0, lora_request=None,
                cache_salt=None, data_parallel_rank=None, external_req_id=f"{rank}-{i}",
            )  # fmt: skip
            parent = ParentRequest(request)
            seeds += [parent.get_child_info(c)[1].seed for c in range(n)]
        return seeds

    seeds = child_seeds(0) + child_seeds(1)
    assert len(set(seeds)) == len(seeds) == 2 * len(prompts) * n
    assert all(0 <= s < SEED_SPACE for s in seeds)
    assert child_seeds(1) == seeds[len(prompts) * n :]  # the same step and rank: the same seeds
