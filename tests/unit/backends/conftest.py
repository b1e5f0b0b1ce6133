"""Fixtures for backend tests: DeepSpeed's compiled-op cache and a one-process gloo world."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def torch_extensions_dir() -> pathlib.Path:
    """DeepSpeed JIT-compiles its ops on first use (1-2.5 min on CPU): cache them in the tree.

    ``.torch_extensions`` is gitignored; the first test session compiles, later ones reuse it.
    """
    path = pathlib.Path(
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".torch_extensions"))
    )
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def deepspeed_world(torch_extensions_dir: pathlib.Path) -> Iterator[None]:
    """A world of one gloo process for DeepSpeed, torn down after the module.

    Torn down per module so no other test module inherits a default process group.
    """
    pytest.importorskip("deepspeed")
    import torch.distributed as dist

    from rltrain.backends.deepspeed_engine import init_distributed

    saved = {
        k: os.environ.get(k)
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    init_distributed("gloo")
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
