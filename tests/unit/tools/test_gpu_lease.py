"""tools/gpu/lease.py (the lease plan) and rehearse.py (its rehearsal on a CPU stand-in).

The plan is checked against the device tool's limits and the 12 minutes on the recorded layout
of the real bundles; the rehearsal runs a two-call plan of tiny bundles through the real
run.sh, unpack.sh and collect.py on a local stand-in: the calls' files as the tool sends them,
the machine's files kept between calls only within the 30 s it stays warm, a cut-off call's
results, and a call over the 64 MiB refused before it runs.
"""

from __future__ import annotations

import json
import sys

import pytest
from tiny_bundles import GPU_TOOLS, PART, ROOT

sys.path.insert(0, str(GPU_TOOLS))
import lease  # noqa: E402  (tools/gpu is not a package)
import rehearse  # noqa: E402

S = lease.STEP_BY_NAME


def real_plan(with_fallback: bool = False) -> lease.Plan:
    names = lease.bundle_order(lease.plan_steps(lease.STEPS, with_fallback))
    parts = lease.layout_parts(json.loads(lease.LAYOUT.read_text()), names)
    return lease.make_plan(parts, lease.TREE_BUDGET_BYTES, with_fallback=with_fallback)


def test_the_plan_fits_the_tool_and_12_minutes_and_runs_rays_steps_while_vllm_arrives():
    plan = real_plan()
    assert [p for c in plan.calls for p in lease.check_call(c, plan.tree_bytes)] == []
    assert lease.total_s(lease.table(plan)) <= lease.PLAN_BUDGET_S
    assert lease.tree_bytes(ROOT) <= lease.TREE_BUDGET_BYTES
    for call in plan.calls:  # every call keeps the margin below the tool's 64 MiB
        assert plan.tree_bytes + call.carried_bytes + lease.TREE_MARGIN_BYTES <= 64 * lease.MIB
    first, last = plan.calls
    # call 1: the bundles the Ray-only steps need and as much of vllm as fits, and those steps
    assert first.carry == (".gpu_bundle/rest", ".gpu_bundle/vllm/manifest.json",
                           ".gpu_bundle/vllm/vllm.tar.xz.000")  # fmt: skip
    assert first.steps == ("unpack", "env", "gpu_host", "plain", "a_fused")
    # the last call: the rest of vllm, the vLLM steps a lease must not miss first, then the
    # optional steps on what is left (DeepSpeed needs only rest, unpacked by call 1)
    assert last.carry[0] == ".gpu_bundle/vllm/manifest.json"
    assert all(c.startswith(".gpu_bundle/vllm/vllm.tar.xz.") for c in last.carry[1:])
    assert last.steps == ("unpack", "gpu_vllm", "c_vllm", "d_deepspeed", "vllm_engine")
    assert not any("fallback" in c for call in plan.calls for c in call.carry)
    rows = {(r.call, r.item.split(":")[0]): r for r in lease.table(plan)}
    assert all(rows[1, s].runs for s in first.steps)
    assert rows[2, "gpu_vllm"].runs and rows[2, "c_vllm"].runs
    assert dict(first.env) == {"STEPS": "6", "VLLM_EAGER": "1"}
    # the last call stops at once on a fresh machine, which lost what call 1 carried
    assert dict(last.env) == {"STEPS": "6", "VLLM_EAGER": "1", "STOP_WITHOUT": "rest,vllm"}
    assert last.command().startswith(
        f"DEADLINE_S={last.deadline_s} STEPS=6 VLLM_EAGER=1 STOP_WITHOUT=rest,vllm bash tools/"
    )


#: The vllm bundle as built on 2026-11-26 (parts, manifest) and the tree of 2026-11-27's
#: lease: the call carrying the first part was refused, the one carrying the second passed.
PARTS_OF_2026_11_26 = (62_849_024, 23_547_232)
TREE_OF_2026_11_27 = 3_992_864


def test_a_call_of_63_75_mib_by_file_sizes_does_not_fit_the_plan_any_more():
    refused = TREE_OF_2026_11_27 + PARTS_OF_2026_11_26[0] + 2_545
    passed = TREE_OF_2026_11_27 + 31_424_836 + 5_836_252 + PARTS_OF_2026_11_26[1] + 5_147
    assert refused < 64 * lease.MIB  # under the tool's figure by the files' sizes, yet refused
    assert lease.size_problems(2, refused) == [
        "call 2: 63.75 MiB travels by its files' sizes, over the 62 MiB a call may send (the "
        "tool counts more than the files' bytes: it refused 63.75 MiB as over 64 MiB)"
    ]
    assert lease.size_problems(1, passed) == []
    layout = json.loads(lease.LAYOUT.read_text())
    layout["bundles"]["vllm"]["parts"] = [
        {"name": f"vllm.tar.xz.{i:03d}", "bytes": b} for i, b in enumerate(PARTS_OF_2026_11_26)
    ]
    parts = lease.layout_parts(layout, ("rest", "vllm"))
    # the plan says so, and names the re-cut that fits the room call 1 leaves beside rest
    with pytest.raises(
        ValueError,
        match=r"vllm.tar.xz.000 \(59.9 MiB\) does not fit a call's "
        r"57.0 MiB: .*/bundle.py resplit .gpu_bundle/vllm --part-size 28311552",
    ):
        lease.make_plan(parts, lease.TREE_BUDGET_BYTES)


def test_the_fallback_bundle_travels_only_when_asked_and_before_the_vllm_steps():
    plan = real_plan(with_fallback=True)
    assert [p for c in plan.calls for p in lease.check_call(c, plan.tree_bytes)] == []
    carrying = [c.index for c in plan.calls if ".gpu_bundle/fallback" in c.carry]
    assert carrying == [len(plan.calls)]  # no room for it beside vllm: a call of its own
    assert plan.calls[-1].steps == ("unpack", "gpu_vllm", "c_vllm", "d_deepspeed", "vllm_engine")
    assert plan.calls[0].steps == real_plan().calls[0].steps


def test_the_readme_gives_the_plans_calls_and_table():
    readme = (GPU_TOOLS / "README.md").read_text()
    plan = real_plan()
    assert lease.run_calls_text(plan) in readme
    assert lease.recovery_text(plan) in readme
    assert lease.markdown_table(plan, lease.table(plan)) in readme


def test_parts_go_first_fit_with_their_manifests():
    parts = (
        [lease.Part("v", "m/v/manifest.json", 1)]
        + [lease.Part("v", f"m/v/v.tar.xz.{i:03d}", 40) for i in range(3)]
        + [lease.Part("r", "m/r/manifest.json", 1), lease.Part("r", "m/r/r.tar.xz.000", 30)]
    )
    groups = lease.assign_parts(parts, capacity=100)
    assert [[p.path.rsplit("/", 1)[1] for p in g] for g in groups] == [
        ["manifest.json", "v.tar.xz.000", "v.tar.xz.001"],
        ["manifest.json", "v.tar.xz.002", "manifest.json", "r.tar.xz.000"],
    ]
    assert lease.carry_list(groups[1], parts) == ("m/v/manifest.json", "m/v/v.tar.xz.002",
                                                  ".gpu_bundle/r")  # fmt: skip
    with pytest.raises(ValueError, match="does not fit a call's"):
        lease.assign_parts(parts, capacity=40)


def test_a_part_goes_into_the_first_open_call_it_fits():
    """First fit over the open calls: a small part after a full call goes back to an earlier
    one with room, not into a new call."""
    parts = (
        [lease.Part("r", "m/r/manifest.json", 1), lease.Part("r", "m/r/r.tar.xz.000", 30)]
        + [lease.Part("v", "m/v/manifest.json", 1)]
        + [lease.Part("v", f"m/v/v.tar.xz.{i:03d}", b) for i, b in enumerate((60, 60, 8))]
    )
    groups = lease.assign_parts(parts, capacity=100)
    assert [[p.path.rsplit("/", 1)[1] for p in g if not lease.is_manifest(p)] for g in groups] \
        == [["r.tar.xz.000", "v.tar.xz.000", "v.tar.xz.002"], ["v.tar.xz.001"]]  # fmt: skip


def tiny_plan(bundles) -> lease.Plan:
    """The plan's layout on the tiny bundles: 4 parts a call, so vLLM takes two calls."""
    parts = lease.read_parts(bundles["root"], ("vllm", "rest"))
    steps = [S["unpack"], S["vllm_engine"], S["c_vllm"], S["a_fused"]]
    return lease.make_plan(parts, lease.TREE_BUDGET_BYTES, steps=2, selected=steps,
                           capacity=4 * PART + 4096)  # fmt: skip


def test_the_rehearsal_runs_the_calls_in_order_on_a_stand_in(tiny_bundles, tmp_path):
    plan = tiny_plan(tiny_bundles)
    assert [c.steps for c in plan.calls] == [
        ("unpack",),
        ("unpack", "c_vllm", "a_fused", "vllm_engine"),  # the optional engine last
    ]
    reports, rows = rehearse.rehearse(plan, ROOT, tiny_bundles["root"], tmp_path / "standin",
                                      env={"REHEARSAL_PLAN": "0"})  # fmt: skip
    one, two = reports
    assert one.problems == () and two.problems == (), (one.problems, two.problems)
    assert one.fresh_machine and not two.fresh_machine
    assert one.rc == two.rc == 0
    assert one.sent_bytes <= lease.TREE_LIMIT_BYTES and one.carry_paths == 5
    assert one.steps["unpack"]["status"] == "ok"
    assert two.steps == {
        "unpack": two.steps["unpack"],
        "vllm_engine": {**two.steps["vllm_engine"], "status": "rehearsed"},
        "c_vllm": {**two.steps["c_vllm"], "status": "rehearsed"},
        "a_fused": {**two.steps["a_fused"], "status": "rehearsed"},
    }
    assert two.steps["c_vllm"]["switches"]["vllm_eager"] is True
    assert two.steps["c_vllm"]["switches"]["steps"] == 2
    # the stand-in unpacked both bundles from what the two calls carried
    home = tmp_path / "standin" / "machine" / "tmp" / "rltrain-gpu"
    assert (home / "vllm" / "tinya" / "blob.bin").read_bytes() == tiny_bundles["payload"]
    assert (home / "rest" / "tinyb" / "blob.bin").read_bytes() == tiny_bundles["rest_payload"]
    assert two.out_files == ("logs.tar.gz", "results.json")
    assert 0 <= two.overhead_s <= two.wall_s  # publishing and bookkeeping between the steps
    # the table: one start, the unpacks measured here, the GPU steps estimated
    basis = {r.item.split(":")[0]: r.basis for r in rows if r.call == 2}
    assert basis["unpack"].startswith("measured (rehearsal): CPU time")
    assert basis["c_vllm"].startswith("estimate")
    assert sum(r.item == "start a machine" for r in rows) == 1
    assert rehearse.fits(reports, rows)


def test_a_missed_warm_window_stops_for_the_recovery_call(tiny_bundles, tmp_path):
    """Past 30 s between calls the first call's parts are gone: the second call stops after
    its unpack (rc 3) with its steps marked not started, and the table pays a second start;
    the recovery call, made within the window, carries them again and runs those steps."""
    plan = tiny_plan(tiny_bundles)
    standin = tmp_path / "standin"
    reports, rows = rehearse.rehearse(plan, ROOT, tiny_bundles["root"], standin, gaps_s=[31],
                                      env={"REHEARSAL_PLAN": "0"})  # fmt: skip
    two = reports[1]
    assert two.fresh_machine and two.rc == 3
    for step in ("vllm_engine", "c_vllm", "a_fused"):
        assert two.steps[step]["status"].startswith("skipped: not started: the vllm bundle")
    assert sum(r.item == "start a machine" for r in rows) == 2
    assert not rehearse.fits(reports, rows)
    # the recovery call, as the README gives it, on the machine call 2 left warm
    text = lease.recovery_text(plan)
    carry = tuple(json.loads(text.split("carry=", 1)[1].split(", timeout_s")[0]))
    assert carry == plan.calls[0].carry
    recovery = lease.Call(3, carry, 0, plan.calls[1].steps, 400, plan.calls[1].env[:2])
    report = rehearse.rehearse_call(recovery, ROOT, tiny_bundles["root"],
                                    rehearse.StandIn(standin), fresh=False,
                                    env={"REHEARSAL_PLAN": "0"})  # fmt: skip
    assert report.rc == 0, report.problems
    assert [report.steps[s]["status"] for s in ("vllm_engine", "c_vllm", "a_fused")] == [
        "rehearsed"
    ] * 3


def test_a_call_cut_off_still_returns_what_it_measured(tiny_bundles, tmp_path):
    """run.sh publishes after every step: a call killed in its second step, with everything
    it started (as the tool kills a command past its timeout), hands back the first's."""
    carry = (".gpu_bundle/rest",)
    standin = rehearse.StandIn(tmp_path / "standin")
    standin.fresh()
    standin.receive(rehearse.travelling(ROOT, tiny_bundles["root"], carry), carry)
    killer = tmp_path / "python"
    killer.write_text(
        "#!/bin/bash\n"
        # the stand-in's session leader leads run.sh's process group (timeout's is its own)
        'case "$*" in *plain_loop_gpu.py*) kill -KILL -- -"$(cut -d" " -f6 /proc/$$/stat)";; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    killer.chmod(0o755)
    out = tmp_path / "out"
    rc, _ = standin.run("bash tools/gpu/run.sh unpack plain", 60, out, {"PYTHON": str(killer)})
    assert rc == -9
    results = json.loads((out / "results.json").read_text())
    assert results["steps"]["unpack"]["status"] == "ok"
    assert "plain" not in results["steps"] or results["steps"]["plain"]["status"] == "not run"
    assert (out / "logs.tar.gz").is_file()
    assert rehearse.out_problems(out) == []


def test_a_call_over_64_mib_less_the_margin_is_refused_before_it_runs(tiny_bundles, tmp_path):
    bundles = tmp_path / "bundles"
    (bundles / "big").mkdir(parents=True)
    # with the tree: 63 MiB, under the tool's 64 but over the 62 a call may send
    size = lease.TREE_LIMIT_BYTES - lease.TREE_MARGIN_BYTES - lease.tree_bytes(ROOT) + lease.MIB
    with open(bundles / "big" / "big.bin", "wb") as f:
        f.truncate(size)  # sparse: on paper only
    call = lease.Call(1, (".gpu_bundle/big", ".gpu_bundle/nowhere"), size, ("unpack",), 60, ())
    report = rehearse.rehearse_call(call, ROOT, bundles, rehearse.StandIn(tmp_path / "s"),
                                    fresh=True, env={})  # fmt: skip
    assert report.rc is None  # nothing ran
    assert report.sent_bytes < lease.TREE_LIMIT_BYTES
    assert any("travels by its files' sizes, over the 62 MiB" in p for p in report.problems)
    assert "call 1: carried path .gpu_bundle/nowhere does not exist here" in report.problems


def test_out_limits_are_those_the_tool_returns(tmp_path):
    out = tmp_path / "out"
    (out / "a" / "b" / "c").mkdir(parents=True)
    (out / "a" / "b" / "c" / "deep.txt").write_text("x")
    (out / "bad name.txt").write_text("x")
    for i in range(8):
        (out / f"f{i}").write_text("x")
    problems = rehearse.out_problems(out)
    assert "$OUT holds 10 files, the tool returns 8" in problems
    assert "$OUT/a/b/c/deep.txt is more than 2 folders down" in problems
    assert "$OUT/bad name.txt: a name the tool does not return" in problems


def test_every_call_fits_the_command_and_carry_limits():
    long = lease.Call(1, tuple(f"p{i}" for i in range(9)), 0, ("x" * 2000,), 60, ())
    problems = lease.check_call(long, 0)
    assert any("command of" in p for p in problems) and "call 1: 9 carry paths" in problems


def test_optional_steps_go_last_after_the_last_calls_own():
    """An optional step runs on what the last call's deadline leaves, whatever it needs: after
    the steps a lease must not miss, even when its bundle was complete after call 1."""
    parts = [
        lease.Part("r", "m/r/manifest.json", 1),
        lease.Part("r", "m/r/r.tar.xz.000", 30),
        lease.Part("v", "m/v/manifest.json", 1),
        lease.Part("v", "m/v/v.tar.xz.000", 40),
    ]
    groups = lease.assign_parts(parts, capacity=50)
    assert len(groups) == 2
    steps = [lease.Step("unpack", "", (), False, 1, 0, ""),
             lease.Step("ray_run", "", ("r",), True, 1, 0, ""),
             lease.Step("ray_extra", "", ("r",), True, 1, 0, "", optional=True),
             lease.Step("vllm_run", "", ("v",), True, 1, 0, ""),
             lease.Step("plain", "", (), True, 1, 0, "")]  # fmt: skip
    placed = lease.place_steps(groups, parts, steps)
    assert [[s.name for s in call] for call in placed] == [
        ["unpack", "ray_run", "plain"],
        ["unpack", "vllm_run", "ray_extra"],
    ]
