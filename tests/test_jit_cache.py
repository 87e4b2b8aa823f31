"""Numba's on-disk cache never serves a stale sdm kernel.

Numba stamps a cache entry with its own source file only; a kernel that inlines a jitted
helper from another file would keep running the old helper after an edit there. sdm stamps
its kernels with a digest of the whole package instead (``sdm.kernels.jit``). The test works
on a copy of the package with two small modules added, a helper and a kernel calling it from
another file, so it compiles in a second.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SDM = Path(__file__).resolve().parents[1] / "sdm"

HELPER = '''
from sdm.kernels.jit import jit


@jit
def helper(x):
    return x + {value}
'''

KERNEL = '''
from sdm.kernels.jit import jit
from sdm.kernels._probe_helper import helper


@jit
def kernel(x):
    return helper(x) * 10
'''

CHILD = '''
import json
from sdm.kernels._probe_kernel import kernel
result = kernel(1)
print(json.dumps({"result": int(result), "hits": sum(kernel.stats.cache_hits.values()),
                  "misses": sum(kernel.stats.cache_misses.values())}))
'''


@pytest.fixture
def package(tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(SDM, root / "sdm", ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    (root / "sdm" / "kernels" / "_probe_helper.py").write_text(HELPER.format(value=1))
    (root / "sdm" / "kernels" / "_probe_kernel.py").write_text(KERNEL)
    return root


def run(root: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["PYTHONPATH"] = str(root)
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=root, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_editing_a_helper_in_another_file_recompiles_the_kernel(package):
    first = run(package)
    assert first == {"result": 20, "hits": 0, "misses": 1}  # compiled, written to the cache
    assert run(package) == {"result": 20, "hits": 1, "misses": 0}  # loaded, not compiled
    # Only the helper's file changes; the kernel's own file is untouched.
    (package / "sdm" / "kernels" / "_probe_helper.py").write_text(HELPER.format(value=2))
    assert run(package) == {"result": 30, "hits": 0, "misses": 1}  # recompiled: the new helper
    assert run(package) == {"result": 30, "hits": 1, "misses": 0}


def test_an_edit_anywhere_in_the_package_recompiles(package):
    run(package)
    cli = package / "sdm" / "cli" / "__init__.py"
    cli.write_text(cli.read_text() + "\n# an edit far from the kernel\n")
    assert run(package)["misses"] == 1


def test_other_packages_keep_numbas_own_rule():
    from numba.core import caching

    import sdm.kernels.jit as jit

    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    ours = [c for c in impl._locator_classes if c.__name__.startswith("SdmPackage")]
    assert len(ours) == 3
    foreign = Path(caching.__file__)  # a file outside sdm: none of ours claims it
    assert all(c.from_function(jit.source_digest, str(foreign)) is None for c in ours)
