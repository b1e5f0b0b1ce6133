"""Pack a directory tree into xz tar parts with a manifest, and verify / unpack them again.

The GPU machine has no package registry and takes at most 64 MiB per call, the working tree
included, so the packages rltrain needs there travel as bundles, one per purpose (``vllm``,
``rest``, ``fallback``): each an xz-compressed tar stream cut into parts (``NAME.tar.xz.000``,
...) that travel one or more per call (tools/gpu/README.md, tools/gpu/lease.py). ``build.sh``
calls ``pack``; ``unpack.sh`` calls ``gather``, which stages what a call carried and unpacks
every bundle whose parts are all there. Standard library only: it runs on the build machine
(Python 3.11) and on the GPU machine (Python 3.12) with nothing installed.

    python3 tools/gpu/bundle.py pack SRC_DIR OUT_DIR --name NAME [--part-size B] [--meta FILE]
    python3 tools/gpu/bundle.py resplit BUNDLE_DIR --part-size B   # re-cut built parts
    python3 tools/gpu/bundle.py verify BUNDLE_DIR
    python3 tools/gpu/bundle.py stage FROM_DIR PARTS_DIR      # copy the parts present, report
    python3 tools/gpu/bundle.py unpack PARTS_DIR DEST_DIR
    python3 tools/gpu/bundle.py gather CARRIED_ROOT HOME [--stage-only]

Exit status: 0 done; 2 a part is missing or corrupt, or the input is unusable (the message
names the part, what is wrong and what to do).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import shutil
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

#: The largest part: a device call carries 64 MiB in all, and the working tree (4-5 MiB) and
#: the manifest travel with every part. Whether a call's parts fit beside the tree, with the
#: margin the tool's count needs, is tools/gpu/lease.py's check; ``resplit`` re-cuts built
#: parts to the size it names.
MAX_PART_BYTES = 62 * 1024 * 1024
MANIFEST = "manifest.json"
SUMS = "SHA256SUMS"
#: Where ``unpack`` records which bundle it extracted into a destination.
DONE_DIR = ".bundles"
FORMAT = 2
_CHUNK = 1 << 20


class BundleError(Exception):
    """The bundle cannot be built, staged or unpacked; the message says why and what to do."""


def archive_name(bundle: str) -> str:
    """The archive a bundle's parts cut: ``NAME.tar.xz``."""
    return f"{bundle}.tar.xz"


def part_name(bundle: str, index: int) -> str:
    """The file name of part ``index`` of a bundle (``vllm.tar.xz.000``, ...)."""
    return f"{archive_name(bundle)}.{index:03d}"


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


class _PartWriter(io.RawIOBase):
    """A write-only stream that cuts what it is given into files of ``part_size`` bytes."""

    def __init__(self, out_dir: Path, part_size: int, bundle: str) -> None:
        self.out_dir, self.part_size, self.bundle = out_dir, part_size, bundle
        self.parts: list[dict[str, object]] = []
        self.total = hashlib.sha256()
        self.size = 0
        self._file: BinaryIO | None = None
        self._hash = hashlib.sha256()
        self._left = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        n = len(view)
        self.total.update(view)
        self.size += n
        while len(view):
            if self._left == 0:
                self._next_part()
            take = min(self._left, len(view))
            assert self._file is not None
            self._file.write(view[:take])
            self._hash.update(view[:take])
            self._left -= take
            view = view[take:]
        return n

    def _next_part(self) -> None:
        self._finish_part()
        name = part_name(self.bundle, len(self.parts))
        self._file = open(self.out_dir / name, "wb")  # noqa: SIM115 - closed in _finish_part
        self._hash = hashlib.sha256()
        self._left = self.part_size
        self.parts.append({"name": name})

    def _finish_part(self) -> None:
        if self._file is None:
            return
        self._file.close()
        self._file = None
        last = self.parts[-1]
        last["bytes"] = self.part_size - self._left
        last["sha256"] = self._hash.hexdigest()

    def close(self) -> None:
        self._finish_part()
        super().close()


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # The same tree packs to the same bytes: no owner names, ids or build-time mtimes.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 1_700_000_000
    return info


def _tree_stats(src: Path) -> tuple[int, int]:
    files = size = 0
    for root, _, names in os.walk(src):
        for n in names:
            p = Path(root, n)
            if p.is_file() and not p.is_symlink():
                files += 1
                size += p.stat().st_size
    return files, size


def distributions(site: Path) -> list[str]:
    """``name==version`` of every ``*.dist-info`` directly in ``site``, sorted."""
    out = []
    for info in site.glob("*.dist-info"):
        fields = {}
        for line in (info / "METADATA").read_text(errors="replace").splitlines():
            if not line.strip():
                break  # the headers end at the first blank line
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
        out.append(f"{fields.get('Name', info.name)}=={fields.get('Version', '?')}")
    return sorted(out, key=str.lower)


def pack(
    src: Path,
    out_dir: Path,
    part_size: int = MAX_PART_BYTES,
    meta: dict | None = None,
    name: str = "bundle",
) -> dict:
    """Pack every top-level entry of ``src`` into xz tar parts and write the manifest.

    Args:
        src: the directory whose entries (the bundle's site directory, named like the bundle)
            become the archive's top-level entries.
        out_dir: where the parts, ``manifest.json`` and ``SHA256SUMS`` go; earlier parts there
            are removed first.
        part_size: the largest part in bytes, at most :data:`MAX_PART_BYTES`.
        meta: extra manifest fields (what the bundle holds, how it was built).
        name: the bundle's name (``vllm``, ``rest``, ...): its parts are ``NAME.tar.xz.NNN``.

    Returns:
        The manifest.

    Raises:
        BundleError: ``part_size`` is out of range, ``name`` is not a plain name, or ``src``
            is empty or missing.
    """
    if not 1 <= part_size <= MAX_PART_BYTES:
        raise BundleError(
            f"part size {part_size} bytes is out of range: give 1..{MAX_PART_BYTES} (62 MiB; a "
            f"device call carries 64 MiB in all, the working tree included)"
        )
    if not name.replace("-", "").replace("_", "").isalnum():
        raise BundleError(f"bundle name {name!r}: use letters, digits, '-' and '_' only")
    if not src.is_dir() or not any(src.iterdir()):
        raise BundleError(f"{src} is missing or empty: nothing to pack")
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob(f"{archive_name(name)}.*"):
        old.unlink()
    t0 = time.monotonic()
    writer = _PartWriter(out_dir, part_size, name)
    with lzma.LZMAFile(writer, "w", preset=6) as xz, tarfile.open(fileobj=xz, mode="w|") as tar:
        for entry in sorted(src.iterdir()):
            tar.add(entry, arcname=entry.name, filter=_normalise)
    writer.close()
    files, unpacked = _tree_stats(src)
    manifest = {
        "format": FORMAT,
        "bundle": name,
        "archive": archive_name(name),
        "compression": "xz",
        "part_size_limit": part_size,
        "archive_bytes": writer.size,
        "archive_sha256": writer.total.hexdigest(),
        "unpacked_bytes": unpacked,
        "files": files,
        "top_level": sorted(e.name for e in src.iterdir()),
        "contents": {e.name: distributions(e) for e in sorted(src.iterdir()) if e.is_dir()},
        "parts": writer.parts,
        "pack_seconds": round(time.monotonic() - t0, 1),
        **(meta or {}),
    }
    _write_index(out_dir, manifest)
    return manifest


def resplit(parts_dir: Path, part_size: int) -> dict:
    """Re-cut a built bundle's parts into parts of at most ``part_size`` bytes, no xz rebuild.

    The parts are byte chunks of one archive whose size and SHA-256 are in the manifest: they
    are joined and cut again into a folder beside ``parts_dir``, the new parts checked against
    the archive's checksum and against their own, and only then swapped in for the old ones
    (the manifest, ``SHA256SUMS`` and the parts together; other files in ``parts_dir`` kept).

    Args:
        parts_dir: a built bundle (``.gpu_bundle/NAME``) with every part present.
        part_size: the largest new part in bytes, 1..:data:`MAX_PART_BYTES`.

    Returns:
        The new manifest: the old one with new ``parts`` and ``part_size_limit``, and
        ``resplit_from`` (the old parts' sizes).

    Raises:
        BundleError: ``part_size`` is out of range, a part is missing or corrupt, or the
            joined parts do not match the archive's size and checksum (``parts_dir`` is then
            left as it was).
    """
    if not 1 <= part_size <= MAX_PART_BYTES:
        raise BundleError(
            f"part size {part_size} bytes is out of range: give 1..{MAX_PART_BYTES} (62 MiB)"
        )
    manifest = read_manifest(parts_dir)
    bad = [c for c in verify(parts_dir) if c.status != "ok"]
    if bad:
        raise BundleError(f"cannot re-cut {parts_dir}:\n" + problems_text(bad, parts_dir))
    name = manifest["bundle"]
    new_dir = parts_dir.with_name(f".{parts_dir.name}.resplit")
    shutil.rmtree(new_dir, ignore_errors=True)
    new_dir.mkdir()
    try:
        writer = _PartWriter(new_dir, part_size, name)
        with _Joined([parts_dir / p["name"] for p in manifest["parts"]]) as joined:
            for chunk in iter(lambda: joined.read(_CHUNK), b""):
                writer.write(chunk)
        writer.close()
        if (writer.size, writer.total.hexdigest()) != (
            manifest["archive_bytes"],
            manifest["archive_sha256"],
        ):
            raise BundleError(
                f"the joined parts of {parts_dir} are {writer.size} bytes with sha256 "
                f"{writer.total.hexdigest()}, the manifest says {manifest['archive_bytes']} "
                f"and {manifest['archive_sha256']}: rebuild the bundle"
            )
        new = {
            **manifest,
            "part_size_limit": part_size,
            "parts": writer.parts,
            "resplit_from": [p["bytes"] for p in manifest["parts"]],
        }
        _write_index(new_dir, new)
        _check_recut(new_dir, new)
    except BaseException:
        shutil.rmtree(new_dir, ignore_errors=True)
        raise
    _swap_in(parts_dir, new_dir, [p["name"] for p in manifest["parts"]])
    return new


def _write_index(out_dir: Path, manifest: dict) -> None:
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    sums = "".join(f"{p['sha256']}  {p['name']}\n" for p in manifest["parts"])
    (out_dir / SUMS).write_text(sums)


def _check_recut(new_dir: Path, manifest: dict) -> None:
    """Read the new parts back: each against its checksum, all joined against the archive's."""
    bad = [c for c in verify(new_dir) if c.status != "ok"]
    whole = hashlib.sha256()
    with _Joined([new_dir / p["name"] for p in manifest["parts"]]) as joined:
        for chunk in iter(lambda: joined.read(_CHUNK), b""):
            whole.update(chunk)
    if bad or whole.hexdigest() != manifest["archive_sha256"]:
        raise BundleError(f"the re-cut parts in {new_dir} do not verify: nothing replaced")


def _swap_in(parts_dir: Path, new_dir: Path, old_parts: list[str]) -> None:
    """Move the old parts' folder aside, the new one into its place, then drop the old."""
    for keep in parts_dir.iterdir():  # anything beside the parts and their index stays
        if keep.name not in {MANIFEST, SUMS, *old_parts}:
            shutil.move(str(keep), new_dir / keep.name)
    old_dir = parts_dir.with_name(f".{parts_dir.name}.old")
    shutil.rmtree(old_dir, ignore_errors=True)
    parts_dir.rename(old_dir)
    new_dir.rename(parts_dir)
    shutil.rmtree(old_dir)


def read_manifest(parts_dir: Path) -> dict:
    """The manifest in ``parts_dir``.

    Raises:
        BundleError: it is missing or not a manifest of this format.
    """
    path = parts_dir / MANIFEST
    if not path.is_file():
        raise BundleError(
            f"{path} is missing: carry .gpu_bundle/NAME/{MANIFEST} with every part of bundle "
            f"NAME (tools/gpu/README.md)"
        )
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path} is not valid JSON ({exc}): carry it again") from None
    if (
        manifest.get("format") != FORMAT
        or not isinstance(manifest.get("parts"), list)
        or not isinstance(manifest.get("bundle"), str)
    ):
        raise BundleError(f"{path} is not a bundle manifest of format {FORMAT}: rebuild it")
    return manifest


@dataclass(frozen=True)
class PartCheck:
    """One part against the manifest: ``ok``, ``missing``, ``size`` or ``checksum``."""

    name: str
    status: str
    detail: str = ""


def check_part(parts_dir: Path, part: dict) -> PartCheck:
    """Compare one part's file with its manifest entry (size first, then SHA-256)."""
    name = part["name"]
    path = parts_dir / name
    if not path.is_file():
        return PartCheck(name, "missing")
    size = path.stat().st_size
    if size != part["bytes"]:
        return PartCheck(name, "size", f"{size} bytes, the manifest says {part['bytes']}")
    digest = sha256_file(path)
    if digest != part["sha256"]:
        return PartCheck(name, "checksum", f"sha256 {digest}, the manifest says {part['sha256']}")
    return PartCheck(name, "ok")


def verify(parts_dir: Path) -> list[PartCheck]:
    """Check every part the manifest names; the list holds one entry per part, in order.

    Raises:
        BundleError: the manifest is missing or unreadable.
    """
    manifest = read_manifest(parts_dir)
    return [check_part(parts_dir, p) for p in manifest["parts"]]


def problems_text(checks: list[PartCheck], parts_dir: Path) -> str:
    """One line per part that is not ok, and what to do about it."""
    lines = []
    for c in checks:
        if c.status == "missing":
            lines.append(f"part {c.name} is missing from {parts_dir}: carry it (one call each)")
        elif c.status != "ok":
            lines.append(f"part {c.name} is corrupt ({c.detail}): carry it again")
    return "\n".join(lines)


def stage(from_dir: Path, parts_dir: Path) -> list[PartCheck]:
    """Copy the manifest and every part found in ``from_dir`` that verifies into ``parts_dir``.

    A part that arrives corrupt is not copied (a good copy already staged stays). Parts carried
    by earlier calls stay in ``parts_dir`` while the machine is kept.

    Returns:
        The state of every part in ``parts_dir`` after staging.

    Raises:
        BundleError: no manifest in ``from_dir`` nor in ``parts_dir``, or a part carried now
            is corrupt.
    """
    parts_dir.mkdir(parents=True, exist_ok=True)
    corrupt = []
    if (from_dir / MANIFEST).is_file():
        manifest = read_manifest(from_dir)
        staged = parts_dir / MANIFEST
        if staged.is_file() and _manifest_or_none(parts_dir) != manifest:
            # Parts of another build must not be joined with these.
            for old in parts_dir.glob("*.tar.xz.*"):
                old.unlink()
        shutil.copyfile(from_dir / MANIFEST, staged)
        for part in manifest["parts"]:
            check = check_part(from_dir, part)
            if check.status == "ok":
                if check_part(parts_dir, part).status != "ok":
                    shutil.copyfile(from_dir / part["name"], parts_dir / part["name"])
            elif check.status != "missing":
                corrupt.append(check)
    checks = verify(parts_dir)
    if corrupt:
        raise BundleError(problems_text(corrupt, from_dir))
    return checks


class _Joined(io.RawIOBase):
    """The parts read back to back as one stream."""

    def __init__(self, paths: list[Path]) -> None:
        self._paths: Iterator[Path] = iter(paths)
        self._file: BinaryIO | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        while True:
            if self._file is None:
                nxt = next(self._paths, None)
                if nxt is None:
                    return 0
                self._file = open(nxt, "rb")  # noqa: SIM115 - closed below
            n = self._file.readinto(buffer)
            if n:
                return n
            self._file.close()
            self._file = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        super().close()


def unpack(parts_dir: Path, dest: Path) -> dict:
    """Verify every part, then extract the joined archive into ``dest``.

    Extraction goes to a fresh directory beside ``dest``'s entries and is moved into place only
    when complete, so a failure leaves no half-extracted tree. Unpacking the same bundle again
    is a no-op (``dest/.bundles/NAME.json`` records what is there); other bundles' entries in
    ``dest`` are left alone.

    Returns:
        The manifest.

    Raises:
        BundleError: a part is missing or corrupt (every such part is named), or the archive
            does not decompress.
    """
    manifest = read_manifest(parts_dir)
    checks = [check_part(parts_dir, p) for p in manifest["parts"]]
    bad = [c for c in checks if c.status != "ok"]
    if bad:
        raise BundleError(
            f"cannot unpack {len(manifest['parts'])} parts from {parts_dir}:\n"
            + problems_text(bad, parts_dir)
        )
    done = unpacked_marker(dest, manifest["bundle"])
    if done.is_file() and json.loads(done.read_text()) == manifest:
        return manifest
    dest.mkdir(parents=True, exist_ok=True)
    work = dest / f".unpacking-{manifest['bundle']}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    paths = [parts_dir / p["name"] for p in manifest["parts"]]
    try:
        with (
            _Joined(paths) as joined,
            lzma.LZMAFile(io.BufferedReader(joined, _CHUNK)) as xz,
            tarfile.open(fileobj=xz, mode="r|") as tar,
        ):
            tar.extractall(work, filter="data")
    except (lzma.LZMAError, tarfile.TarError, EOFError) as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise BundleError(
            f"the joined parts do not decompress ({exc}): rebuild the bundle"
        ) from None
    for entry in work.iterdir():
        target = dest / entry.name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        entry.rename(target)
    work.rmdir()
    done.parent.mkdir(exist_ok=True)
    shutil.copyfile(parts_dir / MANIFEST, done)
    return manifest


def unpacked_marker(dest: Path, bundle: str) -> Path:
    """The file that says bundle ``bundle`` is extracted in ``dest`` (its manifest)."""
    return dest / DONE_DIR / f"{bundle}.json"


def _manifest_or_none(parts_dir: Path) -> dict | None:
    try:
        return read_manifest(parts_dir)
    except BundleError:
        return None


@dataclass(frozen=True)
class BundleState:
    """One bundle on the GPU machine after :func:`gather`."""

    name: str
    parts_present: int
    parts_total: int
    missing: tuple[str, ...]
    unpacked: bool


def gather(carried_root: Path, home: Path, stage_only: bool = False) -> list[BundleState]:
    """Stage every bundle a call carried, then unpack every bundle whose parts are all there.

    Args:
        carried_root: the call's ``.gpu_bundle``: one directory per carried bundle, each with
            its ``manifest.json`` and the parts this call carried (absent: nothing carried).
        home: the machine's bundle home: parts are staged in ``home/parts/NAME`` (kept while
            the machine is), bundles extracted into ``home`` (``home/NAME``).
        stage_only: stage, but extract nothing.

    Returns:
        Every bundle staged on this machine so far, by name.

    Raises:
        BundleError: a part carried now is corrupt, or an archive does not decompress.
    """
    errors = []
    if carried_root.is_dir():
        for manifest_file in sorted(carried_root.glob(f"*/{MANIFEST}")):
            name = read_manifest(manifest_file.parent)["bundle"]
            try:
                stage(manifest_file.parent, home / "parts" / name)
            except BundleError as exc:
                errors.append(str(exc))
    states = []
    for staged in sorted((home / "parts").glob(f"*/{MANIFEST}")):
        parts_dir = staged.parent
        manifest = read_manifest(parts_dir)
        checks = verify(parts_dir)
        missing = tuple(c.name for c in checks if c.status != "ok")
        if not missing and not stage_only:
            unpack(parts_dir, home)
        states.append(
            BundleState(
                name=manifest["bundle"],
                parts_present=len(checks) - len(missing),
                parts_total=len(checks),
                missing=missing,
                unpacked=unpacked_marker(home, manifest["bundle"]).is_file(),
            )
        )
    if errors:
        raise BundleError("\n".join(errors))
    return states


def _report(checks: list[PartCheck]) -> str:
    ok = sum(c.status == "ok" for c in checks)
    return f"{ok}/{len(checks)} parts present and verified"


def _gather_report(states: list[BundleState]) -> str:
    lines = []
    for s in states:
        state = "unpacked" if s.unpacked else f"still to carry: {' '.join(s.missing) or '-'}"
        lines.append(f"bundle {s.name}: {s.parts_present}/{s.parts_total} parts, {state}")
    return "\n".join(lines) or "no bundle staged"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="pack SRC's entries into parts + manifest")
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--name", required=True, help="the bundle's name: parts are NAME.tar.xz.NNN")
    p.add_argument("--part-size", type=int, default=MAX_PART_BYTES)
    p.add_argument("--meta", type=Path, help="JSON file of extra manifest fields")
    r = sub.add_parser("resplit", help="re-cut a built bundle's parts, no rebuild")
    r.add_argument("parts", type=Path)
    r.add_argument("--part-size", type=int, required=True, help="the largest new part, bytes")
    v = sub.add_parser("verify", help="check every part against the manifest")
    v.add_argument("parts", type=Path)
    s = sub.add_parser("stage", help="copy the parts present in FROM into PARTS")
    s.add_argument("src", type=Path)
    s.add_argument("parts", type=Path)
    u = sub.add_parser("unpack", help="verify, join and extract into DEST")
    u.add_argument("parts", type=Path)
    u.add_argument("dest", type=Path)
    g = sub.add_parser("gather", help="stage what a call carried, unpack complete bundles")
    g.add_argument("carried", type=Path, help="the call's .gpu_bundle directory")
    g.add_argument("home", type=Path)
    g.add_argument("--stage-only", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "pack":
            meta = json.loads(args.meta.read_text()) if args.meta else None
            m = pack(args.src, args.out, args.part_size, meta, args.name)
            sizes = ", ".join(f"{p['bytes'] / 2**20:.1f}" for p in m["parts"])
            print(
                f"packed {m['files']} files ({m['unpacked_bytes'] / 2**20:.1f} MiB) into "
                f"{len(m['parts'])} parts ({sizes} MiB; {m['archive_bytes'] / 2**20:.1f} MiB "
                f"in all) in {m['pack_seconds']} s: {args.out}"
            )
        elif args.cmd == "resplit":
            m = resplit(args.parts, args.part_size)
            old = ", ".join(f"{b / 2**20:.1f}" for b in m["resplit_from"])
            new = ", ".join(f"{p['bytes'] / 2**20:.1f}" for p in m["parts"])
            print(
                f"re-cut {m['bundle']} ({m['archive_bytes'] / 2**20:.1f} MiB, sha256 verified) "
                f"from parts of {old} MiB into {len(m['parts'])} parts of {new} MiB: {args.parts}"
            )
        elif args.cmd == "verify":
            checks = verify(args.parts)
            print(_report(checks))
            if any(c.status != "ok" for c in checks):
                print(problems_text(checks, args.parts), file=sys.stderr)
                return 2
        elif args.cmd == "stage":
            checks = stage(args.src, args.parts)
            missing = [c.name for c in checks if c.status != "ok"]
            print(f"staged in {args.parts}: {_report(checks)}")
            if missing:
                print(f"still to carry: {' '.join(missing)}")
        elif args.cmd == "unpack":
            m = unpack(args.parts, args.dest)
            print(f"unpacked {m['files']} files into {args.dest}: {', '.join(m['top_level'])}")
        else:
            print(_gather_report(gather(args.carried, args.home, args.stage_only)))
    except BundleError as exc:
        print(f"bundle: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
