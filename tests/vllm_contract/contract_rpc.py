"""Every ``collective_rpc`` of :class:`~rltrain.backends.vllm_rollout.VllmRollout`, through vLLM
0.26.0's own call path, into rltrain's worker extension on CPU tensors.

- One GPU (the engine core in-process, ``UniProcExecutor``): ``LLM.collective_rpc`` ->
  ``LLMEngine`` -> ``InprocClient`` -> ``EngineCore`` -> ``UniProcExecutor`` -> ``run_method``,
  all vLLM's code: the arguments reach the worker as the very objects the rollout passed.
- Tensor parallel (``MultiprocExecutor``): the arguments are pickled through vLLM's shared-memory
  ``MessageQueue`` to every worker, which looks the method up as its busy loop does.

The worker is the one stand-in: vLLM's GPU worker is an object with ``rank`` and
``model_runner.model``; the model here is a CPU Llama whose ``load_weights`` is vLLM's own
``AutoWeightsLoader`` (vLLM's Llama adds its stacked q/k/v mapping on top, on GPU).
"""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace

import pytest
import torch
from side import use_vllm

use_vllm()

from torch.multiprocessing.reductions import rebuild_cuda_tensor  # noqa: E402
from vllm import LLM  # noqa: E402
from vllm.distributed.device_communicators.shm_broadcast import MessageQueue  # noqa: E402
from vllm.model_executor.models.utils import AutoWeightsLoader  # noqa: E402
from vllm.utils.import_utils import resolve_obj_by_qualname  # noqa: E402
from vllm.v1.engine.core import EngineCore  # noqa: E402
from vllm.v1.engine.core_client import InprocClient  # noqa: E402
from vllm.v1.engine.llm_engine import LLMEngine  # noqa: E402
from vllm.v1.executor.uniproc_executor import UniProcExecutor  # noqa: E402

from rltrain.backends.vllm_rollout import (  # noqa: E402
    WORKER_EXTENSION,
    VllmRollout,
    VllmSettings,
    WeightSyncExtension,
)
from rltrain.backends.weight_sync.buckets import plan_buckets  # noqa: E402
from rltrain.backends.weight_sync.host import pack_to_host  # noqa: E402
from rltrain.backends.weight_sync.ipc import IpcBucket, IpcPayload  # noqa: E402
from rltrain.config.schema import RunConfig  # noqa: E402
from rltrain.errors import ResourceError  # noqa: E402
from rltrain.tasks.model import build_model  # noqa: E402


class _Model(torch.nn.Module):
    """A CPU policy copy with vLLM's ``load_weights`` (``AutoWeightsLoader``)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        run = RunConfig()
        run.model.num_layers = 1
        run.model.init_seed = seed
        self.inner = build_model(run.model)

    def load_weights(self, weights):
        return AutoWeightsLoader(self.inner).load_weights(weights)


class _Worker(WeightSyncExtension):
    """What vLLM's GPU worker gives the extension: ``rank`` and ``model_runner.model``."""

    def __init__(self, rank: int, seed: int = 1) -> None:
        self.rank = rank
        self.model_runner = SimpleNamespace(model=_Model(seed))


def _in_process_llm(worker: _Worker) -> tuple[LLM, list[str]]:
    """vLLM's in-process call chain down to ``worker`` (objects built without their GPU
    start-up; every method on the way is vLLM's)."""
    executor = object.__new__(UniProcExecutor)
    executor.driver_worker = worker
    core = object.__new__(EngineCore)
    core.model_executor = executor
    resets: list[str] = []
    core.scheduler = SimpleNamespace(reset_prefix_cache=lambda *a: resets.append("reset") or True)
    client = object.__new__(InprocClient)
    client.engine_core = core
    engine = object.__new__(LLMEngine)
    engine.engine_core = client
    llm = object.__new__(LLM)
    llm.llm_engine = engine
    return llm, resets


def _rollout(llm: LLM) -> VllmRollout:
    rollout = object.__new__(VllmRollout)
    rollout.settings, rollout.llm = VllmSettings(model_path="/models/policy"), llm
    rollout.asleep = rollout.weights_asleep = False
    return rollout


def _named(seed: int) -> list[tuple[str, torch.Tensor]]:
    return [(n, p.detach().clone()) for n, p in _Model(seed).inner.named_parameters()]


def test_the_extension_is_what_vllm_resolves_and_clashes_with_nothing_of_its_worker() -> None:
    from vllm.v1.worker.gpu_worker import Worker

    assert resolve_obj_by_qualname(WORKER_EXTENSION) is WeightSyncExtension
    # vLLM refuses an extension attribute its worker class already has (worker_base.py)
    ours = [a for a in dir(WeightSyncExtension) if not a.startswith("__")]
    assert ours and not [a for a in ours if hasattr(Worker, a)]


def test_host_weights_reach_the_worker_through_vllms_in_process_path() -> None:
    worker = _Worker(rank=0)
    llm, resets = _in_process_llm(worker)
    new = _named(seed=7)
    loaded = _rollout(llm).load_weights_host(pack_to_host(new, version=3))
    assert loaded == len(new) and resets == ["reset"]  # the prefix cache is reset after
    for (name, want), (_, got) in zip(
        new, worker.model_runner.model.inner.named_parameters(), strict=True
    ):
        assert torch.equal(got, want), name


def _ipc_payload(rank: int, named) -> IpcPayload:
    """A payload as an actor rank publishes it; the handle has the shape ``reduce_tensor``
    gives a CUDA tensor (no GPU here to export one)."""
    bucket = plan_buckets(named, 1 << 30)[0]
    handle = (rebuild_cuda_tensor, (torch.Tensor, (bucket.nbytes,), (1,), 0, torch.UntypedStorage,
              torch.uint8, 0, b"\x01" * 64, bucket.nbytes, 0, False, b"/torch_1", 0, b"\x02" * 64,
              True))  # fmt: skip
    return IpcPayload(rank, f"GPU-{rank}", 5, (IpcBucket(bucket, handle),), None, "rollout")


def test_ipc_payloads_reach_the_worker_as_the_objects_sent(monkeypatch) -> None:
    worker = _Worker(rank=0)
    llm, _ = _in_process_llm(worker)
    payloads = {0: _ipc_payload(0, _named(seed=7))}
    seen = []
    real = WeightSyncExtension.rltrain_load_ipc

    def spy(self, got, rank_map):
        seen.append(got)
        return real(self, got, rank_map)

    monkeypatch.setattr(WeightSyncExtension, "rltrain_load_ipc", spy)
    # the worker reads its payload and goes for the GPU it names: none on this machine
    with pytest.raises(ResourceError, match="GPU GPU-0 is not visible"):
        _rollout(llm).load_weights_ipc(payloads, {0: 0})
    assert seen[0][0] is payloads[0]  # no encoder on the way: the same object


class _TensorParallel:
    """vLLM's executor-to-worker hop with ``tp`` workers: one ``MessageQueue`` broadcast read by
    a thread per worker, which runs the method as ``WorkerProc.worker_busy_loop`` does."""

    def __init__(self, workers: list[_Worker]) -> None:
        self.mq = MessageQueue(len(workers), len(workers), max_chunk_bytes=1 << 20, max_chunks=2)
        handle = self.mq.export_handle()
        self.results: queue.Queue = queue.Queue()
        self.threads = [
            threading.Thread(target=self._serve, args=(handle, w), daemon=True) for w in workers
        ]
        for t in self.threads:
            t.start()
        self.mq.wait_until_ready()

    def _serve(self, handle, worker: _Worker) -> None:
        reader = MessageQueue.create_from_handle(handle, worker.rank)
        reader.wait_until_ready()
        method, args, kwargs, _ = reader.dequeue(timeout=60)
        _close(reader)
        try:
            result = getattr(worker, method)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the busy loop hands errors back as results
            result = exc
        self.results.put((worker.rank, args, result))

    def collective_rpc(self, method: str, args: tuple) -> dict[int, tuple]:
        # vLLM's MultiprocExecutor.collective_rpc enqueues exactly this tuple
        self.mq.enqueue((method, args, {}, None))
        out = {}
        for _ in self.threads:
            rank, got, result = self.results.get(timeout=60)
            out[rank] = (got, result)
        for t in self.threads:
            t.join(timeout=60)
        _close(self.mq)
        return out


def _close(mq: MessageQueue) -> None:
    """Close a queue's sockets now (its zmq context would otherwise hold the process at exit)."""
    mq.shutdown()
    mq.local_socket.context.destroy(linger=0)


def test_tensor_parallel_workers_receive_every_payload_through_vllms_message_queue() -> None:
    new = _named(seed=9)
    workers = [_Worker(rank=0), _Worker(rank=1)]
    host = _TensorParallel(workers).collective_rpc("rltrain_load_host", (pack_to_host(new, 2),))
    assert [host[r][1] for r in (0, 1)] == [len(new), len(new)]  # each worker loads them all
    for w in workers:
        for (name, want), (_, got) in zip(
            new, w.model_runner.model.inner.named_parameters(), strict=True
        ):
            assert torch.equal(got, want), name

    payloads = {0: _ipc_payload(0, new), 1: _ipc_payload(1, new)}
    ipc = _TensorParallel(workers).collective_rpc("rltrain_load_ipc", (payloads, {0: 1, 1: 0}))
    for rank in (0, 1):
        got, result = ipc[rank]
        assert got[0] == payloads  # pickled and back: equal records, the same rebuild function
        assert got[0][0].buckets[0].handle[0] is rebuild_cuda_tensor
        # each worker took the actor rank the map gives it, then looked for that GPU
        assert isinstance(result, ResourceError) and f"GPU-{1 - rank}" in str(result)

    sync = _TensorParallel(workers).collective_rpc(
        "rltrain_receive", (3, 4)
    )  # before joining: the extension says what is missing
    assert all(isinstance(r, AttributeError) for _, r in sync.values())


def _sleeping_llm() -> tuple[LLM, UniProcExecutor, list[tuple]]:
    """vLLM's sleep and wake path (``LLM`` -> ``LLMEngine`` -> ``InprocClient`` ->
    ``EngineCore`` -> the executor's tag bookkeeping), down to the workers' calls, recorded."""
    from vllm.v1.core.sched.interface import PauseState

    calls: list[tuple] = []
    executor = object.__new__(UniProcExecutor)
    executor.is_sleeping, executor.sleeping_tags = False, set()
    executor.collective_rpc = lambda method, timeout=None, args=(), kwargs=None, **kw: (
        calls.append((method, kwargs)) or [0]
    )
    core = object.__new__(EngineCore)
    core.model_executor, core.mm_receiver_cache = executor, None
    pause = {"state": PauseState.UNPAUSED}
    core.scheduler = SimpleNamespace(
        finish_requests=lambda *a: None,
        set_pause_state=lambda s: pause.update(state=s),
        reset_prefix_cache=lambda *a: True,
        has_unfinished_requests=lambda: False,
        reset_encoder_cache=lambda: None,
    )
    client = object.__new__(InprocClient)
    client.engine_core = core
    engine = object.__new__(LLMEngine)
    engine.engine_core, engine.logger_manager = client, None
    engine.renderer = SimpleNamespace(clear_mm_cache=lambda: None)
    llm = object.__new__(LLM)
    llm.llm_engine = engine
    return llm, executor, calls


def test_vllm_ignores_sleep_while_a_tag_sleeps() -> None:
    """The rule :meth:`VllmRollout.sleep` works around: woken weights alone stay awake."""
    llm, executor, calls = _sleeping_llm()
    llm.sleep(level=1)
    llm.wake_up(tags=["weights"])
    assert executor.sleeping_tags == {"kv_cache"}
    calls.clear()
    llm.sleep(level=1)
    assert ("sleep", {"level": 1}) not in calls and executor.sleeping_tags == {"kv_cache"}


def test_weights_woken_alone_really_go_back_to_sleep() -> None:
    """An evaluation's catch-up wakes the weights of ranks that then do not generate; the
    next offload must free them (the memory ledger counts them gone)."""
    from rltrain.backends.generation import VllmState

    llm, executor, calls = _sleeping_llm()
    rollout = _rollout(llm)
    mover = VllmState(rollout, weights_bytes=100, kv_bytes=50)
    assert mover.offload(["weights", "kv_cache"]) == 150
    rollout.wake_weights()  # as receive_versions does
    assert executor.sleeping_tags == {"kv_cache"} and mover.resident_bytes()["weights"] == 100
    calls.clear()
    assert mover.offload(["weights", "kv_cache"]) == 100
    workers = [c for c in calls if c[0] in ("sleep", "wake_up")]
    assert workers == [("wake_up", {"tags": ["kv_cache"]}), ("sleep", {"level": 1})]
    assert executor.is_sleeping and executor.sleeping_tags == {"weights", "kv_cache"}
    rollout.wake_kv_cache()  # the next generate finds the engine whole
    assert not executor.is_sleeping
