"""The ``sdm`` command line (also ``python -m sdm``).

Each command lives in its own module under ``sdm/cli/`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` (taking the parsed
namespace, returning an exit code). Commands parse, call library code that computes, and
hand the result to a renderer; they never compute in the parser.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from sdm import __version__
from sdm.errors import ConfigError, InvalidArgumentError, SdmError

# Modules of sdm.cli that define commands, in the order `sdm --help` lists them.
COMMAND_MODULES = ("run", "replay", "load", "host", "trace", "store", "place", "shard", "report", "devices")


def check_output_folder(path) -> None:
    """ConfigError unless the folder an output file ``path`` goes into exists; the message
    says whether it is missing or a file stands in its way."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(folder):
        return
    probe = folder
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if probe == folder:
        why = "is a file, not a directory"
    elif probe and not os.path.isdir(probe):
        why = f"does not exist ({probe!r} is a file, not a directory)"
    else:
        why = "does not exist"
    raise ConfigError(f"output directory {folder!r} {why}")


def check_output_file(target: str | None) -> None:
    """The one rule for an output *file* option (``-o``, ``--json``, ``--plot``): its folder
    must exist (see :func:`check_output_folder`); ``None`` and ``-`` (stdout) pass. Output
    *directory* options (``--out``, ``--report``) are created, with their parents."""
    if target is not None and target != "-":
        if os.path.isdir(target):  # refused before the work, not after it
            raise InvalidArgumentError(f"cannot write {target}: Is a directory (an output file needs a file name)")
        check_output_folder(target)


def make_output_dir(path: str) -> None:
    """Create the output directory ``path`` (and its parents) if missing; InvalidArgumentError
    naming it when the system refuses."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot write output directory {path}: {exc.strerror}") from None


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path``, whose folder must exist (or be made by the caller: an
    output directory); InvalidArgumentError naming the path when the system refuses."""
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot write {path}: {exc.strerror}") from None


def emit_json(target: str | None, data: dict) -> bool:
    """Write ``data`` to ``target`` ('-' for stdout); True when stdout took it."""
    if target is None:
        return False
    text = json.dumps(data, indent=1)
    if target == "-":
        print(text)
        return True
    check_output_file(target)
    write_text(target, text + "\n")
    return False


def add_store_arguments(p) -> None:
    """The options of commands that build a store for a trace (or take one): ``--store``,
    ``--dim``, ``--fmt``, ``--request-size``, ``--seed``."""
    p.add_argument("--store", metavar="DIR", help="an existing store matching the trace's tables")
    p.add_argument("--dim", type=int, default=64, help="columns of the built store's rows (default 64)")
    p.add_argument("--fmt", default="fp32", help="row format of the built store (default fp32)")
    p.add_argument("--request-size", type=int, help="samples per request (default: a whole batch)")
    p.add_argument("--seed", type=int, default=0)


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


def command_name(args) -> str:
    """``"sdm replay"``, ``"sdm trace gen"``: the command an error line names."""
    words = ["sdm", args.command]
    sub = getattr(args, f"{args.command}_command", None)  # `sdm trace gen`, `sdm devices calibrate`
    if sub:
        words.append(sub)
    return " ".join(words)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.error(f"a command is needed: one of {', '.join(COMMAND_MODULES)} (sdm --help)")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C: one line and the shell's code for SIGINT, no traceback
        print(f"\n{command_name(args)}: interrupted", file=sys.stderr)
        return 130
    except SdmError as exc:  # a user's mistake: one clear line, no traceback
        print(f"{command_name(args)}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the system refused (unwritable output, full disk): one line too
        where = f" {exc.filename!r}" if exc.filename else ""
        print(f"{command_name(args)}: error: cannot access{where}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except MemoryError as exc:  # a size the host cannot hold (numpy names the array)
        print(f"{command_name(args)}: error: out of memory: {exc or 'allocation failed'}", file=sys.stderr)
        return 1
