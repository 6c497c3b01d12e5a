"""Run every benchmark and print its table: ``python -m bench.run [--quick]``.

Each benchmark module has ``main(argv) -> int`` and prints its own table with medians and
ratios; this runner only sequences them and notes the machine they ran on.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import time

BENCHMARKS = ("validation", "desk", "gateway", "telemetry", "commit")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("only", nargs="*", help=f"some of: {', '.join(BENCHMARKS)}")
    args = parser.parse_args(argv)
    print(f"# {time.strftime('%Y-%m-%d')} · {platform.python_implementation()} "
          f"{platform.python_version()} · {platform.machine()} · {os.cpu_count()} cores")
    failed = 0
    for name in args.only or BENCHMARKS:
        module = importlib.import_module(f"bench.{name}")
        print(f"\n## {name}\n", flush=True)
        code = module.main(["--quick"] if args.quick else [])
        failed += code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
