"""One sweep job's driver: a fresh process running Hydra's ``run_job`` for one job.

Started by the launcher as ``python -m hydra_plugins.rltrain_launcher._driver SPEC RESULT``.
A fresh process per job because ``run_job`` changes the working directory, logging and Hydra's
global state, and because a job that connects to Ray is then its own Ray job: when this process
exits, Ray removes every actor and placement group the job created, even after a crash (Ray scopes
placement groups to the driver; a task or actor hosting the job would leave them behind).

The spec file holds ``(header, payload)``: the header is plain pickle (the launcher's
``sys.path``, working directory, Ray address and namespace) so that the payload (cloudpickled
Hydra context, job config, task function and Hydra singletons) can find the user's modules.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import traceback
from typing import Any

log = logging.getLogger(__name__)


def _send_back(ret: Any, path: str) -> None:
    """Pickle the JobReturn to ``path`` atomically, replacing what cannot travel."""
    import cloudpickle
    from hydra.core.utils import JobStatus

    from rltrain.errors import WorkerError

    try:
        data = cloudpickle.dumps(ret)
    except Exception as exc:  # noqa: BLE001 - any pickling failure is reported the same way
        value = ret._return_value
        if ret.status == JobStatus.FAILED:
            ret.return_value = WorkerError(f"{type(value).__name__}: {value}")
        else:
            ret.status = JobStatus.FAILED
            ret.return_value = WorkerError(
                f"the task function returned a {type(value).__name__} that cannot be sent back "
                f"to the launcher ({exc}): return a float, a dict or None"
            )
        data = cloudpickle.dumps(ret)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def _log_failure(num: Any, exc: BaseException) -> None:
    """Show why job ``num`` failed, here, where the job's log captures it.

    A refusal (an :class:`~rltrain.errors.RltrainError`: bad input, found before the job's Ray
    work) is shown as its message alone, as a single run shows it; anything else with its
    traceback, which does not survive pickling back to the launcher.
    """
    from rltrain.errors import RltrainError, WorkerError

    if isinstance(exc, RltrainError) and not isinstance(exc, WorkerError):
        log.error("job #%s refused: %s", num, exc)
    else:
        log.error("job #%s failed:\n%s", num, "".join(traceback.format_exception(exc)))


def run(spec_path: str, result_path: str) -> int:
    """Run the job described by ``spec_path`` and write its JobReturn to ``result_path``.

    Returns:
        The process exit code: 0 when a JobReturn was written (even for a failed job).
    """
    with open(spec_path, "rb") as f:
        header, payload = pickle.load(f)
    # The launcher's module path first, so the task function's modules import as they did there.
    sys.path[:] = [*header["sys_path"], *(p for p in sys.path if p not in header["sys_path"])]
    os.chdir(header["cwd"])
    import cloudpickle
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobStatus, run_job, setup_globals

    job = cloudpickle.loads(payload)
    if header["ray_address"]:
        import ray

        ray.init(
            address=header["ray_address"],
            namespace=header["namespace"],
            runtime_env=header["runtime_env"] or None,
            logging_level=logging.WARNING,
        )
    setup_globals()
    Singleton.set_state(job["singleton_state"])
    HydraConfig.instance().set_config(job["sweep_config"])
    ret = run_job(
        hydra_context=job["hydra_context"],
        task_function=job["task_function"],
        config=job["sweep_config"],
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )
    if ret.status == JobStatus.FAILED:
        _log_failure(job["sweep_config"].hydra.job.num, ret._return_value)
    _send_back(ret, result_path)
    if header["ray_address"]:
        import ray

        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1], sys.argv[2]))
