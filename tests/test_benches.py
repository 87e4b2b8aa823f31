"""Every bench in bench/ takes ``--quick`` (``make bench`` runs each with it) and has a smoke
test under tests/ that runs it, so none can rot unseen. The smoke tests check that each bench
prints the CPU model with its results (``helpers.assert_prints_cpu``)."""

from __future__ import annotations

import glob
import os

import pytest

from helpers import BENCH

TESTS = os.path.dirname(os.path.abspath(__file__))
BENCHES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(BENCH, "bench_*.py")))


def test_the_benches_are_found():
    assert {"bench_compile", "bench_hierarchy", "bench_updates"} <= set(BENCHES)


@pytest.mark.parametrize("name", BENCHES)
def test_every_bench_takes_quick_and_has_a_smoke_test(name):
    source = open(os.path.join(BENCH, f"{name}.py")).read()
    assert '"--quick"' in source, f"{name} takes no --quick (make bench runs every bench with it)"
    smoke = [os.path.basename(p) for p in glob.glob(os.path.join(TESTS, "test_*.py"))
             if os.path.basename(p) != os.path.basename(__file__)
             and (f'"{name}"' in (text := open(p).read()) or f"{name}.py" in text or f"import {name}" in text)]
    assert smoke, f"no smoke test runs bench/{name}.py"
