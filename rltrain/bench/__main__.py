"""``python -m rltrain.bench [name ...] [cluster=ray] [--address A] [--quick] [--out DIR]``.

Also ``rltrain bench ...`` (the console script dispatches here). Runs the named measures (all by
default) on the embedded default cluster, or on an existing Ray cluster with ``cluster=ray``
(address ``auto``), ``cluster.address=HOST:PORT`` or ``--address``; prints each measure's table
as it finishes, then writes ``results.json`` and ``results.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import traceback

from rltrain.bench.harness import (
    ADDRESS_ENV,
    check_doc_blocks,
    cluster_address,
    connect,
    discover,
    markdown,
    release_shared,
    result_from_dict,
    run_measure,
    update_doc,
    write,
)
from rltrain.errors import ConfigError, ResourceError


def parser(prog: str = "python -m rltrain.bench") -> argparse.ArgumentParser:
    """The bench command line (also ``rltrain bench``)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Time the named benchmark measures (all by default) against same-run "
        "baselines, on the embedded default cluster or an existing Ray cluster.",
    )
    p.add_argument(
        "names",
        nargs="*",
        metavar="name|cluster=...",
        help="measures to run (default: all); cluster=local|ray or cluster.address=HOST:PORT",
    )
    p.add_argument(
        "--address",
        help="join this Ray cluster (auto or HOST:PORT) instead of starting a local one "
        "(default: $RLTRAIN_BENCH_ADDRESS, else the embedded default)",
    )
    p.add_argument("--quick", action="store_true", help="small sizes and few repeats (CI)")
    p.add_argument("--out", default="bench_results", help="directory for results.json/.md")
    p.add_argument(
        "--update-docs",
        metavar="MD",
        nargs="?",
        const="docs/benchmarks.md",
        help="also replace each measure's section in this Markdown file",
    )
    p.add_argument("--list", action="store_true", help="list the measures and exit")
    return p


def main(argv: list[str] | None = None, prog: str = "python -m rltrain.bench") -> int:
    """Run the named measures (all by default), print Markdown tables, write JSON and Markdown.

    A measure that fails is reported (with its traceback) and the others still run.

    Args:
        argv: command-line arguments (default: ``sys.argv[1:]``).
        prog: the program name usage messages show.

    Returns:
        The exit code: 0; 1 when a measure failed; 2 for an unknown measure, a bad option
        (an ``--update-docs`` path that cannot be written, a block there holding hand-written
        text, ``--update-docs`` with ``--quick``: all checked before any measure runs) or an
        unreachable cluster.
    """
    args = parser(prog).parse_args(argv)
    registry = discover()
    if args.list:
        for name, m in registry.items():
            print(f"{name}: {m.description}")
        return 0
    try:
        names, address = _checked(args, registry)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    disconnect = None
    if not address:  # measures that read the variable must agree with the command line
        os.environ.pop(ADDRESS_ENV, None)
    else:
        try:
            disconnect = connect(address)
        except ResourceError as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return 2
    try:
        if address or len(names) == 1:
            results, failed = _run(registry, names, args.quick)
        else:
            results, failed = _run_apart(names, args.quick)
    finally:
        if disconnect is not None:
            disconnect()
    if results:
        js, md = write(results, args.out)
        print(f"wrote {js} and {md}")
        if args.update_docs:
            update_doc(results, args.update_docs)
            print(f"updated {args.update_docs}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _checked(args: argparse.Namespace, registry: dict) -> tuple[list[str], str | None]:
    """The measures to run (all when none is named) and the cluster's address, after every
    check that can fail before a measure runs: results refused only at the end are lost.

    Raises:
        ConfigError: an unknown measure, a bad cluster argument, or an ``--update-docs`` the
            results cannot go to (:func:`check_docs_path`, :func:`check_doc_blocks`).
    """
    check_docs_path(args.update_docs, args.quick)
    names, address = cluster_address(args.names, args.address)
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ConfigError(f"unknown measure(s) {unknown}; known: {sorted(registry)}")
    names = names or list(registry)
    if args.update_docs:
        check_doc_blocks(args.update_docs, names)
    return names, address


def check_docs_path(path: str | None, quick: bool = False) -> None:
    """Refuse an ``--update-docs`` file the results could not be written to, and ``--quick``
    results going into it.

    Args:
        path: the option's value (None: not given).
        quick: whether ``--quick`` was given.

    Raises:
        ConfigError: with ``--quick`` (one sample of small sizes: a check, not a figure; it would
            replace the published figures); the path is a directory, its directory does not
            exist, or it cannot be written.
    """
    if path is None:
        return
    if quick:
        raise ConfigError(
            f"--update-docs {path} with --quick: quick results (small sizes, one sample) are a "
            f"check that the measures run, not figures to publish. Leave out --quick to update "
            f"the doc, or --update-docs to check the measures"
        )
    folder = os.path.dirname(path) or "."
    if os.path.isdir(path):
        problem = "is a directory"
    elif not os.path.isdir(folder):
        problem = f"is in {folder}, which does not exist"
    elif not os.access(path if os.path.exists(path) else folder, os.W_OK):
        problem = "cannot be written"
    else:
        return
    raise ConfigError(
        f"--update-docs {path} {problem}: name a Markdown file in an existing, writable "
        f"directory (without a value: docs/benchmarks.md, run from the repository root)"
    )


def _run(registry: dict, names: list[str], quick: bool) -> tuple[list, list[str]]:
    """Run each measure in turn, printing its table; a failure is printed and skipped.

    A resource measures share (:func:`rltrain.bench.harness.shared`) is released after each
    measure unless the next one has the same ``share``.
    """
    results, failed = [], []
    for i, name in enumerate(names):
        print(f"running {name}{' (quick)' if quick else ''} ...", flush=True)
        try:
            result = run_measure(registry[name], quick=quick)
        except Exception:  # noqa: BLE001 - one broken measure must not lose the others' figures
            traceback.print_exc()
            failed.append(name)
            result = None
        finally:
            share = registry[name].share
            if share is None or i + 1 == len(names) or registry[names[i + 1]].share != share:
                release_shared()
        if result is not None:
            results.append(result)
            print(markdown([result]), flush=True)
    return results, failed


def _run_apart(names: list[str], quick: bool) -> tuple[list, list[str]]:
    """Run each measure in a process of its own, as ``python -m rltrain.bench NAME``.

    On the embedded default every measure starts the local cluster it needs (their sizes
    differ) and keeps Ray objects for its cases; a fresh process per measure keeps one
    measure's Ray from leaking into the next. Output streams through; results are read back.
    """
    results, failed = [], []
    with tempfile.TemporaryDirectory(prefix="rltrain-bench-") as tmp:
        for name in names:
            out = os.path.join(tmp, name)
            cmd = [sys.executable, "-m", "rltrain.bench", name, "--out", out]
            code = subprocess.call(cmd + (["--quick"] if quick else []))
            try:
                with open(os.path.join(out, "results.json")) as f:
                    results.extend(result_from_dict(m) for m in json.load(f)["measures"])
            except OSError:
                pass
            if code != 0:
                failed.append(name)
    return results, failed


if __name__ == "__main__":
    sys.exit(main())
