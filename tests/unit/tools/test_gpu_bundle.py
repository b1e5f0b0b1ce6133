"""tools/gpu/build.sh and unpack.sh on tiny bundles: hand-made wheels, no registry.

The real bundles (vLLM, Ray, DeepSpeed, ...) take minutes and the registry to build; the tiny
ones go through the same install, pack, stage, verify and extract code in seconds. Parts are
cut at 64 KiB so that a few hundred KiB of incompressible data make several of them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_bundles import GPU_TOOLS, PART, run_tool

sys.path.insert(0, str(GPU_TOOLS))
import bundle  # noqa: E402  (tools/gpu is not a package)


def test_build_writes_parts_within_the_limit_with_checksums(tiny_bundles):
    parts = tiny_bundles["root"] / "vllm"
    manifest = json.loads((parts / "manifest.json").read_text())
    names = [p["name"] for p in manifest["parts"]]
    assert len(names) >= 5  # 300 KiB of random bytes cannot compress below 4 parts of 64 KiB
    assert names == [f"vllm.tar.xz.{i:03d}" for i in range(len(names))]
    joined = b""
    for p in manifest["parts"]:
        data = (parts / p["name"]).read_bytes()
        assert len(data) == p["bytes"] <= PART
        assert hashlib.sha256(data).hexdigest() == p["sha256"]
        joined += data
    assert all(p["bytes"] == PART for p in manifest["parts"][:-1])  # only the last is short
    assert len(joined) == manifest["archive_bytes"]
    assert hashlib.sha256(joined).hexdigest() == manifest["archive_sha256"]
    sums = (parts / "SHA256SUMS").read_text().splitlines()
    assert sums == [f"{p['sha256']}  {p['name']}" for p in manifest["parts"]]
    assert manifest["bundle"] == "vllm" and manifest["top_level"] == ["vllm"]
    assert manifest["contents"]["vllm"] == ["tinya==1.0"]
    assert manifest["build"]["mode"] == "tiny" and manifest["build"]["bundle"] == "vllm"
    assert manifest["part_size_limit"] == PART
    rest = json.loads((tiny_bundles["root"] / "rest" / "manifest.json").read_text())
    assert rest["bundle"] == "rest" and rest["contents"]["rest"] == ["tinyb==2.0"]


def _carry(src: Path, dst: Path, names: list[str]) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for n in ["manifest.json", *names]:
        shutil.copy(src / n, dst / n)


def test_parts_carried_over_calls_then_unpacked_bundle_by_bundle(tiny_bundles, tmp_path):
    """As on the GPU machine: calls carry some parts each; a bundle is unpacked by the call
    that completes it, beside the bundles unpacked before."""
    root, home = tiny_bundles["root"], tmp_path / "home"
    env = {"RLTRAIN_GPU_HOME": str(home)}
    vllm = [p["name"] for p in json.loads((root / "vllm" / "manifest.json").read_text())["parts"]]
    rest = [p["name"] for p in json.loads((root / "rest" / "manifest.json").read_text())["parts"]]
    call1 = tmp_path / "call1" / ".gpu_bundle"
    _carry(root / "vllm", call1 / "vllm", vllm[:-1])
    proc = run_tool("unpack.sh", str(call1), env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        f"bundle vllm: {len(vllm) - 1}/{len(vllm)} parts, still to carry: {vllm[-1]}"
    )
    assert not (home / "vllm").exists()
    call2 = tmp_path / "call2" / ".gpu_bundle"
    _carry(root / "vllm", call2 / "vllm", vllm[-1:])
    _carry(root / "rest", call2 / "rest", rest)
    proc = run_tool("unpack.sh", str(call2), env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"bundle rest: {len(rest)}/{len(rest)} parts, unpacked",
        f"bundle vllm: {len(vllm)}/{len(vllm)} parts, unpacked",
    ]
    assert (home / "vllm" / "tinya" / "blob.bin").read_bytes() == tiny_bundles["payload"]
    assert (home / "rest" / "tinyb" / "blob.bin").read_bytes() == tiny_bundles["rest_payload"]
    assert (home / ".bundles" / "vllm.json").is_file()
    assert not list((home / "vllm").rglob("*.pyc"))  # --no-compile: 3.11 bytecode is useless
    out = subprocess.run(
        [sys.executable, "-c", "import tinya, tinyb; print(tinya.X + tinyb.Y)"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{home / 'vllm'}:{home / 'rest'}"},
    )
    assert out.stdout.strip() == "3"
    # a call carrying nothing new unpacks nothing again
    proc = run_tool("unpack.sh", str(tmp_path / "nothing"), env=env)
    assert proc.returncode == 0 and proc.stdout.count("unpacked") == 2


def _copy_bundle(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst / src.name)
    return dst


def test_a_corrupt_part_is_refused_and_nothing_is_extracted(tiny_bundles, tmp_path):
    carried = _copy_bundle(tiny_bundles["root"] / "vllm", tmp_path / "carried")
    victim = carried / "vllm" / "vllm.tar.xz.001"
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF  # same size, one bit pattern changed
    victim.write_bytes(bytes(data))
    home = tmp_path / "home"
    proc = run_tool("unpack.sh", str(carried), env={"RLTRAIN_GPU_HOME": str(home)})
    assert proc.returncode == 2
    assert "part vllm.tar.xz.001 is corrupt (sha256" in proc.stderr
    assert not (home / "vllm").exists()
    assert not list((home / "parts" / "vllm").glob("*.001"))  # the bad copy is not staged


def test_a_truncated_part_is_refused_by_size(tiny_bundles, tmp_path):
    parts = _copy_bundle(tiny_bundles["root"] / "vllm", tmp_path) / "vllm"
    victim = parts / "vllm.tar.xz.000"
    victim.write_bytes(victim.read_bytes()[:-1])
    checks = bundle.verify(parts)
    assert [c.status for c in checks][:2] == ["size", "ok"]
    assert f"{PART - 1} bytes, the manifest says {PART}" in checks[0].detail


def test_a_missing_part_is_named_and_nothing_is_extracted(tiny_bundles, tmp_path):
    parts = _copy_bundle(tiny_bundles["root"] / "vllm", tmp_path) / "vllm"
    (parts / "vllm.tar.xz.002").unlink()
    home = tmp_path / "home"
    with pytest.raises(bundle.BundleError, match="part vllm.tar.xz.002 is missing"):
        bundle.unpack(parts, home)
    assert not (home / "vllm").exists()


def test_staging_without_a_manifest_says_what_to_carry(tmp_path):
    (tmp_path / "carried").mkdir()
    with pytest.raises(bundle.BundleError, match="carry .gpu_bundle/NAME/manifest.json"):
        bundle.stage(tmp_path / "carried", tmp_path / "parts")


def test_parts_above_62_mib_and_odd_names_are_refused(tmp_path):
    (tmp_path / "src" / "x").mkdir(parents=True)
    (tmp_path / "src" / "x" / "f").write_bytes(b"x")
    with pytest.raises(bundle.BundleError, match="part size 65011713 bytes is out of range"):
        bundle.pack(tmp_path / "src", tmp_path / "out", part_size=62 * 1024 * 1024 + 1)
    with pytest.raises(bundle.BundleError, match="bundle name 'a/b'"):
        bundle.pack(tmp_path / "src", tmp_path / "out", name="a/b")


def test_parts_of_another_build_are_not_joined(tiny_bundles, tmp_path):
    """A part staged from an earlier build is dropped when a new manifest arrives."""
    staged = tmp_path / "home" / "parts" / "vllm"
    staged.mkdir(parents=True)
    stale = staged / "vllm.tar.xz.000"
    stale.write_bytes(b"from an older bundle")
    (staged / "manifest.json").write_text(json.dumps({"format": 2, "bundle": "vllm", "parts": []}))
    carried = tmp_path / "carried"
    _carry(tiny_bundles["root"] / "vllm", carried, ["vllm.tar.xz.001"])
    checks = bundle.stage(carried, staged)
    assert [c.status for c in checks][:2] == ["missing", "ok"]


def test_resplit_recuts_the_parts_and_two_calls_unpack_them_byte_identical(tiny_bundles, tmp_path):
    """A built bundle re-cut to another part size (no xz rebuild): the same archive in new
    parts, the manifest and SHA256SUMS rewritten, and carried over two calls as the plan
    does, it unpacks to the same bytes."""
    parts = _copy_bundle(tiny_bundles["root"] / "vllm", tmp_path / "bundles") / "vllm"
    (parts / "notes.txt").write_text("kept")
    old = json.loads((parts / "manifest.json").read_text())
    size = 100 * 1024  # not a multiple of the 64 KiB the parts were cut at
    proc = subprocess.run(
        [sys.executable, str(GPU_TOOLS / "bundle.py"), "resplit", str(parts),
         "--part-size", str(size)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    new = json.loads((parts / "manifest.json").read_text())
    n = -(-old["archive_bytes"] // size)
    assert [p["name"] for p in new["parts"]] == [f"vllm.tar.xz.{i:03d}" for i in range(n)]
    assert [p["bytes"] for p in new["parts"]][:-1] == [size] * (n - 1)
    assert new["resplit_from"] == [p["bytes"] for p in old["parts"]]
    assert new["part_size_limit"] == size
    assert {k: v for k, v in new.items() if k not in ("parts", "part_size_limit", "resplit_from")} \
        == {k: v for k, v in old.items() if k not in ("parts", "part_size_limit")}  # fmt: skip
    assert sorted(p.name for p in parts.iterdir()) == sorted(
        ["SHA256SUMS", "manifest.json", "notes.txt", *(p["name"] for p in new["parts"])]
    )  # the old parts are gone, nothing else is
    assert (parts / "SHA256SUMS").read_text().splitlines() == [
        f"{p['sha256']}  {p['name']}" for p in new["parts"]
    ]
    assert not list(parts.parent.glob(".vllm.*"))  # no work folders left
    joined = b"".join((parts / p["name"]).read_bytes() for p in new["parts"])
    assert hashlib.sha256(joined).hexdigest() == old["archive_sha256"]
    home, names = tmp_path / "home", [p["name"] for p in new["parts"]]
    for call, carried in enumerate((names[:1], names[1:])):
        _carry(parts, tmp_path / f"call{call}" / ".gpu_bundle" / "vllm", carried)
        proc = run_tool("unpack.sh", str(tmp_path / f"call{call}" / ".gpu_bundle"),
                        env={"RLTRAIN_GPU_HOME": str(home)})  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"bundle vllm: {n}/{n} parts, unpacked"
    assert (home / "vllm" / "tinya" / "blob.bin").read_bytes() == tiny_bundles["payload"]


def test_resplit_of_a_corrupt_or_mislabelled_bundle_changes_nothing(tiny_bundles, tmp_path):
    parts = _copy_bundle(tiny_bundles["root"] / "vllm", tmp_path / "a") / "vllm"
    before = {p.name: p.read_bytes() for p in parts.iterdir()}
    victim = parts / "vllm.tar.xz.001"
    victim.write_bytes(victim.read_bytes()[:-1])
    with pytest.raises(bundle.BundleError, match="part vllm.tar.xz.001 is corrupt"):
        bundle.resplit(parts, 100 * 1024)
    victim.write_bytes(before[victim.name])
    manifest = json.loads((parts / "manifest.json").read_text())
    # parts that verify one by one but do not make the archive the manifest names
    (parts / "manifest.json").write_text(json.dumps({**manifest, "archive_sha256": "0" * 64}))
    with pytest.raises(bundle.BundleError, match="the manifest says .* and 0{64}: rebuild"):
        bundle.resplit(parts, 100 * 1024)
    (parts / "manifest.json").write_bytes(before["manifest.json"])
    assert {p.name: p.read_bytes() for p in parts.iterdir()} == before
    assert not list(parts.parent.glob(".vllm.*"))
    with pytest.raises(bundle.BundleError, match="out of range"):
        bundle.resplit(parts, 0)
