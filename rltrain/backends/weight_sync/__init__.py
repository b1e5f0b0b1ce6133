"""Weight sync from the actor to the rollout: bucketed, over the path the placement allows.

- :mod:`.host` — CPU buckets through Ray's object store (any placement, the CPU default).
- :mod:`.ipc` — CUDA IPC handles of device buckets when actor and rollout share GPUs.
- :mod:`.collective` — a bucketed broadcast over a standalone NCCL (GPU) or gloo (CPU) group
  when they live on different devices.

All three share :mod:`.buckets` (layout, pack, unpack, load). Import the submodule you use;
this package imports nothing heavy itself.
"""
