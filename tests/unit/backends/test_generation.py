"""Generation engines on CPU: vLLM's completions laid out as the torch sampler's batch (vLLM's
own output processing runs in tests/vllm_contract/), the vLLM residency surface over a stand-in
engine (for the sleep/wake bookkeeping only), and the torch engine's weight loads."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.backends.generation import TorchGeneration, VllmState, batch_from_completions
from rltrain.backends.vllm_rollout import Completion
from rltrain.backends.weight_sync.host import pack_to_host
from rltrain.config.schema import RunConfig
from rltrain.errors import WorkerError

EOS, PAD = 1, 0
END = 2  # a generation config's second EOS id (a chat model's end-of-text beside end-of-turn)


def test_completions_become_a_left_padded_prompt_right_padded_response_batch():
    prompts = [[5, 6, 7], [8]]
    completions = [
        [
            Completion((3, EOS), (-0.5, -0.25), "stop"),
            Completion((4, 4, 4), (-1.0, -2.0, -3.0), "length"),
        ],
        [Completion((9, END), (-0.125, -0.0625), "stop"), Completion((EOS,), (-0.75,), "stop")],
    ]
    b = batch_from_completions(prompts, completions, PAD, with_logprobs=True)
    assert b.group_size == 2 and b.size == 4
    assert b.prompt_ids.tolist() == [[5, 6, 7], [5, 6, 7], [PAD, PAD, 8], [PAD, PAD, 8]]
    assert b.prompt_mask.tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 1], [0, 0, 1]]
    # a stop on the generation config's end-of-text id keeps that id and its sampled
    # log-prob; no tokenizer EOS is appended after it
    assert b.response_ids.tolist() == [[3, EOS, PAD], [4, 4, 4], [9, END, PAD], [EOS, PAD, PAD]]
    assert b.response_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]]
    assert b.old_logprobs.tolist() == [
        [-0.5, -0.25, 0.0],
        [-1.0, -2.0, -3.0],
        [-0.125, -0.0625, 0.0],
        [-0.75, 0.0, 0.0],
    ]
    assert b.truncated.tolist() == [False, True, False, False]
    plain = batch_from_completions(prompts, completions, PAD)
    assert plain.old_logprobs is None
    with pytest.raises(WorkerError, match="completions per prompt"):
        batch_from_completions(prompts, [completions[0], completions[1][:1]], PAD)


def test_nothing_is_appended_that_the_engine_did_not_sample():
    # an engine that stopped without returning its stop token: the row ends where the
    # returned tokens end (no EOS the policy would be trained on without having sampled it)
    c = [[Completion((9,), (-0.125,), "stop"), Completion((9, 9), (-0.5, -0.5), "length")]]
    b = batch_from_completions([[8]], c, PAD, with_logprobs=True)
    assert b.response_ids.tolist() == [[9, PAD], [9, 9]]
    assert b.response_mask.tolist() == [[1, 0], [1, 1]]
    assert b.old_logprobs.tolist() == [[-0.125, 0.0], [-0.5, -0.5]]
    assert b.truncated.tolist() == [False, True]
    with pytest.raises(WorkerError, match="0 log-probs for 1 tokens"):
        batch_from_completions([[8]], [[Completion((9,), None, "stop")]], PAD, True)


def test_eos_ids_are_the_tokenizers_and_the_generation_configs(tmp_path):
    from types import SimpleNamespace

    from rltrain.backends.generation import eos_token_ids

    tok = SimpleNamespace(eos_token_id=EOS)
    assert eos_token_ids(tok, None) == (EOS,)
    assert eos_token_ids(tok, str(tmp_path)) == (EOS,)  # no generation_config.json
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [END, EOS]}))
    assert eos_token_ids(tok, str(tmp_path)) == (EOS, END)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": END}))
    assert eos_token_ids(tok, str(tmp_path)) == (EOS, END)


class _Engine:
    """Stands in for VllmRollout's sleep/wake bookkeeping (the real one needs a GPU)."""

    def __init__(self):
        self.asleep = self.weights_asleep = False
        self.calls: list[str] = []

    def sleep(self):
        self.calls.append("sleep")
        self.asleep = self.weights_asleep = True

    def wake_weights(self):
        if self.weights_asleep:
            self.calls.append("wake weights")
            self.weights_asleep = False


def test_vllm_residency_sleeps_and_wakes_the_weights_before_the_cache():
    engine = _Engine()
    state = VllmState(engine, weights_bytes=100, kv_bytes=300)
    assert state.resident_bytes() == {"weights": 100, "kv_cache": 300}
    assert state.offload(["kv_cache"]) == 400  # no KV-only level: the engine sleeps whole
    assert state.offloaded == {"weights", "kv_cache"} and state.host_bytes() == {"weights": 100}
    assert state.reload(["weights", "kv_cache"]) == 100  # the cache waits for the next generate
    assert state.offloaded == {"kv_cache"}
    assert engine.calls == ["sleep", "wake weights"]


def test_torch_engine_loads_host_buckets_by_name():
    run = RunConfig()
    run.model.num_layers = 1
    engine = TorchGeneration(run, torch.device("cpu"))
    other = {n: torch.randn_like(p) for n, p in engine.model.named_parameters()}
    assert engine.load(pack_to_host(list(other.items()), version=3)) == len(other)
    for n, p in engine.model.named_parameters():
        assert torch.equal(p, other[n])


@dataclasses.dataclass(frozen=True)
class _OnDevice(RolloutBatch):
    """The rows of a paused call as the sampler raises them on a GPU model's device: ``to``
    records where they were moved and gives a plain batch."""

    moved: list = dataclasses.field(default_factory=list)

    def to(self, device):
        self.moved.append(torch.device(device))
        return RolloutBatch(
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(RolloutBatch)}
        )


@pytest.mark.parametrize("call", ["generate", "continue_rows"])
def test_a_paused_calls_rows_come_back_on_the_host(call, monkeypatch):
    """A pause (a weight swap, ``trainer.partial_rollout=continue``) raises the rows sampled so
    far on the model's device; the rollout parks and stitches them with host tensors, so the
    engine hands them back on the host, as it does a finished call's."""
    import rltrain.algorithms.sampling as sampling

    run = RunConfig()
    run.model.num_layers = 1
    engine = TorchGeneration(run, torch.device("cpu"))
    moved: list = []
    ids = torch.tensor([[5, 6]])
    rows = _OnDevice(ids, torch.ones_like(ids), ids, torch.ones(1, 2), moved=moved)

    def paused(*args, **kwargs):
        raise sampling.GenerationStopped(rows)

    monkeypatch.setattr(sampling, "generate", paused)
    with pytest.raises(sampling.GenerationStopped) as stop:
        if call == "generate":
            engine.generate(["1+2="], seed=0, should_stop=lambda: False)
        else:
            engine.continue_rows(ids, torch.ones_like(ids), 4, 0, should_stop=lambda: False)
    assert type(stop.value.partial) is RolloutBatch and moved == [torch.device("cpu")]


def test_a_built_model_gets_a_directory_vllm_can_build_it_from():
    import json
    import os

    from rltrain.backends.generation import model_dir_for_vllm, model_weight_bytes
    from rltrain.tasks import build_tokenizer
    from rltrain.tasks.model import build_model

    run = RunConfig()
    run.model.dtype = "bfloat16"
    path = model_dir_for_vllm(run, build_tokenizer(run.model))
    config = json.loads(open(os.path.join(path, "config.json")).read())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "bfloat16"
    assert os.path.isfile(os.path.join(path, "tokenizer.json"))
    params = sum(p.numel() for p in build_model(run.model).parameters())
    assert model_weight_bytes(path, "bfloat16") == 2 * params
