"""The ``sdm`` command line (also ``python -m sdm``).

Each command lives in its own module under ``sdm/cli/`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` (taking the parsed
namespace, returning an exit code). Commands parse, call library code that computes, and
hand the result to a renderer; they never compute in the parser.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from sdm import __version__
from sdm.errors import SdmError

# Modules of sdm.cli that define commands, in the order `sdm --help` lists them.
COMMAND_MODULES = ("run", "replay", "trace", "place", "report", "devices")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sdm",
        description="Software-defined memory for recommendation-model embeddings.",
    )
    parser.add_argument("--version", action="version", version=f"sdm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"sdm.cli.{name}").register(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except SdmError as exc:  # a user's mistake: one clear line, no traceback
        print(f"sdm {args.command}: error: {exc}", file=sys.stderr)
        return 2
