"""The embedded default job (``sdm run``, so ``make run``): replay the bundled trace through
the ``dram``, ``sdm-nand`` and ``sdm-3dxp`` hierarchies and compare what each did.

One store is built for the trace (deterministic random rows) and opened under each preset in
turn, so every preset serves the same rows: their pooled results must agree exactly. Needs no
download and no server; when the repository's ``traces/default.npz`` is not at hand (an
installed package) the same trace is generated from its seeded profile.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sdm.replay.queueing import DEFAULT_SLA_US
from sdm.replay.live import DEFAULT_DIM, ReplayResult, build_store, replay
from sdm.trace.format import load

__all__ = ["DEMO_PRESETS", "DEFAULT_TRACE", "default_trace", "run_demo"]

DEMO_PRESETS = ("dram", "sdm-nand", "sdm-3dxp")
DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "traces" / "default.npz"
# traces/README.md: how default.npz was made
_DEFAULT_PROFILE = dict(profile="meta-2021", seed=0, table_size="100000", batch_size=256, batches=32)


def default_trace(workdir) -> str:
    """The bundled ``traces/default.npz``, or the same trace generated into ``workdir``."""
    if DEFAULT_TRACE.is_file():
        return str(DEFAULT_TRACE)
    from sdm.trace.generate import generate_to

    params = dict(_DEFAULT_PROFILE)
    return generate_to(os.path.join(workdir, "default.npz"), params.pop("profile"), **params)


def run_demo(presets=DEMO_PRESETS, *, trace=None, dim: int = DEFAULT_DIM, fmt: str = "fp32",
             sla_us: float = DEFAULT_SLA_US, max_batches: int | None = None, workdir=None,
             progress: bool | None = None, each=None) -> list[ReplayResult]:
    """Replay ``trace`` (default: :func:`default_trace`) through each preset over one store
    built under ``workdir`` (a temp dir by default). Returns one
    :class:`~sdm.replay.live.ReplayResult` per preset, each with ``extra["checksum"]``: the
    SHA-256 of its pooled bytes. ``each(result, trace, store, preset)``, when given, is called
    after each replay while the store exists (the host model attaches its QPS there,
    :func:`sdm.host.attach_host`)."""
    with tempfile.TemporaryDirectory(prefix="sdm-demo-", dir=workdir) as tmp:
        path = trace if trace is not None else default_trace(tmp)
        with load(path) as tr:
            store = build_store(os.path.join(tmp, "store"), tr.table_sizes, dim=dim, fmt=fmt, progress=False)
            runs = []
            for preset in presets:
                runs.append(replay(tr, preset, store=store, sla_us=sla_us, max_batches=max_batches,
                                   checksum=True, progress=progress))
                if each is not None:
                    each(runs[-1], tr, store, preset)
            return runs
