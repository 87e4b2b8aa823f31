"""Typed errors of sdm.

Every error raised on bad user input is one of these; each subclasses the builtin a caller
would expect (ValueError, IndexError, KeyError, OSError) so generic handlers still work. The
message names the bad value and the limit it broke.
"""

from __future__ import annotations


class SdmError(Exception):
    """Base of every sdm error."""


class InvalidArgumentError(SdmError, ValueError):
    """A value of the right kind but outside what the call accepts (shape, dtype, range)."""


class IdOutOfRangeError(SdmError, IndexError):
    """A row id outside ``[0, num_rows)`` of its table."""


class InvalidOffsetsError(InvalidArgumentError):
    """CSR offsets that are mis-sized, do not start at 0, decrease, or do not end at nnz."""


class UnknownTableError(SdmError, KeyError):
    """A table name the store does not hold."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class ConfigError(InvalidArgumentError):
    """A configuration (preset name, TOML file, dataclass field) that cannot be used."""


class StoreError(SdmError, OSError):
    """A store directory that is missing, incomplete or unusable."""


class StoreExistsError(StoreError, FileExistsError):
    """``Store.create`` on a path that already exists."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """``Store.open`` on a path that holds no complete store."""


class CorruptStoreError(StoreError):
    """Damage found in a store file: bad manifest, checksum mismatch, truncated LMDB.

    ``path`` names the damaged file and ``table`` the table whose rows it holds, when known.
    """

    def __init__(self, message: str, *, path: str | None = None, table: str | None = None):
        super().__init__(message)
        self.path = path
        self.table = table

    def __str__(self) -> str:
        return self.args[0]


class ReadOnlyError(StoreError):
    """A write to a store opened read-only, or to a closed store."""
