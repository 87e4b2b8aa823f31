"""A placement: what DRAM pins, and the order SCM row files lay their rows out in.

A :class:`Placement` is computed by :func:`sdm.replay.planner.plan` from a trace's access
counts and consumed by the hierarchy (tables and rows pinned in DRAM) and by
:class:`sdm.tiers.mmap.MmapTier` (``row_order``: the SCM row file in placement order, so rows
looked up together share device blocks, after Bandana). It is saved as an ``.npz`` that is
never unpickled.
"""

from __future__ import annotations

import json
import os
import uuid
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from sdm.errors import ConfigError
from sdm.tiers.manifest import TableSpec, fsync_dir
from sdm.validate import as_array, check_permutation

__all__ = ["Placement", "LAYOUTS", "PLACEMENT_FORMAT", "inverse_permutation"]

LAYOUTS = ("coaccess", "frequency")
PLACEMENT_FORMAT = "sdm-placement"
_VERSION = 1


# -- the placement ------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Placement:
    """Where a store's rows live, decided from an access profile.

    Attributes:
        pinned_tables: names of the tables served whole from DRAM.
        pinned_rows: per table, ``(k,) int64`` sorted unique row ids pinned in the DRAM cache
            (never evicted). A table pinned whole has no entry.
        row_order: per table, ``(num_rows,) int64`` permutation: ``row_order[name][p]`` is the
            row stored at position ``p`` of the SCM row file. A table without an entry keeps
            identity order.
        info: JSON-able facts of the plan (budget, densities, blocks per lookup before and
            after the layout on held-out batches).

    Arrays are made read-only; the object is immutable.
    """

    pinned_tables: tuple[str, ...] = ()
    pinned_rows: dict[str, np.ndarray] = field(default_factory=dict)
    row_order: dict[str, np.ndarray] = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    _inverse: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        if isinstance(self.pinned_tables, str):
            raise ConfigError(f"placement pinned_tables must be a sequence of table names, got the "
                              f"string {self.pinned_tables!r}")
        object.__setattr__(self, "pinned_tables", tuple(self.pinned_tables))
        for name in self.pinned_tables:
            if not isinstance(name, str):
                raise ConfigError(f"placement pinned_tables holds {name!r}, not a table name")
        if not isinstance(self.info, dict):
            raise ConfigError(f"placement info must be a dict, got {type(self.info).__name__}")
        for attr in ("pinned_rows", "row_order"):
            if not isinstance(getattr(self, attr), Mapping):
                raise ConfigError(f"placement {attr} must be a mapping of table name to ids, got "
                                  f"{type(getattr(self, attr)).__name__}")
            arrays = {}
            for name, arr in dict(getattr(self, attr)).items():
                if not isinstance(name, str):
                    raise ConfigError(f"placement {attr} key {name!r} is not a table name")
                a = as_array(arr, f"placement {attr}[{name!r}]", error=ConfigError)
                if a.ndim != 1 or not (np.issubdtype(a.dtype, np.integer) and a.dtype != np.bool_):
                    raise ConfigError(f"placement {attr}[{name!r}] must be a 1-D integer array, got "
                                      f"shape {a.shape} dtype {a.dtype}")
                a = np.array(a, dtype=np.int64)
                a.setflags(write=False)
                arrays[name] = a
            object.__setattr__(self, attr, arrays)
        try:
            json.dumps(self.info)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"placement info must be JSON-serializable: {exc}") from None
        self._check_structure()

    def _check_structure(self) -> None:
        """What holds without knowing the store: unique names, sorted unique non-negative
        pins, orders that are permutations of their own length, no table pinned twice."""
        names = self.pinned_tables
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ConfigError(f"placement pins table(s) {dup} whole more than once")
        both = sorted(set(names) & set(self.pinned_rows))
        if both:
            raise ConfigError(f"placement table {both[0]!r} is both pinned whole and has pinned rows")
        for name, ids in self.pinned_rows.items():
            if ids.size and (ids[0] < 0 or np.any(ids[1:] <= ids[:-1])):
                at = 0 if ids[0] < 0 else int(np.argmax(ids[1:] <= ids[:-1])) + 1
                raise ConfigError(f"placement pinned_rows[{name!r}] must be sorted unique ids >= 0; "
                                  f"entry {at} is {int(ids[at])}")
        for name, order in self.row_order.items():
            check_permutation(order, order.shape[0], f"placement row_order[{name!r}]", error=ConfigError)

    def validate(self, tables: Mapping[str, TableSpec]) -> None:
        """Check the placement against a store's tables.

        Raises:
            ConfigError: naming the table and the value at fault: a table the store does not
                hold, a pinned id outside ``[0, num_rows)``, a row order that is not a
                permutation of the table's ``num_rows`` rows, or (also checked on
                construction) unsorted pins or a table both pinned whole and by rows.
        """
        for where, names in (("pinned_tables", self.pinned_tables), ("pinned_rows", self.pinned_rows),
                             ("row_order", self.row_order)):
            for name in names:
                if name not in tables:
                    raise ConfigError(f"placement {where} names table {name!r}, which the store does "
                                      f"not hold; tables: {list(tables)}")
        for name, ids in self.pinned_rows.items():
            n = tables[name].num_rows
            if ids.size and ids[-1] >= n:
                raise ConfigError(f"placement pinned_rows[{name!r}] holds id {int(ids[-1])}, outside "
                                  f"[0, {n}) of table {name!r}")
        for name, order in self.row_order.items():
            n = tables[name].num_rows
            if order.shape[0] != n:
                raise ConfigError(f"placement row_order[{name!r}] has {order.shape[0]} entries; table "
                                  f"{name!r} has {n} rows")

    def pinned_row_count(self) -> int:
        """Rows pinned one by one, over every table (whole tables not included)."""
        return int(sum(ids.shape[0] for ids in self.pinned_rows.values()))

    def inverse_order(self, name: str) -> np.ndarray | None:
        """``(num_rows,) int64`` position of each row id in table ``name``'s row file
        (``pos[row_order[p]] == p``), cached; None when the table keeps identity order."""
        order = self.row_order.get(name)
        if order is None:
            return None
        pos = self._inverse.get(name)
        if pos is None:
            pos = inverse_permutation(order)
            pos.setflags(write=False)
            self._inverse[name] = pos
        return pos

    # -- file ------------------------------------------------------------------------

    def save(self, path) -> str:
        """Write the placement to ``path`` (an ``.npz`` of plain arrays, never pickled),
        atomically: a temporary file beside it, fsynced, renamed over ``path``. Returns the path."""
        path = os.fspath(path)
        arrays = {
            "format": np.array(PLACEMENT_FORMAT),
            "version": np.array(_VERSION, dtype=np.int64),
            "pinned_tables": _names(self.pinned_tables),
            "pinned_names": _names(list(self.pinned_rows)),
            "order_names": _names(list(self.row_order)),
            "info": np.frombuffer(json.dumps(self.info, sort_keys=True).encode("utf-8"), dtype=np.uint8),
        }
        for i, ids in enumerate(self.pinned_rows.values()):
            arrays[f"pinned_rows_{i}"] = ids
        for i, order in enumerate(self.row_order.values()):
            arrays[f"row_order_{i}"] = order
        if os.path.isdir(path):
            raise ConfigError(f"cannot write placement file {path}: it is a directory")
        folder = os.path.dirname(os.path.abspath(path))
        tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_dir(folder)
        except OSError as exc:
            _unlink(tmp)
            raise ConfigError(f"cannot write placement file {path}: {exc.strerror or exc}") from None
        except BaseException:
            _unlink(tmp)
            raise
        return path

    @classmethod
    def load(cls, path) -> "Placement":
        """Read a placement written by :meth:`save` (``np.load(..., allow_pickle=False)``).

        Raises:
            ConfigError: no file at ``path``, or a file that is damaged, truncated or not a
                placement (the message names the path and what is wrong).
        """
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError(f"placement file must be a path, got {type(path).__name__}")
        path = os.fspath(path)
        if os.path.isdir(path):
            raise ConfigError(f"no placement file at {path}: it is a directory")
        if not os.path.isfile(path):
            raise ConfigError(f"no placement file at {path}")
        try:
            npz = np.load(path, allow_pickle=False)
            if not isinstance(npz, np.lib.npyio.NpzFile):
                raise ConfigError(f"placement file {path} is a single .npy array, not a placement")
            with npz:
                members = {name: npz[name] for name in npz.files}
        except ConfigError:
            raise
        except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError, KeyError) as exc:
            raise ConfigError(f"placement file {path} cannot be read (damaged or not an .npz): "
                              f"{exc}") from None
        except Exception as exc:  # a zip member damaged in a way numpy reports otherwise
            raise ConfigError(f"placement file {path} cannot be read (damaged): "
                              f"{type(exc).__name__}: {exc}") from None
        return cls._from_members(path, members)

    @classmethod
    def _from_members(cls, path: str, m: dict) -> "Placement":
        def need(name):
            if name not in m:
                raise ConfigError(f"placement file {path} has no {name!r} member; not a placement "
                                  f"file (or a damaged one)")
            return m[name]

        fmt = need("format")
        if fmt.shape != () or fmt.dtype.kind != "U" or str(fmt) != PLACEMENT_FORMAT:
            raise ConfigError(f"placement file {path} is not an sdm placement (format {fmt!r})")
        version = need("version")
        if version.shape != () or version.dtype.kind not in "iu" or int(version) != _VERSION:
            raise ConfigError(f"placement file {path} has version {version!r}; this sdm reads "
                              f"version {_VERSION}")
        names = {}
        for key in ("pinned_tables", "pinned_names", "order_names"):
            arr = need(key)
            if arr.ndim != 1 or (arr.size and arr.dtype.kind != "U"):
                raise ConfigError(f"placement file {path}: member {key!r} must be a 1-D array of "
                                  f"names, got shape {arr.shape} dtype {arr.dtype}")
            names[key] = [str(x) for x in arr]
        raw = need("info")
        if raw.ndim != 1 or raw.dtype != np.uint8:
            raise ConfigError(f"placement file {path}: member 'info' must be 1-D uint8 JSON bytes, "
                              f"got shape {raw.shape} dtype {raw.dtype}")
        try:
            info = json.loads(raw.tobytes().decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"placement file {path}: member 'info' is not JSON: {exc}") from None
        if not isinstance(info, dict):
            raise ConfigError(f"placement file {path}: member 'info' must be a JSON object")

        def arrays(key, prefix):
            return {name: need(f"{prefix}_{i}") for i, name in enumerate(names[key])}

        try:
            return cls(tuple(names["pinned_tables"]), arrays("pinned_names", "pinned_rows"),
                       arrays("order_names", "row_order"), info)
        except ConfigError as exc:
            raise ConfigError(f"placement file {path}: {exc}") from None


def _names(names) -> np.ndarray:
    names = [str(n) for n in names]
    return np.array(names, dtype=f"<U{max([1] + [len(n) for n in names])}")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def inverse_permutation(order: np.ndarray) -> np.ndarray:
    """``(n,) int64`` ``pos`` with ``pos[order[p]] == p`` for a permutation ``order``."""
    order = np.asarray(order, dtype=np.int64)
    pos = np.empty(order.shape[0], dtype=np.int64)
    pos[order] = np.arange(order.shape[0], dtype=np.int64)
    return pos


