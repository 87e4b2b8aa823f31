"""Independent peers of the differential tests (torch, libcachesim, ray): never runtime deps.

A test that compares against a peer calls :func:`require` and carries the ``peers`` marker.
Where the peer is not installed the test skips; in CI's peer phase, which installed them
(``SDM_REQUIRE_PEERS=1``), a missing peer fails instead, so a broken install cannot pass as
a skip.
"""

from __future__ import annotations

import importlib
import os

import pytest

REQUIRED = os.environ.get("SDM_REQUIRE_PEERS") == "1"


def require(name: str):
    """The peer module ``name``; skips the test when it is missing (fails when REQUIRED)."""
    if REQUIRED:
        return importlib.import_module(name)
    return pytest.importorskip(name)
