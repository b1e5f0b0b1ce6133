"""tools/gpu/build.sh and unpack.sh on a tiny bundle: two hand-made wheels, no registry.

The real bundle (Ray, vLLM, DeepSpeed, ...) takes minutes and the registry to build; the tiny
one goes through the same install, pack, stage, verify and extract code in seconds. Parts are
cut at 64 KiB so that a few hundred KiB of incompressible data make several of them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
GPU_TOOLS = ROOT / "tools" / "gpu"
PART = 64 * 1024

sys.path.insert(0, str(GPU_TOOLS))
import bundle  # noqa: E402  (tools/gpu is not a package)


def make_wheel(out: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid py3-none-any wheel holding ``files`` (module path -> bytes)."""
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    wheel = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries = {**files, f"{info}/METADATA": meta, f"{info}/WHEEL": wheel}
    record = []
    for path, data in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    entries[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, data in entries.items():
            zf.writestr(p, data)
    return path


def run(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(GPU_TOOLS / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """Build the tiny bundle once: (paths, the payload it must carry)."""
    tmp = tmp_path_factory.mktemp("bundle")
    wheels = tmp / "wheels"
    wheels.mkdir()
    payload = os.urandom(300 * 1024)  # incompressible: ~5 parts of 64 KiB
    make_wheel(wheels, "tinya", "1.0", {"tinya/__init__.py": b"X = 1\n", "tinya/blob.bin": payload})
    make_wheel(wheels, "tinyb", "2.0", {"tinyb/__init__.py": b"Y = 2\n"})
    out = tmp / "out"
    proc = run("build.sh", "--tiny", str(wheels), "--out", str(out), "--part-size", str(PART))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"tmp": tmp, "parts": out / "parts", "payload": payload}


def test_build_writes_parts_within_the_limit_with_checksums(built):
    parts = built["parts"]
    manifest = json.loads((parts / "manifest.json").read_text())
    names = [p["name"] for p in manifest["parts"]]
    assert len(names) >= 5  # 300 KiB of random bytes cannot compress below 4 parts of 64 KiB
    assert names == [f"rltrain-gpu.tar.xz.{i:03d}" for i in range(len(names))]
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
    assert manifest["top_level"] == ["site"]
    assert manifest["contents"]["site"] == ["tinya==1.0", "tinyb==2.0"]
    assert manifest["build"]["mode"] == "tiny"
    assert manifest["part_size_limit"] == PART


def test_parts_carried_one_by_one_then_unpacked(built, tmp_path):
    """As on the GPU machine: each call carries one part; the last one unpacks them all."""
    parts, home = built["parts"], tmp_path / "home"
    env = {"RLTRAIN_GPU_HOME": str(home)}
    manifest = json.loads((parts / "manifest.json").read_text())
    names = [p["name"] for p in manifest["parts"]]
    for i, name in enumerate(names):
        carried = tmp_path / f"call{i}"  # what one call's working tree holds
        carried.mkdir()
        shutil.copy(parts / "manifest.json", carried)
        shutil.copy(parts / name, carried)
        proc = run("unpack.sh", "--stage-only", str(carried), env=env)
        assert proc.returncode == 0, proc.stderr
        assert f"{i + 1}/{len(names)} parts present and verified" in proc.stdout
    proc = run("unpack.sh", str(tmp_path / "call0"), env=env)
    assert proc.returncode == 0, proc.stderr
    site = home / "site"
    assert (site / "tinya" / "blob.bin").read_bytes() == built["payload"]
    assert (site / "tinyb" / "__init__.py").read_text() == "Y = 2\n"
    assert (site / "tinya-1.0.dist-info" / "METADATA").is_file()
    assert not list(site.rglob("*.pyc"))  # --no-compile: 3.11 bytecode is useless on 3.12
    out = subprocess.run(
        [sys.executable, "-c", "import tinya, tinyb; print(tinya.X + tinyb.Y)"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    assert out.stdout.strip() == "3"


def _copy_parts(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_a_corrupt_part_is_refused_and_nothing_is_extracted(built, tmp_path):
    parts = _copy_parts(built["parts"], tmp_path / "parts")
    victim = parts / "rltrain-gpu.tar.xz.001"
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF  # same size, one bit pattern changed
    victim.write_bytes(bytes(data))
    home = tmp_path / "home"
    proc = run("unpack.sh", str(parts), env={"RLTRAIN_GPU_HOME": str(home)})
    assert proc.returncode == 2
    assert "part rltrain-gpu.tar.xz.001 is corrupt (sha256" in proc.stderr
    assert not (home / "site").exists()
    assert not list((home / "parts").glob("*.001"))  # the bad copy is not staged


def test_a_truncated_part_is_refused_by_size(built, tmp_path):
    parts = _copy_parts(built["parts"], tmp_path / "parts")
    victim = parts / "rltrain-gpu.tar.xz.000"
    victim.write_bytes(victim.read_bytes()[:-1])
    checks = bundle.verify(parts)
    assert [c.status for c in checks][:2] == ["size", "ok"]
    assert f"{PART - 1} bytes, the manifest says {PART}" in checks[0].detail


def test_a_missing_part_is_named_and_nothing_is_extracted(built, tmp_path):
    parts = _copy_parts(built["parts"], tmp_path / "parts")
    (parts / "rltrain-gpu.tar.xz.002").unlink()
    home = tmp_path / "home"
    proc = run("unpack.sh", str(parts), env={"RLTRAIN_GPU_HOME": str(home)})
    assert proc.returncode == 2
    assert "part rltrain-gpu.tar.xz.002 is missing" in proc.stderr
    assert not (home / "site").exists()


def test_staging_without_a_manifest_says_what_to_carry(tmp_path):
    (tmp_path / "carried").mkdir()
    proc = run("unpack.sh", "--stage-only", str(tmp_path / "carried"))
    assert proc.returncode == 2
    assert "manifest.json is missing: carry .gpu_bundle/parts/manifest.json" in proc.stderr


def test_parts_above_40_mib_are_refused(tmp_path):
    (tmp_path / "src" / "site").mkdir(parents=True)
    (tmp_path / "src" / "site" / "f").write_bytes(b"x")
    with pytest.raises(bundle.BundleError, match="part size 41943041 bytes is out of range"):
        bundle.pack(tmp_path / "src", tmp_path / "out", part_size=40 * 1024 * 1024 + 1)


def test_parts_of_another_build_are_not_joined(built, tmp_path):
    """A part staged from an earlier build is dropped when a new manifest arrives."""
    home = tmp_path / "home"
    staged = home / "parts"
    staged.mkdir(parents=True)
    stale = staged / "rltrain-gpu.tar.xz.000"
    stale.write_bytes(b"from an older bundle")
    (staged / "manifest.json").write_text(json.dumps({"format": 1, "parts": []}))
    carried = tmp_path / "carried"
    carried.mkdir()
    shutil.copy(built["parts"] / "manifest.json", carried)
    shutil.copy(built["parts"] / "rltrain-gpu.tar.xz.001", carried)
    checks = bundle.stage(carried, staged)
    assert [c.status for c in checks][:2] == ["missing", "ok"]
