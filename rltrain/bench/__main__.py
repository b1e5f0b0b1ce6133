"""``python -m rltrain.bench [name ...] [--quick] [--out DIR] [--update-docs] [--list]``."""

from __future__ import annotations

import argparse
import sys

from rltrain.bench.harness import discover, markdown, run_measure, update_doc, write


def main(argv: list[str] | None = None) -> int:
    """Run the named measures (all by default), print a Markdown table, write JSON and Markdown.

    Args:
        argv: command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0, or 2 for an unknown measure name.
    """
    parser = argparse.ArgumentParser(prog="python -m rltrain.bench", description=__doc__)
    parser.add_argument("names", nargs="*", help="measures to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (CI)")
    parser.add_argument("--out", default="bench_results", help="directory for results.json/.md")
    parser.add_argument(
        "--update-docs",
        metavar="MD",
        nargs="?",
        const="docs/benchmarks.md",
        help="also replace each measure's section in this Markdown file",
    )
    parser.add_argument("--list", action="store_true", help="list the measures and exit")
    args = parser.parse_args(argv)
    registry = discover()
    if args.list:
        for name, m in registry.items():
            print(f"{name}: {m.description}")
        return 0
    unknown = [n for n in args.names if n not in registry]
    if unknown:
        print(f"unknown measure(s) {unknown}; known: {sorted(registry)}", file=sys.stderr)
        return 2
    results = []
    for name in args.names or list(registry):
        print(f"running {name}{' (quick)' if args.quick else ''} ...", flush=True)
        results.append(run_measure(registry[name], quick=args.quick))
    print(markdown(results))
    js, md = write(results, args.out)
    print(f"wrote {js} and {md}")
    if args.update_docs:
        update_doc(results, args.update_docs)
        print(f"updated {args.update_docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
