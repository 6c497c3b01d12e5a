"""Run every benchmark and print its table: ``python -m bench.run [--quick] [--repeat R]
[--store sqlite,postgres] [--postgres-url URL]``.

Each benchmark module has ``main(argv) -> int`` and prints its own table with medians and
ratios; this runner only sequences them and notes the machine they ran on. ``--store``
and ``--postgres-url`` (see :mod:`bench.stores`) go to the benchmarks that use a store;
``--repeat R`` to the gateway's and the scale one's, which then measure R fresh runs and
report their medians
(the others take medians of their own repeated reads or spawns in every run).
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import time

from bench.stores import Stores, add_options, pass_through

BENCHMARKS = ("validation", "desk", "gateway", "startup", "memory", "telemetry", "commit",
              "notify", "copy", "connect", "check", "scale")
WITH_STORES = ("desk", "gateway", "commit", "copy", "scale")
"""The benchmarks that take ``--store``."""
WITH_REPEAT = ("gateway", "scale")
"""The benchmarks that take ``--repeat``."""


def arguments(name: str, args: argparse.Namespace) -> list[str]:
    """The arguments benchmark ``name`` is run with."""
    out = ["--quick"] if args.quick else []
    if name in WITH_STORES:
        out += pass_through(args)
    if name in WITH_REPEAT and args.repeat > 1:
        out += ["--repeat", str(args.repeat)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--repeat", type=int, default=1, metavar="R",
                        help="fresh runs of the gateway benchmark, reported as medians (1)")
    parser.add_argument("only", nargs="*", help=f"some of: {', '.join(BENCHMARKS)}")
    add_options(parser)
    args = parser.parse_args(argv)
    Stores.of(parser, args)  # a bad --store fails here, before anything runs
    if args.repeat < 1:
        parser.error("--repeat needs a count of 1 or more")
    print(f"# {time.strftime('%Y-%m-%d')} · {platform.python_implementation()} "
          f"{platform.python_version()} · {platform.machine()} · {os.cpu_count()} cores")
    failed = 0
    for name in args.only or BENCHMARKS:
        module = importlib.import_module(f"bench.{name}")
        print(f"\n## {name}\n", flush=True)
        code = module.main(arguments(name, args))
        failed += code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
