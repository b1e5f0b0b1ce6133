"""Which declared dependencies of the bundled packages the GPU machine will lack.

Reads the ``Requires-Dist`` lines of every distribution installed in the bundle's site
directory (markers evaluated for CPython 3.12 on Linux x86_64, no extras) and classifies each
requirement as met by the bundle, met by the machine, unchecked (the machine has the package but
its version is not known here), version conflict, or absent. At build time the machine is
``machine_packages.txt`` (names, some versions); on the GPU machine ``--live`` asks the real
environment, so the same report there has no unchecked rows.

    python3 tools/gpu/check_deps.py .gpu_bundle/stage/site [--fallback DIR] [--live] [--json F]

Absent requirements are not errors by themselves: vLLM declares its whole serving stack
(flashinfer, torchaudio, opentelemetry, ...) while offline ``LLM(...)`` imports far less
(../shared/ENVIRONMENT.md); the report lists them so that a failed import there can be matched
to a package left out here. Exit status 0, or 1 when a requirement conflicts with what is there.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from email.parser import Parser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

#: The GPU machine's interpreter and platform, for evaluating environment markers.
TARGET_ENV = {
    **default_environment(),
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}


@dataclass(frozen=True)
class Row:
    """One requirement of one bundled distribution and where it would be met."""

    dist: str
    requirement: str
    status: str  # bundle | machine | unchecked | conflict | absent
    found: str = ""  # the version that meets (or fails) it, where known


def read_dists(site: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, requirement strings) of every ``*.dist-info`` in ``site``."""
    out = {}
    for info in sorted(site.glob("*.dist-info")):
        meta = Parser().parsestr((info / "METADATA").read_text(errors="replace"))
        name = canonicalize_name(meta["Name"])
        out[name] = (meta["Version"], meta.get_all("Requires-Dist") or [])
    return out


def read_machine(path: Path) -> dict[str, str | None]:
    """name -> version (None where unknown) from ``machine_packages.txt``."""
    out: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        out[canonicalize_name(name)] = version or None
    return out


def live_machine() -> dict[str, str | None]:
    """name -> version of every distribution this interpreter sees (the GPU machine's)."""
    from importlib.metadata import distributions

    return {canonicalize_name(d.metadata["Name"]): d.version for d in distributions()}


def _meets(req: Requirement, version: str) -> bool:
    try:
        return req.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def classify(bundle: dict[str, tuple[str, list[str]]], machine: dict[str, str | None]) -> list[Row]:
    """Classify every requirement of every bundled distribution.

    The bundle wins over the machine (it comes first on ``PYTHONPATH``).

    Args:
        bundle: :func:`read_dists` of the bundle (site, then fallback if used).
        machine: name -> version (None: present, version unknown) on the GPU machine.

    Returns:
        One row per applicable requirement, in distribution order.
    """
    rows = []
    for dist, (_, reqs) in bundle.items():
        for text in reqs:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                rows.append(Row(dist, text, "conflict", "unparseable"))
                continue
            if req.marker is not None and not req.marker.evaluate(TARGET_ENV):
                continue
            name = canonicalize_name(req.name)
            spec = f"{name}{req.specifier}"
            if name in bundle:
                version = bundle[name][0]
                status = "bundle" if _meets(req, version) else "conflict"
            elif name in machine:
                version = machine[name] or ""
                if not version:
                    status = "machine" if not str(req.specifier) else "unchecked"
                else:
                    status = "machine" if _meets(req, version) else "conflict"
            else:
                version, status = "", "absent"
            rows.append(Row(dist, spec, status, version))
    return rows


def summary(rows: list[Row], dists: list[str] | None = None) -> str:
    """Readable report: conflicts and unchecked first, then absent requirements per dist."""
    lines = []
    for status in ("conflict", "unchecked"):
        for r in rows:
            if r.status == status and (dists is None or r.dist in dists):
                lines.append(f"{status:9s} {r.dist}: needs {r.requirement}, found {r.found or '?'}")
    absent: dict[str, list[str]] = {}
    for r in rows:
        if r.status == "absent":
            absent.setdefault(r.dist, []).append(r.requirement)
    for dist, reqs in absent.items():
        lines.append(f"absent    {dist}: {', '.join(reqs)}")
    counts = {s: sum(r.status == s for r in rows) for s in ("bundle", "machine", "unchecked")}
    lines.append(
        f"{len(rows)} requirements: {counts['bundle']} met by the bundle, {counts['machine']} by "
        f"the machine, {counts['unchecked']} unchecked, "
        f"{sum(r.status == 'conflict' for r in rows)} conflicts, "
        f"{sum(r.status == 'absent' for r in rows)} absent"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("site", type=Path, help="the bundle's site directory")
    ap.add_argument("--fallback", type=Path, help="a directory put ahead of site (transformers)")
    ap.add_argument("--live", action="store_true", help="the machine is this interpreter's")
    ap.add_argument("--machine", type=Path, default=here / "machine_packages.txt")
    ap.add_argument("--json", type=Path, help="write every row here")
    args = ap.parse_args(argv)
    bundle = read_dists(args.site)
    if args.fallback:
        bundle.update(read_dists(args.fallback))
    machine = live_machine() if args.live else read_machine(args.machine)
    if args.live:  # the live environment sees the bundle too (PYTHONPATH): judge it by machine
        machine = {k: v for k, v in machine.items() if k not in bundle}
    rows = classify(bundle, machine)
    print(summary(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    return 1 if any(r.status == "conflict" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
