"""The store's manifest: table specs, their block geometry and committed generations.

The manifest (``manifest.json``) is the commit point of a store: every change is written to
a temporary file, fsynced and renamed over it, so a reader sees the old manifest or the new
one, never a mix. A SHA-256 over its canonical JSON detects damage.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from functools import cached_property

from sdm.errors import CorruptStoreError, InvalidArgumentError
from sdm.formats import check_dim, check_format, row_bytes
from sdm.kernels.serve import TABLE_SHIFT
from sdm.validate import check_int

__all__ = ["TableSpec", "TableLayout", "Manifest", "MANIFEST_NAME", "SCHEMA_VERSION", "LMDB_VALUE_BYTES"]

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = 1
STORE_FORMAT = "sdm-store"
# One LMDB value is one device block: a 4 KiB overflow page holds 4096 - 16 bytes (LMDB's
# page header), of which 4 carry the block's CRC32, the rest whole rows.
LMDB_PAGE_BYTES = 4096
LMDB_VALUE_BYTES = LMDB_PAGE_BYTES - 16
CHECKSUM_BYTES = 4
MAX_TABLES = 2**16
#: Rows of one table: a row id fits the low bits of a cache key (``table << TABLE_SHIFT | row``).
MAX_ROWS = 1 << TABLE_SHIFT
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")  # fullmatch: `$` would admit a trailing newline


@dataclass(frozen=True)
class TableSpec:
    """An embedding table: ``num_rows`` rows of ``dim`` values stored in row format ``fmt``."""

    name: str
    num_rows: int
    dim: int
    fmt: str = "fp32"

    def __post_init__(self):
        # names never become paths (files are named by table id), but "." and ".." are refused
        # anyway so no later use can turn one into a directory reference
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name) or not self.name.strip("."):
            raise InvalidArgumentError(
                f"table name {self.name!r} must be 1-128 characters of letters, digits, '_', '.', '-' "
                f"(not only dots)"
            )
        # numpy integers are accepted and stored as int (the manifest is JSON)
        object.__setattr__(self, "num_rows", check_int(self.num_rows, f"table {self.name!r}: num_rows",
                                                       lo=1, hi=MAX_ROWS))
        object.__setattr__(self, "dim", check_dim(self.dim, f"table {self.name!r}: dim"))
        check_format(self.fmt)

    @cached_property  # read on every batch's hot path: computed once (frozen: never changes)
    def row_bytes(self) -> int:
        return row_bytes(self.fmt, self.dim)


@dataclass(frozen=True)
class TableLayout:
    """A table as stored: its spec, its id in LMDB keys, block geometry, committed generation.

    ``generation`` is None until the table's rows have been written once.
    """

    spec: TableSpec
    table_id: int
    rows_per_block: int
    generation: int | None = None

    @classmethod
    def for_spec(cls, spec: TableSpec, table_id: int) -> "TableLayout":
        payload = LMDB_VALUE_BYTES - CHECKSUM_BYTES
        return cls(spec, table_id, max(1, payload // spec.row_bytes))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def num_blocks(self) -> int:
        return -(-self.spec.num_rows // self.rows_per_block)

    def block_rows(self, block: int) -> int:
        """Rows held by ``block`` (the last block may be short)."""
        return min(self.rows_per_block, self.spec.num_rows - block * self.rows_per_block)

    def to_json(self) -> dict:
        return {**asdict(self.spec), "table_id": self.table_id,
                "rows_per_block": self.rows_per_block, "generation": self.generation}

    @classmethod
    def from_json(cls, data: dict) -> "TableLayout":
        spec = TableSpec(data["name"], data["num_rows"], data["dim"], data["fmt"])
        layout = cls(spec, data["table_id"], data["rows_per_block"], data["generation"])
        if not isinstance(layout.rows_per_block, int) or layout.rows_per_block < 1:
            raise ValueError(f"rows_per_block {layout.rows_per_block!r}")
        if layout.generation is not None and not isinstance(layout.generation, int):
            raise ValueError(f"generation {layout.generation!r}")
        return layout


@dataclass(frozen=True)
class Manifest:
    """Everything a store knows about itself besides its rows."""

    tables: tuple[TableLayout, ...]
    next_generation: int = 1

    def table(self, name: str) -> TableLayout | None:
        for layout in self.tables:
            if layout.name == name:
                return layout
        return None

    def with_table(self, layout: TableLayout, next_generation: int) -> "Manifest":
        tables = tuple(layout if t.table_id == layout.table_id else t for t in self.tables)
        return Manifest(tables, next_generation)

    def _body(self) -> dict:
        return {"format": STORE_FORMAT, "schema_version": SCHEMA_VERSION,
                "next_generation": self.next_generation,
                "tables": [t.to_json() for t in self.tables]}

    def write(self, directory: str) -> None:
        """Atomically replace ``directory/manifest.json`` (temp file, fsync, rename, fsync dir)."""
        body = self._body()
        digest = hashlib.sha256(_canonical(body)).hexdigest()
        text = json.dumps({**body, "sha256": digest}, indent=1, sort_keys=True)
        final = os.path.join(directory, MANIFEST_NAME)
        tmp = final + f".tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        fsync_dir(directory)

    @classmethod
    def read(cls, directory: str) -> "Manifest":
        """Read and verify a manifest; any damage raises :class:`CorruptStoreError`."""
        path = os.path.join(directory, MANIFEST_NAME)
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptStoreError(f"manifest {path} is not valid JSON: {exc}", path=path) from None
        if not isinstance(data, dict) or data.get("format") != STORE_FORMAT:
            raise CorruptStoreError(f"manifest {path} is not an sdm store manifest", path=path)
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise CorruptStoreError(
                f"manifest {path} has schema_version {version!r}; this sdm reads version {SCHEMA_VERSION}",
                path=path)
        digest = data.pop("sha256", None)
        if digest != hashlib.sha256(_canonical(data)).hexdigest():
            raise CorruptStoreError(f"manifest {path} fails its SHA-256 checksum (damaged)", path=path)
        try:
            tables = tuple(TableLayout.from_json(t) for t in data["tables"])
            manifest = cls(tables, int(data["next_generation"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptStoreError(f"manifest {path} has an invalid entry: {exc}", path=path) from None
        ids = [t.table_id for t in tables]
        if ids != list(range(len(tables))) or len({t.name for t in tables}) != len(tables):
            raise CorruptStoreError(f"manifest {path} has duplicate or misnumbered tables", path=path)
        return manifest


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
