"""The lease plan: the device calls that run rltrain on a lent GPU inside 12 minutes.

A lent GPU machine gives 15 minutes of device time in all (its start, every call, every idle
second between calls), takes at most 64 MiB per call (the working tree and the carried paths
together), runs one command for at most 10 minutes and keeps its files only while it is held:
30 s idle after a call and it is given back (``/work/.library/device/README.md``). This module
holds the plan as data and derives from it what an operator types and what the rehearsal
(``rehearse.py``) checks:

- the steps of ``run.sh`` in the order they run, each with what it needs (bundles, the GPU)
  and its estimated seconds with the plan's short-run switches (measured in the leases of
  2026-11-26 and 2026-11-27 on an H200);
- the bundles to carry, in the order the steps first need them, and their parts assigned to
  calls first fit over the open calls, each call under the tool's 64 MiB less the tree and a
  margin; the steps each call runs (every step in the first call after which the bundles it
  needs are complete: the steps needing ``rest`` only run in the first call while the ``vllm``
  bundle's last parts are still to come), and each call's deadline;
- the exact ``run`` calls (command, carry list, timeout), checked against the tool's limits;
- the time table: the machine's start, each call's transfers and steps, the gaps between calls,
  the give-back, against the plan's 12 minutes (3 of the 15 kept as margin).

    python3 tools/gpu/lease.py [--bundles .gpu_bundle] [--with-fallback] [--json]
    python3 tools/gpu/lease.py record [--bundles .gpu_bundle]     # layout.json from a build

A part too big for the room a call has left is named with the ``bundle.py resplit`` command
that re-cuts it to fit (seconds, no xz rebuild). The parts come from the built bundles'
manifests, or, where they are not built (CI), from ``bundles/layout.json``, the record of the
last build. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

MIB = 1024 * 1024
#: The device tool's limits (``/work/.library/device/README.md``).
TREE_LIMIT_BYTES = 64 * MIB
COMMAND_LIMIT_CHARS = 2000
CARRY_LIMIT_PATHS = 8
CARRY_PATH_LIMIT_CHARS = 200
CALL_LIMIT_S = 600
WARM_WINDOW_S = 30
DEVICE_BUDGET_S = 15 * 60
#: What the plan may spend: the budget less 3 minutes of margin for what the estimates miss.
PLAN_BUDGET_S = 12 * 60
#: The working tree the plan budgets for in every call (2.3 MiB on 2026-11-26, 4.0 MiB on
#: 2026-11-27 with two leases' results): the calls, their deadlines and the README's copy of
#: them stay put while the tree grows within it.
TREE_BUDGET_BYTES = 5 * MIB
#: What a call keeps below the tool's 64 MiB by the files' byte sum, because the tool counts
#: more than that sum. On 2026-11-27 a call of 63.75 MiB by file sizes (a 3.8 MiB tree of
#: ~500 files, a 59.9 MiB part, a manifest) was refused as "larger than 64 MiB", and one of
#: 61.7 MiB passed. Counting each file in whole 4 KiB blocks fits both (the tree adds ~1 MiB:
#: about 64.7 and 62.8 MiB), but the tool does not say how it counts: 2 MiB is kept.
TREE_MARGIN_BYTES = 2 * MIB
#: What $OUT may hand back: files, bytes per file, bytes in all, folders below $OUT.
OUT_LIMIT_FILES = 8
OUT_LIMIT_FILE_BYTES = 16 * MIB
OUT_LIMIT_BYTES = 64 * MIB
OUT_LIMIT_DEPTH = 2
#: run.sh keeps this much of a call's deadline for publishing, and its calls get this much
#: more than their deadline as the tool's timeout.
PUBLISH_S = 15
TIMEOUT_OVER_DEADLINE_S = 30

HERE = Path(__file__).resolve().parent
LAYOUT = HERE / "bundles" / "layout.json"
#: Every bundle build.sh makes (``record`` writes them all to the layout).
BUNDLE_NAMES = ("vllm", "rest", "fallback")
#: The bundle with an older transformers, for when vLLM fails with the machine's. Carried only
#: with ``--with-fallback``: vLLM 0.26.0 ran with the machine's transformers 5.17 in the leases
#: of 2026-11-26 and 2026-11-27, and the plan's two calls have no room for its 5.6 MiB.
FALLBACK = "fallback"


@dataclass(frozen=True)
class Step:
    """One step of ``run.sh`` as the plan sees it.

    ``fixed_s + per_step_s * steps`` is the estimate on the lent GPU with ``VLLM_EAGER=1``,
    from the seconds each step took in the leases of 2026-11-26 and 2026-11-27 (an H200: each
    step's ``seconds`` in ``results/2026-11-2{6,7}-h200/*/results.json``); the rehearsal
    replaces the estimate of a step that needs no GPU by what it measures.
    """

    name: str
    what: str
    needs: tuple[str, ...]
    gpu: bool
    fixed_s: float
    per_step_s: float
    basis: str
    optional: bool = False  # runs only when the call's deadline leaves it room

    def estimate_s(self, steps: int) -> float:
        """Seconds on the GPU machine for a run of ``steps`` training steps."""
        return self.fixed_s + self.per_step_s * steps


#: Every step the plan knows, in the order the plan runs them. The first call runs what needs
#: no bundle or only ``rest`` while the ``vllm`` bundle's parts arrive: the machine report, the
#: host-tensor GPU tests, the plain baseline, fused torch workers. The last runs the vLLM steps,
#: those a lease must not miss first: rltrain's vLLM backend under test, the trainer with vLLM;
#: then the optional ones on what time is left: DeepSpeed (the issue's last priority; it ran to
#: the end on 2026-11-27's H100) and the standalone engine (it ran in both H200 leases).
STEPS: tuple[Step, ...] = (
    Step(
        name="unpack",
        what="stage the carried parts; unpack complete bundles",
        needs=(), gpu=False, fixed_s=10, per_step_s=0,
        basis="measured 0-11 s (11 s for three bundles, 2026-11-26; 4 s rest and fallback, "
        "5 s vllm, 2026-11-27); the rehearsal measures it",
    ),
    Step(
        name="env",
        what="nvidia-smi, versions and import times, declared deps",
        needs=(), gpu=False, fixed_s=13, per_step_s=0,
        basis="measured 9 s (2026-11-26), 11 s (2026-11-27, H200), 13 s (2026-11-27, H100)",
    ),
    Step(
        name="gpu_host",
        what="tests/gpu/test_host_rules_gpu.py: host tensors meeting a model on the GPU",
        needs=(), gpu=True, fixed_s=23, per_step_s=0,
        basis="measured 23 s (2026-11-27, H100): a pytest process, CUDA's start, tiny models",
    ),
    Step(
        name="plain",
        what="the plain single-process loop (HF generate + GRPO update)",
        needs=(), gpu=True, fixed_s=37, per_step_s=7.2,
        basis="measured 64 s (2026-11-26) and 63 s (2026-11-27) for 6 steps on an H200, 80 s "
        "on an H100 (2026-11-27: 7.2 s a step); the first step takes ~30 s of CUDA start-up "
        "and warm-up",
    ),
    Step(
        name="a_fused",
        what="python -m rltrain, fused torch workers",
        needs=("rest",), gpu=True, fixed_s=109, per_step_s=6.4,
        basis="measured 147 s for 6 steps of 6.4 s with the final evaluation on an H100 "
        "(2026-11-27); on an H200 91 s for 6 steps of 5.3 s without it and 129 s for 4 steps "
        "with it on a fresh machine (the evaluation and exit ~12 s, Ray and worker start ~40 s)",
    ),
    Step(
        name="d_deepspeed",
        what="python -m rltrain, DeepSpeed ZeRO-2 offloaded after every stage",
        needs=("rest",), gpu=True, fixed_s=115, per_step_s=8.0,
        basis="measured 163 s for 6 steps of 8.0 s with the final evaluation on an H100 "
        "(2026-11-27); 105 s for 6 steps of 6.6 s on an H200 without it",
        optional=True,
    ),
    Step(
        name="gpu_vllm",
        what="tests/gpu/test_vllm_rollout_gpu.py, test_vllm_continue_gpu.py",
        needs=("vllm",), gpu=True, fixed_s=71, per_step_s=0,
        basis="measured 66 s (2026-11-26), 61 s (2026-11-27, H200), 71 s (2026-11-27, H100): "
        "two eager engine starts",
    ),
    Step(
        name="c_vllm",
        what="python -m rltrain, vLLM rollout, IPC weights, sleep/wake by policy",
        needs=("vllm", "rest"), gpu=True, fixed_s=128, per_step_s=7.3,
        basis="measured 172 s for 6 steps of 7.3 s on an H100 (2026-11-27); on an H200 143 s "
        "for 6 steps of 5.5 s (2026-11-27), 117 s for 4 steps of 8.8 s (2026-11-26, "
        "micro-batch 4): plan, Ray, actor, eager vLLM start ~110 s",
    ),
    Step(
        name="vllm_engine",
        what="standalone vLLM: tokens/s, sleep/wake GB/s",
        needs=("vllm",), gpu=True, fixed_s=100, per_step_s=3.0,
        basis="measured 118 s (2026-11-26), 94 s with its second, seeded pass (2026-11-27)",
        optional=True,
    ),
)  # fmt: skip
STEP_BY_NAME = {s.name: s for s in STEPS}


@dataclass(frozen=True)
class Overheads:
    """The device time a lease spends outside run.sh's steps (estimates; a lease's replies
    calibrate them: ``lease.held_s`` less the commands' ``wall_s``)."""

    #: a fresh machine: held_s less wall_s of a lease's first call was 30 s on 2026-11-26 and
    #: on 2026-11-27 (29 s for that lease's third call, again on a fresh machine), its
    #: transfer included; the margin is 5 s here and that transfer, which the table charges
    #: again (~15 s)
    start_s: float = 35
    transfer_fixed_s: float = 3  # per call, both ways
    transfer_s_per_mib: float = 0.2  # the working tree and carried paths, ~5 MiB/s
    gap_s: float = 20  # reading a reply and sending the next call (must stay < 30 s)
    give_back_s: float = 5  # give_back at once after the last call


@dataclass(frozen=True)
class Part:
    """One file of a bundle, as carried: its path from the repository root and its size."""

    bundle: str
    path: str
    bytes: int


@dataclass(frozen=True)
class Call:
    """One device ``run`` call of the plan."""

    index: int
    carry: tuple[str, ...]
    carried_bytes: int
    steps: tuple[str, ...]
    deadline_s: int
    env: tuple[tuple[str, str], ...]

    @property
    def timeout_s(self) -> int:
        """The tool's ``timeout_s``: the deadline plus room to publish and exit."""
        return min(CALL_LIMIT_S, self.deadline_s + TIMEOUT_OVER_DEADLINE_S)

    def command(self) -> str:
        """The ``command`` string (run in the repository root on the GPU machine)."""
        env = " ".join(f"{k}={v}" for k, v in (("DEADLINE_S", str(self.deadline_s)), *self.env))
        return f"{env} bash tools/gpu/run.sh {' '.join(self.steps)}"

    def as_run_args(self) -> dict:
        """The call as the device tool's ``run`` arguments."""
        return {"command": self.command(), "carry": list(self.carry), "timeout_s": self.timeout_s}


@dataclass(frozen=True)
class Plan:
    """The calls of a lease, with what they were derived from."""

    calls: tuple[Call, ...]
    tree_bytes: int
    steps: int
    overheads: Overheads = field(default_factory=Overheads)


def read_parts(bundles_dir: Path, names: Sequence[str]) -> list[Part]:
    """Every part of the named bundles, manifest first, from their built manifests.

    Raises:
        FileNotFoundError: a named bundle is not built in ``bundles_dir``.
    """
    parts = []
    for name in names:
        manifest_file = bundles_dir / name / "manifest.json"
        manifest = json.loads(manifest_file.read_text())
        base = f".gpu_bundle/{name}"
        parts.append(Part(name, f"{base}/manifest.json", manifest_file.stat().st_size))
        parts += [Part(name, f"{base}/{p['name']}", p["bytes"]) for p in manifest["parts"]]
    return parts


def layout_parts(layout: dict, names: Sequence[str]) -> list[Part]:
    """The same from a recorded layout (``bundles/layout.json``)."""
    parts = []
    for name in names:
        b = layout["bundles"][name]
        parts.append(Part(name, f".gpu_bundle/{name}/manifest.json", b["manifest_bytes"]))
        parts += [Part(name, f".gpu_bundle/{name}/{p['name']}", p["bytes"]) for p in b["parts"]]
    return parts


def tree_bytes(root: Path) -> int:
    """Bytes of what a device call sends besides its carry list: the tracked and the untracked
    but not ignored files of the repository at ``root`` (and ``shared/`` inside it)."""
    return sum(p.stat().st_size for p in tree_files(root) if p.is_file() and not p.is_symlink())


def tree_files(root: Path) -> list[Path]:
    """The files a device call sends from ``root`` besides its carry list."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    files = {root / p for p in out.decode().split("\0") if p}
    shared = root / "shared"
    if shared.is_dir():
        files |= {p for p in shared.rglob("*") if p.is_file()}
    return sorted(files)


def is_manifest(part: Part) -> bool:
    return part.path.endswith("/manifest.json")


def assign_parts(parts: Sequence[Part], capacity: int) -> list[list[Part]]:
    """Parts into calls, first fit over the open calls in the order given (each part into the
    first call it fits, else a new one), each call under ``capacity`` bytes; a bundle's
    manifest travels in every call that carries one of its parts (first, before them).

    Raises:
        ValueError: a single part (with its manifest) does not fit a call: the message gives
            the ``bundle.py resplit`` command that re-cuts its bundle to fit.
    """
    manifests = {p.bundle: p for p in parts if is_manifest(p)}

    def with_manifests(group: list[Part]) -> list[Part]:
        bundles = dict.fromkeys(p.bundle for p in group)
        return [p for b in bundles for p in (manifests[b], *(q for q in group if q.bundle == b))]

    def size(group: list[Part]) -> int:
        return sum(p.bytes for p in with_manifests(group))

    groups: list[list[Part]] = []
    for part in (p for p in parts if not is_manifest(p)):
        fit = next((g for g in groups if size([*g, part]) <= capacity), None)
        if fit is not None:
            fit.append(part)
        elif size([part]) <= capacity:
            groups.append([part])
        else:
            # the most room an open call has left for this bundle's parts (at least 1 MiB),
            # else a whole call's
            free = [capacity - size([*g, replace(part, bytes=0)]) for g in groups]
            best = max([f for f in free if f >= MIB] or [capacity - size([part]) + part.bytes])
            raise ValueError(
                f"{part.path} ({part.bytes / MIB:.1f} MiB) does not fit a call's "
                f"{capacity / MIB:.1f} MiB: re-cut its bundle to the room a call has left: "
                f"python3 tools/gpu/bundle.py resplit {part.path.rsplit('/', 1)[0]} "
                f"--part-size {best // MIB * MIB}"
            )  # fmt: skip
    return [with_manifests(g) for g in groups]


def plan_steps(selected: Sequence[Step], with_fallback: bool = False) -> list[Step]:
    """The steps as planned: with the fallback bundle carried, the vLLM steps need it too
    (``TF_FALLBACK=auto`` retries them with it), so they wait for the call that completes it."""
    if not with_fallback:
        return list(selected)
    return [replace(s, needs=(*s.needs, FALLBACK)) if "vllm" in s.needs else s for s in selected]


def bundle_order(steps: Sequence[Step]) -> tuple[str, ...]:
    """The bundles the steps need, in the order the steps first need them."""
    return tuple(dict.fromkeys(b for s in steps for b in s.needs))


def carry_list(parts: Sequence[Part], all_parts: Sequence[Part]) -> tuple[str, ...]:
    """The carry paths of one call: a bundle's folder when the call carries all of it, else
    its manifest and parts one by one."""
    out = []
    for bundle in dict.fromkeys(p.bundle for p in parts):
        mine = {p.path for p in parts if p.bundle == bundle}
        every = {p.path for p in all_parts if p.bundle == bundle}
        if mine == every:
            out.append(f".gpu_bundle/{bundle}")
        else:
            out += sorted(mine)
    return tuple(out)


def place_steps(
    groups: Sequence[Sequence[Part]], all_parts: Sequence[Part], steps: Sequence[Step]
) -> list[list[Step]]:
    """Each step into the first call after which the bundles it needs are complete; steps
    needing no bundle into the first call; optional steps into the last call, after its own
    (they run on what its deadline leaves). Within a call, steps keep their order.

    Args:
        groups: the parts each call carries (:func:`assign_parts`).
        all_parts: every part of the carried bundles.
        steps: the steps to run, in order (``unpack`` goes into every call).

    Returns:
        The steps of each call.

    Raises:
        ValueError: a step needs a bundle no call carries.
    """
    complete_after: dict[str, int] = {}
    for bundle in dict.fromkeys(p.bundle for p in all_parts):
        complete_after[bundle] = max(
            i for i, g in enumerate(groups) if any(p.bundle == bundle for p in g)
        )
    placed: list[list[Step]] = [[] for _ in groups]
    for step in steps:
        if step.name == "unpack":
            for call in placed:
                call.append(step)
            continue
        missing = [b for b in step.needs if b not in complete_after]
        if missing:
            raise ValueError(f"step {step.name} needs bundle(s) {missing}, which no call carries")
        if not step.optional:
            placed[max((complete_after[b] for b in step.needs), default=0)].append(step)
    placed[-1] += [s for s in steps if s.optional]
    return placed


def make_plan(
    parts: Sequence[Part],
    tree: int,
    steps: int = 6,
    selected: Sequence[Step] = STEPS,
    overheads: Overheads = Overheads(),
    capacity: int | None = None,
    with_fallback: bool = False,
) -> Plan:
    """The calls: parts assigned, steps placed, deadlines set.

    Args:
        parts: the parts of the bundles (``read_parts``/``layout_parts``): those the steps
            need are carried, in the order the steps first need them; others are left out.
        tree: bytes of the working tree every call sends (the plan's budget for it,
            :data:`TREE_BUDGET_BYTES`, for the published calls).
        steps: training steps of every run (the ``STEPS`` switch).
        selected: the steps to run, in the order they run.
        overheads: the device time outside the steps.
        capacity: bytes of parts a call may carry (default: the tool's limit less the tree
            and :data:`TREE_MARGIN_BYTES`).
        with_fallback: carry the fallback bundle too (before the vLLM steps run).

    Returns:
        The plan. Every call but the last gets the sum of its steps' estimates (plus the time
        run.sh keeps to publish) as its deadline; the last gets what is left of the 12
        minutes, up to the tool's 10 minutes a command.

    Raises:
        ValueError: a part does not fit a call (the message says how to re-cut it), or a
            step needs a bundle of which ``parts`` holds nothing.
    """
    selected = plan_steps(selected, with_fallback)
    order = bundle_order(selected)
    parts = sorted((p for p in parts if p.bundle in order), key=lambda p: order.index(p.bundle))
    room = TREE_LIMIT_BYTES - tree - TREE_MARGIN_BYTES if capacity is None else capacity
    groups = assign_parts(parts, room)
    placed = place_steps(groups, parts, selected)
    base_env = (("STEPS", str(steps)), ("VLLM_EAGER", "1"))
    calls = []
    spent = overheads.start_s + overheads.give_back_s + overheads.gap_s * (len(groups) - 1)
    for i, (group, call_steps) in enumerate(zip(groups, placed, strict=True)):
        # what earlier calls carried is gone if this call finds a fresh machine: say so at once
        earlier = ",".join(dict.fromkeys(p.bundle for g in groups[:i] for p in g))
        env = base_env + ((("STOP_WITHOUT", earlier),) if earlier else ())
        carried = sum(p.bytes for p in group)
        spent += transfer_s(tree + carried, overheads)
        if i < len(groups) - 1:
            own = sum(s.estimate_s(steps) for s in call_steps if not s.optional) + PUBLISH_S
            deadline = int(own + 0.999)
            spent += deadline
        else:
            deadline = int(PLAN_BUDGET_S - spent)
            deadline = min(deadline, CALL_LIMIT_S - TIMEOUT_OVER_DEADLINE_S)
        carry = carry_list(group, parts)
        calls.append(Call(i + 1, carry, carried, tuple(s.name for s in call_steps), deadline, env))
    return Plan(tuple(calls), tree, steps, overheads)


def recovery_text(plan: Plan) -> str:
    """The call to make when a call stops for want of what earlier calls carried (exit status
    3: the next call came after the 30 s and found a fresh machine): it carries those parts
    again and runs the stopped call's steps; the stopped call's own parts stay staged on the
    machine, now warm. ``D`` is the device time left (``budget_left_s`` of the reply) less a
    minute, at most 570."""
    lines = []
    for call in plan.calls:
        stop = dict(call.env).get("STOP_WITHOUT")
        if not stop:
            continue
        bundles = stop.split(",")
        carry = [
            c for earlier in plan.calls[: call.index - 1] for c in earlier.carry
            if any(c.startswith(f".gpu_bundle/{b}") for b in bundles)
        ]  # fmt: skip
        env = " ".join(f"{k}={v}" for k, v in call.env if k != "STOP_WITHOUT")
        command = f"DEADLINE_S=D {env} bash tools/gpu/run.sh {' '.join(call.steps)}"
        lines.append(
            f"- call {call.index} stopped: `run(command={json.dumps(command)}, "
            f"carry={json.dumps(list(dict.fromkeys(carry)))}, timeout_s=D+30)`"
        )
    return "\n".join(lines)


def transfer_s(nbytes: int, overheads: Overheads) -> float:
    """Estimated seconds to send a call's tree and carry list and bring $OUT back."""
    return overheads.transfer_fixed_s + overheads.transfer_s_per_mib * nbytes / MIB


def check_call(call: Call, tree: int) -> list[str]:
    """What in one call breaks the device tool's limits (empty: nothing)."""
    problems = []
    if len(call.command()) > COMMAND_LIMIT_CHARS:
        problems.append(f"call {call.index}: command of {len(call.command())} characters")
    if len(call.carry) > CARRY_LIMIT_PATHS:
        problems.append(f"call {call.index}: {len(call.carry)} carry paths")
    problems += [
        f"call {call.index}: carry path of {len(p)} characters"
        for p in call.carry
        if len(p) > CARRY_PATH_LIMIT_CHARS
    ]
    problems += size_problems(call.index, tree + call.carried_bytes)
    if call.timeout_s > CALL_LIMIT_S:
        problems.append(f"call {call.index}: timeout {call.timeout_s} s")
    return problems


def size_problems(index: int, nbytes: int) -> list[str]:
    """A call of ``nbytes`` by its files' sizes against the tool's 64 MiB less the margin."""
    if nbytes + TREE_MARGIN_BYTES <= TREE_LIMIT_BYTES:
        return []
    return [
        f"call {index}: {nbytes / MIB:.2f} MiB travels by its files' sizes, over the "
        f"{(TREE_LIMIT_BYTES - TREE_MARGIN_BYTES) / MIB:.0f} MiB a call may send (the tool "
        f"counts more than the files' bytes: it refused 63.75 MiB as over 64 MiB)"
    ]


@dataclass(frozen=True)
class Row:
    """One line of the time table."""

    call: int  # 0: outside the calls
    item: str
    seconds: float
    basis: str  # "estimate" | "measured" | "deadline" | ...
    runs: bool = True  # False: a step the deadline leaves no room for


def table(plan: Plan, measured: dict[tuple[int, str], float] | None = None) -> list[Row]:
    """The plan's device time, line by line; ``measured`` replaces an estimate by
    ``(call, item)``. A call's steps are cut at its deadline: those that would start without
    their estimate's room are listed as not running."""
    measured = measured or {}
    o = plan.overheads
    rows = [Row(0, "start a machine", o.start_s, "estimate")]
    for call in plan.calls:
        nbytes = plan.tree_bytes + call.carried_bytes
        key = (call.index, "transfer")
        rows.append(
            Row(
                call.index,
                f"send {nbytes / MIB:.1f} MiB, return $OUT",
                measured.get(key, transfer_s(nbytes, o)),
                _basis(key, measured),
            )
        )
        used = 0.0
        for name in call.steps:
            step = STEP_BY_NAME[name]
            key = (call.index, name)
            secs = measured.get(key, step.estimate_s(plan.steps))
            fits = used + secs <= call.deadline_s - PUBLISH_S
            rows.append(Row(call.index, f"{name}: {step.what}", secs, _basis(key, measured), fits))
            used += secs if fits else 0
        if call.index < len(plan.calls):
            rows.append(Row(call.index, "gap before the next call (< 30 s)", o.gap_s, "estimate"))
    rows.append(Row(0, "give the machine back", o.give_back_s, "estimate"))
    return rows


def _basis(key: tuple[int, str], measured: dict) -> str:
    return "measured (rehearsal)" if key in measured else "estimate"


def total_s(rows: Sequence[Row]) -> float:
    """The device time of a table: every row that runs."""
    return sum(r.seconds for r in rows if r.runs)


def markdown_table(plan: Plan, rows: Sequence[Row]) -> str:
    """The table as Markdown, with the total against the plan's budget."""
    lines = ["| call | what | s | basis |", "| --- | --- | --- | --- |"]
    for r in rows:
        what = r.item if r.runs else f"~~{r.item}~~ (no room left: skipped by its deadline)"
        lines.append(f"| {r.call or '-'} | {what} | {r.seconds:.0f} | {r.basis} |")
    total = total_s(rows)
    lines.append(
        f"| | **total** | **{total:.0f}** | of {PLAN_BUDGET_S} (12 min; 15 min less 3 of margin) |"
    )
    return "\n".join(lines)


def run_calls_text(plan: Plan) -> str:
    """The calls as an operator types them: one numbered line each."""
    return "\n".join(
        f"{c.index}. `run(command={json.dumps(c.command())}, carry={json.dumps(list(c.carry))}, "
        f"timeout_s={c.timeout_s})`"
        for c in plan.calls
    )


def load_parts(bundles_dir: Path, names: Sequence[str]) -> tuple[list[Part], str]:
    """The parts of the named bundles as built, else as recorded, and which it was."""
    try:
        return read_parts(bundles_dir, names), f"built bundles in {bundles_dir}"
    except FileNotFoundError:
        layout = json.loads(LAYOUT.read_text())
        return layout_parts(layout, names), f"recorded layout {LAYOUT.name}"


def record(bundles_dir: Path, machine: str) -> dict:
    """``bundles/layout.json`` from the built bundles' manifests."""
    out: dict = {"date": time.strftime("%Y-%m-%d"), "machine": machine, "bundles": {}}
    for name in BUNDLE_NAMES:
        f = bundles_dir / name / "manifest.json"
        if not f.is_file():
            continue
        m = json.loads(f.read_text())
        out["bundles"][name] = {
            "manifest_bytes": f.stat().st_size,
            "part_size_limit": m["part_size_limit"],
            "parts": [{"name": p["name"], "bytes": p["bytes"]} for p in m["parts"]],
            "archive_bytes": m["archive_bytes"],
            "unpacked_bytes": m["unpacked_bytes"],
            "files": m["files"],
            "contents": m["contents"],
            "trimmed_bytes": sum(t["bytes"] for t in m.get("trimmed", [])),
            "pack_seconds": m["pack_seconds"],
            **({"resplit_from": m["resplit_from"]} if "resplit_from" in m else {}),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="?", default="show", choices=("show", "record"))
    ap.add_argument("--bundles", type=Path, default=Path(".gpu_bundle"))
    ap.add_argument("--repo", type=Path, default=HERE.parents[1])
    ap.add_argument("--steps", type=int, default=6, help="training steps of every run")
    ap.add_argument("--machine", default="2-core 24 GiB CPU VM", help="record: built where")
    ap.add_argument(
        "--with-fallback",
        action="store_true",
        help="carry the fallback bundle (an older transformers) too",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.what == "record":
        LAYOUT.write_text(json.dumps(record(args.bundles, args.machine), indent=1) + "\n")
        print(f"wrote {LAYOUT}")
        return 0
    names = bundle_order(plan_steps(STEPS, args.with_fallback))
    parts, source = load_parts(args.bundles, names)
    try:
        plan = make_plan(parts, TREE_BUDGET_BYTES, args.steps, with_fallback=args.with_fallback)
    except ValueError as exc:
        print(f"parts from the {source}\nPROBLEM: {exc}")
        return 1
    rows = table(plan)
    problems = [p for c in plan.calls for p in check_call(c, plan.tree_bytes)]
    tree = tree_bytes(args.repo)
    if tree > TREE_BUDGET_BYTES:
        problems.append(
            f"the working tree is {tree / MIB:.1f} MiB, over the plan's "
            f"{TREE_BUDGET_BYTES / MIB:.0f} MiB: raise TREE_BUDGET_BYTES and rebuild with a "
            f"smaller --part-size"
        )
    if total_s(rows) > PLAN_BUDGET_S:
        problems.append(f"the plan needs {total_s(rows):.0f} s, more than {PLAN_BUDGET_S} s")
    if args.json:
        print(
            json.dumps(
                {
                    "calls": [c.as_run_args() for c in plan.calls],
                    "rows": [asdict(r) for r in rows],
                    "problems": problems,
                },
                indent=1,
            )
        )
    else:
        print(
            f"parts from the {source}; the working tree is {tree / MIB:.1f} MiB of the "
            f"{TREE_BUDGET_BYTES / MIB:.0f} MiB budgeted\n"
        )
        print(run_calls_text(plan) + "\n")
        print(markdown_table(plan, rows))
        for p in problems:
            print(f"PROBLEM: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
