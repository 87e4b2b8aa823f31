import atexit
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings

from helpers import rows_of, write_store

# CI runs a smaller profile; `HYPOTHESIS_PROFILE=dev` (the default) explores more.
settings.register_profile("ci", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=100, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# The report's result cache (sdm.report.cache) of a test run: its own, never the user's.
_CACHE = tempfile.mkdtemp(prefix="sdm-test-cache-")
os.environ["SDM_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def make_store(tmp_path_factory):
    """``make_store(specs, rows=rows_of, **create) -> Path``: a new store in a fresh temp
    directory with every table of ``specs`` written by ``rows(spec)`` (see helpers.write_store).
    Session-scoped, so module-scoped fixtures can build their store with it."""
    def make(specs, rows=rows_of, **create):
        return write_store(tmp_path_factory.mktemp("store") / "s", specs, rows, **create)
    return make
