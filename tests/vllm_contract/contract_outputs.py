"""What vLLM 0.26.0 hands back, made by vLLM's own code, read by rltrain into a rollout batch.

A request goes through vLLM's scheduler rule (``Scheduler._update_request_with_output`` with
``check_stop``: the sampled token is appended, then the stop is checked) and its front end
(``OutputProcessor`` without a tokenizer, as ``skip_tokenizer_init=True`` runs it), one sampled
token per step. The model is the only stand-in: it "samples" a scripted token with a scripted
log-prob. The ``SamplingParams`` are rltrain's, updated with a generation config the way vLLM's
input processor updates them, so vLLM also stops on an EOS id rltrain did not list.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from side import use_vllm

use_vllm()

from vllm import SamplingParams  # noqa: E402
from vllm.sampling_params import RequestOutputKind  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest  # noqa: E402
from vllm.v1.engine.output_processor import OutputProcessor  # noqa: E402
from vllm.v1.outputs import LogprobsLists  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from rltrain.backends.generation import batch_from_completions  # noqa: E402
from rltrain.backends.vllm_rollout import completion_of, sampling_kwargs  # noqa: E402

EOS, END, PAD = 1, 2, 0  # the tokenizer's EOS; a generation config's second EOS id; padding
PROMPT = [5, 6, 7]


def _params(max_new_tokens: int = 4, logprobs: bool = True) -> SamplingParams:
    params = SamplingParams(
        **sampling_kwargs(
            n=1,
            temperature=1.0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            seed=3,
            logprobs=logprobs,
            stop_token_ids=(EOS,),  # rltrain's EOS ids; the checkpoint's config adds END
        )
    )
    # what vLLM's InputProcessor does (no tokenizer: no primary EOS id)
    params.update_from_generation_config({"eos_token_id": [EOS, END]}, None)
    params.output_kind = RequestOutputKind.FINAL_ONLY  # as LLM.generate sets it
    return params


def _generate(params: SamplingParams, sampled: list[tuple[int, float]], max_model_len: int = 64):
    """vLLM's request output when the model samples ``sampled`` (token, log-prob), one a step."""
    request = EngineCoreRequest(
        request_id="r0",
        prompt_token_ids=PROMPT,
        mm_features=None,
        sampling_params=params,
        pooling_params=None,
        arrival_time=0.0,
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
        external_req_id="r0",
    )
    front = OutputProcessor(tokenizer=None, log_stats=False)
    front.add_request(request, prompt=None)
    state = Request.from_engine_core_request(request, block_hasher=None)
    scheduler = SimpleNamespace(max_model_len=max_model_len)
    for token, logprob in sampled:
        new, stopped = Scheduler._update_request_with_output(scheduler, state, [token])
        lps = None
        if params.logprobs is not None:
            lps = LogprobsLists(
                np.array([[token]]), np.array([[logprob]], dtype=np.float32), np.array([0])
            )
        output = EngineCoreOutput(
            request_id="r0",
            new_token_ids=new,
            new_logprobs=lps,
            finish_reason=state.get_finished_reason(),
            stop_reason=state.stop_reason,
        )
        outs = front.process_outputs([output]).request_outputs
        if stopped:
            (out,) = outs
            return out
    raise AssertionError("the request did not finish")


def test_vllm_keeps_the_stop_token_it_sampled_and_rltrain_trains_on_it() -> None:
    on_eos = _generate(_params(), [(9, -0.5), (EOS, -0.25), (4, -9.0)])
    on_end = _generate(_params(), [(9, -0.125), (END, -0.0625)])  # the generation config's
    budget = _generate(_params(max_new_tokens=3), [(4, -1.0), (4, -2.0), (4, -3.0), (EOS, -1.0)])
    c = [completion_of(o.outputs[0], logprobs=True) for o in (on_eos, on_end, budget)]
    assert [x.token_ids for x in c] == [(9, EOS), (9, END), (4, 4, 4)]
    assert [x.finish_reason for x in c] == ["stop", "stop", "length"]
    assert c[0].logprobs == (-0.5, -0.25) and c[1].logprobs == (-0.125, -0.0625)
    assert on_end.outputs[0].stop_reason == END  # a stop_token_ids stop, not the primary EOS

    b = batch_from_completions([PROMPT] * 3, [[x] for x in c], PAD, with_logprobs=True)
    assert b.response_ids.tolist() == [[9, EOS, PAD], [9, END, PAD], [4, 4, 4]]
    assert b.response_mask.tolist() == [[1, 1, 0], [1, 1, 0], [1, 1, 1]]
    assert b.old_logprobs.tolist() == [[-0.5, -0.25, 0.0], [-0.125, -0.0625, 0.0], [-1, -2, -3]]
    assert b.truncated.tolist() == [False, False, True]


def test_the_model_length_also_ends_a_response_as_truncated() -> None:
    # max_model_len reached before max_tokens: vLLM says "length" too
    out = _generate(_params(max_new_tokens=10), [(4, -1.0), (4, -1.0)], max_model_len=5)
    c = completion_of(out.outputs[0], logprobs=True)
    assert c.token_ids == (4, 4) and c.truncated


def test_without_logprobs_the_batch_has_none() -> None:
    out = _generate(_params(logprobs=False), [(9, -0.5), (EOS, -0.25)])
    c = completion_of(out.outputs[0], logprobs=False)
    assert c.logprobs is None and c.token_ids == (9, EOS)
    b = batch_from_completions([PROMPT], [[c]], PAD)
    assert b.old_logprobs is None and b.truncated.tolist() == [False]
    with pytest.raises(Exception, match="log-probs"):
        batch_from_completions([PROMPT], [[c]], PAD, with_logprobs=True)
