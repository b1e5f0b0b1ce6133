"""Tiny bundles for the tests of tools/gpu: hand-made wheels built into the lease plan's two
bundles ("vllm", "rest") by tools/gpu/build.sh --tiny, no registry, parts of 64 KiB."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GPU_TOOLS = ROOT / "tools" / "gpu"
PART = 64 * 1024


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


def run_tool(
    script: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """A tools/gpu shell script, with this interpreter as its PYTHON."""
    return subprocess.run(
        ["bash", str(GPU_TOOLS / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
    )


def build_tiny(tmp: Path) -> dict:
    """Build bundle "vllm" (300 KiB of random bytes: 5 parts) and "rest" (100 KiB: 2 parts)
    into ``tmp/.gpu_bundle``; returns its path and the payloads they must carry."""
    payload, rest_payload = os.urandom(300 * 1024), os.urandom(100 * 1024)
    wheels = {"vllm": tmp / "wheels_vllm", "rest": tmp / "wheels_rest"}
    for d in wheels.values():
        d.mkdir()
    make_wheel(wheels["vllm"], "tinya", "1.0",
               {"tinya/__init__.py": b"X = 1\n", "tinya/blob.bin": payload})  # fmt: skip
    make_wheel(wheels["rest"], "tinyb", "2.0",
               {"tinyb/__init__.py": b"Y = 2\n", "tinyb/blob.bin": rest_payload})  # fmt: skip
    out = tmp / ".gpu_bundle"
    tiny = [a for name, d in wheels.items() for a in ("--tiny", f"{name}={d}")]
    proc = run_tool("build.sh", *tiny, "--out", str(out), "--part-size", str(PART))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"root": out, "payload": payload, "rest_payload": rest_payload}
