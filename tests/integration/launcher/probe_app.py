"""A Hydra app for the launcher tests: an rltrain run that reserves its plan's devices in Ray.

It composes rltrain's own primary config (its ``config_path`` is rltrain's configs), joins the
sweep's Ray through ``rltrain.scheduler.Cluster``, reserves the devices its plan uses (a real
placement group), records which physical devices Ray gave it and when, then waits until
``PROBE_PEERS`` jobs hold their devices at the same time (the proof that they ran side by side).
With ``seed=13`` it dies abruptly while holding its devices, leaving the cleanup to Ray.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import hydra

from hydra_plugins.rltrain_launcher.rltrain_search_path import rltrain_config_path
from rltrain.config.store import register_configs

register_configs()

#: ``pkg://rltrain.conf`` installed, the checkout's ``conf/`` directory from a source checkout.
CONFIG_PATH = str(rltrain_config_path()).removeprefix("file://")


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="config")
def main(cfg) -> float:
    from rltrain.config import load_config
    from rltrain.placement.plan import build_plan
    from rltrain.scheduler import Cluster

    run = load_config(cfg)
    probe = pathlib.Path(os.environ["PROBE_DIR"])
    peers = int(os.environ["PROBE_PEERS"])
    job = os.environ["RLTRAIN_SWEEP_JOB"]
    cluster = Cluster.start(run.cluster)  # the launcher's driver is connected: joins that Ray
    try:
        reservation = cluster.reserve(build_plan(run, cluster.spec), timeout_s=30)
        devices = sorted([node, dev] for (node, _), dev in reservation.physical.items())
        record = {
            "start": time.time(),
            "devices": devices,
            "slice": os.environ["RLTRAIN_DEVICE_SLICE"],
        }
        if run.seed == 13:
            os._exit(3)  # no cleanup of ours: Ray must remove the reservation
        (probe / f"{job}.json").write_text(json.dumps(record))
        deadline = time.monotonic() + 60
        while len(list(probe.glob("*.json"))) < peers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(list(probe.glob('*.json')))} of {peers} jobs ran")
            time.sleep(0.05)  # peers are other processes: the file system is the only signal
        record["end"] = time.time()
        (probe / f"{job}.json").write_text(json.dumps(record))
    finally:
        cluster.shutdown()
    return float(len(devices))


if __name__ == "__main__":
    main()
