"""The report's result cache: host-model results and generated traces, kept by a digest of their inputs.

A report of the shipped scenarios runs the host model dozens of times (every configuration,
and again for every input of the sensitivity analysis). Each result is a small JSON file
named by the SHA-256 of a canonical JSON of everything that decides it: the trace file's
own SHA-256 (so an edited or regenerated trace is a new key), the hierarchy, the host, the
model preset, the SLA, the simulation's size and seed, the varied factors, the sdm version
and :func:`sdm.kernels.jit.source_digest` (every source file of the package: any change to
the code is a new key). A second run with the same inputs reads every result back.

Where it lives (:func:`default_cache_dir`): ``$SDM_CACHE_DIR`` when set, else
``$XDG_CACHE_HOME/sdm``, else ``~/.cache/sdm``; the report uses its ``report/`` subdirectory
and ``sdm report --cache-dir DIR`` overrides it. Deleting the directory is always safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from sdm.errors import ConfigError

__all__ = ["ResultCache", "default_cache_dir", "file_digest", "code_digest"]


def default_cache_dir() -> Path:
    """``$SDM_CACHE_DIR``, else ``$XDG_CACHE_HOME/sdm``, else ``~/.cache/sdm``."""
    if os.environ.get("SDM_CACHE_DIR"):
        return Path(os.environ["SDM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sdm"


_FILE_DIGESTS: dict = {}


def _canonical(x):
    """A JSON stand-in for what json cannot write, independent of the process."""
    if isinstance(x, (set, frozenset)):
        return sorted(str(v) for v in x)
    return str(x)


def file_digest(path) -> str:
    """SHA-256 (hex) of a file's bytes, remembered per (path, size, mtime) in this process."""
    path = os.fspath(path)
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    if key not in _FILE_DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _FILE_DIGESTS[key] = h.hexdigest()
    return _FILE_DIGESTS[key]


def code_digest() -> str:
    """The sdm version and the digest of every source file of the package (hex)."""
    from sdm import __version__
    from sdm.kernels.jit import source_digest

    return f"{__version__}+{source_digest().hex()[:32]}"


class ResultCache:
    """JSON results by the digest of their inputs, under ``root`` (created on first write).
    ``enabled=False`` reads nothing and writes nothing (``sdm report --no-cache``)."""

    def __init__(self, root=None, *, enabled: bool = True):
        self.root = Path(root) if root is not None else default_cache_dir() / "report"
        self.enabled = enabled
        self.hits = 0
        self.misses = 0

    def key(self, kind: str, inputs: dict) -> str:
        """The digest of ``inputs`` (JSON-ready) for results of ``kind``, code included; the
        same in every process (sets are sorted: their order follows the per-process hash seed)."""
        text = json.dumps({"kind": kind, "code": code_digest(), "inputs": inputs}, sort_keys=True,
                          separators=(",", ":"), default=_canonical)
        return hashlib.sha256(text.encode()).hexdigest()

    def path(self, kind: str, key: str, ext: str = "json") -> Path:
        return self.root / kind / f"{key}.{ext}"

    def get(self, kind: str, key: str):
        """The result stored under ``key``, or None (also for an unreadable entry, which a
        new result then replaces)."""
        if not self.enabled:
            self.misses += 1
            return None
        try:
            with open(self.path(kind, key)) as f:
                value = json.load(f)
        except (OSError, ValueError):
            self.misses += 1
            return None
        self.hits += 1
        return value

    def put(self, kind: str, key: str, value) -> None:
        """Store ``value`` (JSON-ready) atomically: a reader never sees half a file."""
        if not self.enabled:
            return
        path = self.path(kind, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(value, f, allow_nan=False)
            os.replace(tmp, path)
        except OSError as exc:
            raise ConfigError(f"cannot write the report's result cache at {str(self.root)!r}: {exc.strerror} "
                              f"(set --cache-dir or SDM_CACHE_DIR to a writable directory)") from None

    def file(self, kind: str, key: str, ext: str) -> Path:
        """Where a cached file of ``kind`` (a generated trace) lives; its directory is made."""
        path = self.path(kind, key, ext)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create the report's result cache at {str(self.root)!r}: "
                              f"{exc.strerror} (set --cache-dir or SDM_CACHE_DIR)") from None
        return path
