"""The shared-memory gradient all-reduce between CPU ranks of one host, in real processes.

One gloo world of three spawned ranks runs every scenario once (module fixture); each test
checks its part of what the ranks reported.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from rltrain.backends.deepspeed_engine import free_port
from rltrain.backends.host_allreduce import HostAllReduce, _has_running_stats, _make_file

WORLD = 3
TIMEOUT_S = 120


def _scenarios(rank: int, directory: str) -> dict[str, Any]:
    import torch.distributed as dist

    from rltrain.backends import host_allreduce as ha
    from rltrain.errors import WorkerError

    out: dict[str, Any] = {}
    # 256-byte rows: 100 float32 take two rounds (64 + 36 values), and the rounds alternate
    # between the two regions over the successive calls.
    shared = HostAllReduce.connect(256, TIMEOUT_S, directory=directory)
    out["connected"] = shared is not None
    dist.barrier()  # rank 0 unlinks after the others mapped it: look once it is past that
    out["left_in_dir"] = sorted(os.listdir(directory))
    x = torch.arange(100, dtype=torch.float32) * (rank + 1)  # ranks 1x, 2x, 3x: mean 2x
    out["mean"] = shared.mean_(x).tolist()  # plain values: tensors would cross as fds
    out["repeated"] = [shared.mean_(torch.full((100,), float(rank + k))).tolist() for k in range(4)]
    half = torch.full((10,), 0.5 * (rank + 1), dtype=torch.bfloat16)  # 0.5, 1, 1.5: mean 1
    half = shared.mean_(half)
    out["bf16"] = (str(half.dtype), half.float().tolist())

    # A rank that cannot map the file (another host, another /dev/shm): nobody uses it.
    real_map = ha._map
    if rank == 1:
        ha._map = lambda *a: None
    out["fallback"] = HostAllReduce.connect(256, TIMEOUT_S, directory=directory)
    ha._map = real_map
    dist.barrier()
    out["left_after_fallback"] = sorted(os.listdir(directory))

    # DDP through the hook vs through gloo: the same averaged gradients.
    grads = {}
    for use in (True, False):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        ddp = ha.wrap_data_parallel(model, torch.device("cpu"), TIMEOUT_S, host_allreduce=use)
        out[f"hooked_{use}"] = hasattr(ddp, "_rltrain_host_allreduce")
        torch.manual_seed(100 + rank)  # each rank its own data
        ddp(torch.randn(4, 8)).pow(2).mean().backward()
        grads[use] = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).tolist()
    out["ddp_grads"] = grads

    out.update(_engine_over_ranks(rank))
    dist.barrier()

    # A rank that never arrives: the others raise after the timeout, naming it.
    late = HostAllReduce.connect(64, 0.3, directory=directory)
    if rank != 2:
        try:
            late.mean_(torch.ones(4))
            out["timeout"] = "no error"
        except WorkerError as exc:
            out["timeout"] = str(exc)
    dist.barrier()
    return out


def _engine_over_ranks(rank: int) -> dict[str, float]:
    """The torch engine's update with DDP over the ranks, each holding 2 rows with unequal
    token counts (2, 5 and 8), against one process updating on all 6 rows (rank 0): under
    token_mean both take the gradient of the mean over every token, so the norm each logs (of
    the averaged gradient, before clipping) is the same."""
    from uneven_rows import scored_rows

    from rltrain.backends.training import TorchEngine
    from rltrain.config.schema import ModelConfig, RunConfig
    from rltrain.tasks.model import build_model

    run = RunConfig()
    run.model = ModelConfig(hidden_size=32, intermediate_size=64, init_seed=3)
    run.algorithm.num_minibatches = 1
    batch = scored_rows(run, [1, 1, 2, 3, 4, 4], [1.0, 0.0, 0.0, 1.0, 1.0, 0.0], group_size=2)
    out = {}
    engine = TorchEngine(run, build_model(run.model), torch.device("cpu"), 0)
    engine.setup(WORLD)
    mine = batch.select(torch.arange(2 * rank, 2 * rank + 2))
    out["engine_grad_norm"] = engine.update(mine, torch.Generator().manual_seed(0))[
        "actor/grad_norm"
    ]
    if rank == 0:
        alone = TorchEngine(run, build_model(run.model), torch.device("cpu"), 0)
        alone.setup(1)
        metrics = alone.update(batch, torch.Generator().manual_seed(0))
        out["one_shot_grad_norm"] = metrics["actor/grad_norm"]
    return out


def _rank_main(rank: int, port: int, directory: str, queue: Any) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        queue.put((rank, _scenarios(rank, directory)))
    except BaseException:
        queue.put((rank, {"error": traceback.format_exc()}))
        raise
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    directory = tmp_path_factory.mktemp("shm")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, port, str(directory), queue), daemon=True)
        for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    try:
        got = dict(queue.get(timeout=TIMEOUT_S) for _ in range(WORLD))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    for rank, rep in got.items():
        assert "error" not in rep, f"rank {rank}:\n{rep['error']}"
    assert sorted(os.listdir(directory)) == []
    return got


def test_mean_is_exact_and_identical_on_every_rank(reports: dict[int, dict[str, Any]]) -> None:
    expected = torch.arange(100, dtype=torch.float32) * 2
    for rep in reports.values():
        assert rep["connected"]
        assert rep["mean"] == expected.tolist()
        # ranks hold r + k: the mean is 1 + k, over four calls (both regions, twice each)
        assert rep["repeated"] == [[1.0 + k] * 100 for k in range(4)]
        assert rep["bf16"] == ("torch.bfloat16", [1.0] * 10)


def test_the_file_is_gone_once_every_rank_mapped_it(reports: dict[int, dict[str, Any]]) -> None:
    for rep in reports.values():
        assert rep["left_in_dir"] == []


def test_every_rank_falls_back_when_one_cannot_map(reports: dict[int, dict[str, Any]]) -> None:
    for rep in reports.values():
        assert rep["fallback"] is None
        assert rep["left_after_fallback"] == []


def test_ddp_through_the_hook_averages_as_gloo_does(reports: dict[int, dict[str, Any]]) -> None:
    for rep in reports.values():
        assert rep["hooked_True"] and not rep["hooked_False"]
        hooked, gloo = (torch.tensor(rep["ddp_grads"][k]) for k in (True, False))
        assert torch.allclose(hooked, gloo, atol=1e-6)
    first = reports[0]["ddp_grads"][True]
    assert all(rep["ddp_grads"][True] == first for rep in reports.values())  # replicas agree


def test_the_torch_engine_over_ranks_takes_the_one_shot_gradient(
    reports: dict[int, dict[str, Any]],
) -> None:
    one_shot = reports[0]["one_shot_grad_norm"]
    assert one_shot > 0
    for rank, rep in reports.items():
        assert rep["engine_grad_norm"] == pytest.approx(one_shot, rel=1e-5), rank


def test_a_rank_that_never_arrives_is_named(reports: dict[int, dict[str, Any]]) -> None:
    for rank in (0, 1):
        message = reports[rank]["timeout"]
        assert "rank(s) [2] of 3 did not arrive" in message
        assert "cluster.collective_timeout_s=0.3" in message


def test_buffers_are_broadcast_only_for_running_statistics() -> None:
    from rltrain.config.schema import ModelConfig
    from rltrain.tasks.model import build_model

    assert _has_running_stats(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2)))
    assert not _has_running_stats(torch.nn.BatchNorm1d(2, track_running_stats=False))
    llm = build_model(ModelConfig())
    assert list(llm.buffers()) and not _has_running_stats(llm)  # rotary frequencies: constants


def test_shared_file_size_is_the_header_and_two_regions() -> None:
    # one 64-byte line for the token and one per rank, then two regions of world x row bytes
    assert HostAllReduce.file_bytes(3, 256) == 64 * 4 + 2 * 3 * 256


def test_a_file_whose_maker_died_is_removed_by_the_next_maker(tmp_path) -> None:
    child = mp.get_context("spawn").Process(target=os.getpid)
    child.start()
    child.join()
    dead = tmp_path / f"rltrain-allreduce-{child.pid}-abc"  # killed before its unlink
    alive = tmp_path / f"rltrain-allreduce-{os.getpid()}-def"
    other = tmp_path / "rltrain-allreduce-notapid"
    for f in (dead, alive, other):
        f.write_bytes(b"x")
    path, token = _make_file(str(tmp_path), 4096)
    assert not dead.exists() and alive.exists() and other.exists()
    assert os.path.basename(path).startswith(f"rltrain-allreduce-{os.getpid()}-") and token
