"""The rollout's host-side rows (``trainer.partial_rollout=continue``'s ended and paused
generations) in the memory ledger: held only while a resume can still ask for them, and host
memory, not device memory, on simulated devices as on GPUs."""

from __future__ import annotations

import dataclasses

import torch

from rltrain.config.schema import RunConfig
from rltrain.workers.common import LEDGER_TOLERANCE_BYTES, HostBuffers, reachable_device_bytes
from rltrain.workers.rollout import RolloutWorker


def test_host_buffers_are_host_memory_on_simulated_devices_only():
    rows = torch.zeros(10)  # 40 bytes
    assert reachable_device_bytes({0: rows}, torch.device("cpu")) == 40
    assert reachable_device_bytes(HostBuffers({0: rows}), torch.device("cpu")) == 0
    # on a real device the walk looks inside: a device tensor kept there is still found
    # (``meta`` stands for a device type other than the CPU)
    kept = torch.zeros(10, device="meta")
    assert reachable_device_bytes(HostBuffers({0: kept}), torch.device("meta")) == 40


def test_continue_holds_ended_rows_only_while_a_resume_can_ask_and_off_the_ledger():
    torch.set_num_threads(1)
    run = RunConfig()
    run = dataclasses.replace(
        run,
        rollout=dataclasses.replace(run.rollout, max_new_tokens=32, n_samples_per_prompt=16),
        trainer=dataclasses.replace(run.trainer, max_staleness=1, partial_rollout="continue"),
    )
    worker = RolloutWorker(run)
    worker.version = 0
    prompts = [f"{a}+{a}=" for a in range(16)]
    held = []
    for step in range(3):
        assert worker.generate(prompts, step) is not None
        held.append(sorted(worker._ended))
    # a call for step s comes at the pipeline's fill of step s - 1 or later (max_staleness=1):
    # steps before s - 1 are trained and never resumed
    assert held == [[0], [0, 1], [1, 2]]
    rows = reachable_device_bytes(list(worker._ended.values()), torch.device("cpu"))
    assert rows > LEDGER_TOLERANCE_BYTES  # past the tolerance: the check below means something
    report = worker.memory_report()  # the rows kept are host memory: nothing undeclared
    assert report["measured"] == report["declared"]
