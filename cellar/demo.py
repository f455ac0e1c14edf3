"""`cellar demo`: the README's main job until the local cluster (`cellar dev`) replaces it."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="stop after this many seconds (default 60)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    print(f"cellar demo: nothing to show yet (would run for {args.seconds:.0f} s)")
    return 0
