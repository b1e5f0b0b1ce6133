"""The engine rltrain builds, against vLLM 0.26.0's own code: its ``LLM(...)`` arguments are
vLLM's, and with rltrain's environment vLLM keeps the engine core in the rollout process, where
``collective_rpc`` arguments are Python objects. What those arguments would have met in vLLM's
default multiprocess mode is shown with vLLM's own encoder."""

from __future__ import annotations

import dataclasses
import inspect
import os
import typing

import pytest
import torch
from side import ROOT, use_vllm

use_vllm()

from vllm import LLM  # noqa: E402
from vllm.config.model import LogprobsMode  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.v1.engine.core import EngineCoreProc  # noqa: E402
from vllm.v1.engine.core_client import EngineCoreClient, InprocClient, SyncMPClient  # noqa: E402
from vllm.v1.engine.llm_engine import LLMEngine  # noqa: E402
from vllm.v1.executor import Executor  # noqa: E402
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder  # noqa: E402

from rltrain.backends.vllm_rollout import (  # noqa: E402
    ENGINE_ENV,
    WORKER_EXTENSION,
    check_in_process,
    engine_kwargs,
    keep_engine_in_process,
    vllm_settings,
)
from rltrain.backends.weight_sync.host import pack_to_host  # noqa: E402
from rltrain.config.schema import RunConfig  # noqa: E402
from rltrain.errors import ConfigError  # noqa: E402

MP = "VLLM_ENABLE_V1_MULTIPROCESSING"


def _settings(tp: int = 1):
    run = RunConfig()
    run.rollout.backend = "vllm"
    run.rollout.tensor_parallel_size = tp
    run.seed = 2**32 - 1  # the largest seed validation accepts
    return vllm_settings(run, "/models/policy", (1, 2), rank=3)


class _Built(Exception):
    """Stops ``LLMEngine.__init__`` once vLLM has decided how to build the engine."""


@pytest.fixture
def engine_decision(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Run the real ``LLM(...)`` / ``LLMEngine.from_engine_args`` up to the engine: only the
    GPU-bound steps (building the model config on a device, creating the engine) are cut."""
    seen: dict = {}

    def config(self: EngineArgs, usage_context=None, headless: bool = False):
        seen["engine_args"] = self
        return "vllm config"

    def built(self: LLMEngine, **kwargs) -> None:
        seen.update(kwargs)
        raise _Built

    monkeypatch.setattr(EngineArgs, "create_engine_config", config)
    monkeypatch.setattr(Executor, "get_class", staticmethod(lambda cfg: "executor class"))
    monkeypatch.setattr(LLMEngine, "__init__", built)
    monkeypatch.delenv(MP, raising=False)
    return seen


@pytest.mark.parametrize("tp", [1, 2])
def test_the_engine_arguments_are_vllms_own(engine_decision: dict, tp: int) -> None:
    kwargs = engine_kwargs(_settings(tp))
    llm_params = set(inspect.signature(LLM.__init__).parameters)
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    assert set(kwargs) <= llm_params | fields, set(kwargs) - llm_params - fields
    assert kwargs["logprobs_mode"] in typing.get_args(LogprobsMode)
    keep_engine_in_process()
    with pytest.raises(_Built):
        LLM(**kwargs)
    args = engine_decision["engine_args"]
    for key, value in kwargs.items():
        assert getattr(args, key) == value, key
    assert args.worker_extension_cls == WORKER_EXTENSION
    assert args.seed < 2**32  # vLLM seeds NumPy with it (contract_sampling checks NumPy's rule)
    assert args.distributed_executor_backend == ("mp" if tp > 1 else None)


def test_the_gpu_baseline_builds_the_rollouts_engine(engine_decision: dict) -> None:
    """tools/gpu/vllm_engine.py is what the rollout is measured against: the same engine."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "vllm_engine_baseline", ROOT / "tools" / "gpu" / "vllm_engine.py"
    )
    baseline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(baseline)
    kwargs = baseline.baseline_engine_kwargs(
        "/models/policy", max_model_len=300, gpu_memory_utilization=0.3, seed=1, enforce_eager=True
    )
    ours = engine_kwargs(_settings())
    differs = {k for k in set(kwargs) | set(ours) if kwargs.get(k) != ours.get(k)}
    # what the baseline sets on purpose (the qwen2_0_5b GPU runs: bf16, sleeping between
    # steps); every other engine setting is the rollout's
    on_purpose = {"worker_extension_cls", "enforce_eager", "seed", "max_model_len", "dtype"}
    assert differs <= on_purpose | {"enable_sleep_mode"}, differs
    assert kwargs["dtype"] == "bfloat16" and kwargs["enable_sleep_mode"] is True
    assert "worker_extension_cls" not in kwargs and kwargs["load_format"] == "dummy"
    keep_engine_in_process()
    with pytest.raises(_Built):
        LLM(**kwargs)
    assert engine_decision["engine_args"].enforce_eager is True
    assert engine_decision["multiprocess_mode"] is False


def test_rltrain_keeps_the_engine_core_in_the_rollout_process(engine_decision: dict) -> None:
    kwargs = engine_kwargs(_settings())
    # vLLM's default: the engine core in a process of its own, behind a SyncMPClient
    with pytest.raises(_Built):
        LLM(**kwargs)
    assert engine_decision["multiprocess_mode"] is True
    # what the rollout sets before building: vLLM 0.26.0 reads it and stays in-process
    keep_engine_in_process()
    assert os.environ[MP] == ENGINE_ENV[MP] == "0"
    with pytest.raises(_Built):
        LLM(**kwargs)
    assert engine_decision["multiprocess_mode"] is False


def test_in_process_means_an_inproc_client_which_the_rollout_checks(monkeypatch) -> None:
    made: list[str] = []
    monkeypatch.setattr(InprocClient, "__init__", lambda self, *a, **k: made.append("inproc"))
    monkeypatch.setattr(SyncMPClient, "__init__", lambda self, *a, **k: made.append("mp"))
    inproc = EngineCoreClient.make_client(False, False, "vllm config", "executor", False)
    mp = EngineCoreClient.make_client(True, False, "vllm config", "executor", False)
    assert made == ["inproc", "mp"]

    class Llm:
        def __init__(self, client) -> None:
            self.llm_engine = type("Engine", (), {"engine_core": client})()

    check_in_process(Llm(inproc))
    with pytest.raises(ConfigError, match="SyncMPClient, in another process"):
        check_in_process(Llm(mp))


def _utility_call(method: str, *args):
    """An ``LLM.collective_rpc`` as the multiprocess client sends it (``call_utility``), and
    as the engine core reads it back (``generic_decoder``, then ``_convert_msgspec_args``)."""
    message = (0, 1, "collective_rpc", (method, None, args, None))
    frames = MsgpackEncoder().encode(message)
    _, _, name, raw = MsgpackDecoder().decode(frames)
    core = object.__new__(EngineCoreProc)  # the engine-core process reading the call
    return EngineCoreProc._convert_msgspec_args(getattr(core, name), raw)


def test_in_multiprocess_mode_the_weight_payloads_would_not_arrive() -> None:
    """Why the engine core must stay in-process: vLLM's utility-call encoder."""
    weights = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    method, _, (packed,), _ = _utility_call(
        "rltrain_load_host", pack_to_host(list(weights.items()), 4)
    )
    assert method == "rltrain_load_host"
    # the dataclass arrives as a dict, and its tensors as [dtype, shape, buffer] lists
    assert isinstance(packed, dict) and not hasattr(packed, "flats")
    assert not isinstance(packed["flats"][0], torch.Tensor)
    # an IPC handle's rebuild function is refused outright
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    with pytest.raises(TypeError, match="VLLM_ALLOW_INSECURE_SERIALIZATION"):
        _utility_call("rltrain_load_ipc", {0: (rebuild_cuda_tensor, (1, 2))}, {0: 0})
    # plain arguments (a sync group's address) would cross
    method, _, args, _ = _utility_call("rltrain_join_sync", "nccl", "10.0.0.1", 29500, 3, 1, 60.0)
    assert list(args) == ["nccl", "10.0.0.1", 29500, 3, 1, 60.0]


def test_vllm_refuses_exactly_the_engine_lengths_rltrain_refuses() -> None:
    """vLLM's ``ModelConfig`` on the model directory rltrain writes for the built model: the
    engine length rltrain passes (``vllm_settings``) is one vLLM accepts, and rltrain's check
    refuses ``rollout.max_model_len`` exactly where vLLM raises."""
    from vllm.config.model import ModelConfig

    from rltrain.backends.generation import model_dir_for_vllm
    from rltrain.kinds.vllm import length_problems, vllm_context
    from rltrain.tasks import build_tokenizer

    run = RunConfig()
    run.rollout.backend = "vllm"
    run.task.max_prompt_length, run.rollout.max_new_tokens = 40, 8  # 48 of the context's 64
    path = model_dir_for_vllm(run, build_tokenizer(run.model))
    context = vllm_context(run)
    assert context is not None and context[0] == run.model.max_position_embeddings == 64

    def vllm_accepts(length: int) -> bool:
        try:
            built = ModelConfig(
                model=path, max_model_len=length, skip_tokenizer_init=True, dtype="float32"
            )
        except ValueError as exc:
            assert "is greater than the derived max_model_len" in str(exc)
            return False
        assert built.max_model_len == length
        return True

    for length in (48, 63, 64, 65, 100_000):
        run.rollout.max_model_len = length
        longer = any("longer than the model's context" in p for p in length_problems(run, context))
        assert longer == (not vllm_accepts(length)), length
    # left null: task.max_prompt_length + rollout.max_new_tokens, capped at the context
    run.rollout.max_model_len = None
    for prompt, want in ((40, 48), (512, 64)):
        run.task.max_prompt_length = prompt
        length = vllm_settings(run, path, (1,)).max_model_len
        assert length == want and vllm_accepts(length)
