"""One QPS everywhere: a replay whose "QPS at SLA" is the host model's per-host figure.

``sdm replay`` and ``sdm run`` serve a trace one request at a time, which measures hit rates,
IO and per-request cost but no host's throughput. :func:`replay_on_host` runs the replay
and, over the same store, :func:`~sdm.host.predict.predict` for a host, and reports that
QPS at the SLA (with the host's name) as the replay's.
"""

from __future__ import annotations

import os
import tempfile

from sdm.host.predict import predict
from sdm.host.profile import UnsupportedHierarchy
from sdm.host.simulate import DEFAULT_ARRIVALS
from sdm.host.spec import resolve_host
from sdm.replay.live import DEFAULT_DIM, ReplayResult, build_store, check_workdir, config_devices, replay
from sdm.replay.queueing import DEFAULT_SLA_US
from sdm.store.config import resolve_config, with_io_mode
from sdm.trace.format import Trace, load
from sdm.validate import check_int

__all__ = ["replay_on_host", "attach_host", "DEFAULT_HOST"]

DEFAULT_HOST = "this-machine"


def attach_host(result: ReplayResult, trace, config, store, *, host=DEFAULT_HOST, disk=None,
                sla_us: float = DEFAULT_SLA_US, model: str | None = None, request_size: int | None = None,
                arrivals: int = DEFAULT_ARRIVALS, seed: int = 0, fit_model: bool = False) -> ReplayResult:
    """Set ``result``'s QPS at the SLA to the host model's for ``host`` serving ``trace``
    under ``config`` from ``store`` (the store the replay read); returns ``result``. A
    hierarchy the host model does not cover keeps no QPS (None), and ``extra["host_model"]``
    says why."""
    config = resolve_config(config)
    if result.io_mode != config.io_mode:
        config = with_io_mode(config, result.io_mode)
    spec = resolve_host(host, disk=disk)
    try:
        found = predict(trace, config, spec, model=model, sla_us=sla_us, store=store,
                        request_size=request_size, arrivals=arrivals, seed=seed, rates=[],
                        fit_model=fit_model)
    except UnsupportedHierarchy as exc:
        result.extra["host_model"] = {"host": spec.name, "error": str(exc)}
        return result
    result.set_sla(found.sla, spec.name, config_devices(config))
    result.extra["host_model"] = {"host": spec.name, "bottleneck": found.bottleneck,
                                  "utilization": found.utilization, "cores": spec.cores}
    return result


def replay_on_host(trace, config="dram", *, host=DEFAULT_HOST, disk=None, sla_us: float = DEFAULT_SLA_US,
                   store=None, model: str | None = None, dim: int = DEFAULT_DIM, fmt: str = "fp32",
                   request_size: int | None = None, seed: int = 0, workdir=None,
                   arrivals: int = DEFAULT_ARRIVALS, **options) -> ReplayResult:
    """:func:`sdm.replay.live.replay` (``options`` go to it) with the per-host QPS at the SLA
    of :func:`attach_host`; one store serves both (built under ``workdir`` when None)."""
    check_workdir(workdir)  # before the temporary store and its seeded rows, as replay() checks
    seed = check_int(seed, "seed", lo=0)
    if model is not None:
        from sdm.model import get_preset

        dim = get_preset(model).dim
    with tempfile.TemporaryDirectory(prefix="sdm-replay-host-", dir=workdir) as tmp:
        tr = trace if isinstance(trace, Trace) else load(trace)
        try:
            if store is None:
                store = build_store(os.path.join(tmp, "store"), tr.table_sizes, dim=dim, fmt=fmt, seed=seed,
                                    progress=options.get("progress"))
            result = replay(tr, config, store=store, model=model, dim=dim, fmt=fmt, sla_us=sla_us,
                            request_size=request_size, seed=seed, workdir=workdir, **options)
            if sla_us is not None:
                attach_host(result, tr, config, store, host=host, disk=disk, sla_us=sla_us, model=model,
                            request_size=request_size, arrivals=arrivals, seed=seed,
                            fit_model=options.get("fit_model", False))
        finally:
            if tr is not trace:
                tr.close()
    return result
