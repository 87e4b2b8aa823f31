"""A request profile with one of the host's measured inputs scaled: CPU speed, SCM latency, SCM IOPS.

A profile (:class:`~sdm.host.profile.RequestProfile`) splits into what the trace and the cache
decide (per request: rows, hits, device blocks) and what the host's parts cost (CPU time
per request, each device's latency and spacing). :func:`vary_profile` changes only the
second part, exactly as :func:`~sdm.host.profile.build_profile` would have made it with a
faster core or a different device, without serving the trace again: core speed divides the
measured CPU times (as ``HostSpec.core_speed`` does), and an SCM device is rebuilt from its
:class:`~sdm.devices.DeviceSpec` with ``read_latency_us`` or ``max_read_iops`` scaled, through
the same :func:`~sdm.host.profile.device_of` the profile used. The DRAM device is left as is.

:func:`with_scm_devices` changes the host's count of SCM devices: the same block reads (the
profile keeps each SCM batch's block numbers) striped over ``count`` devices by block number,
as :func:`~sdm.host.profile.build_profile` stripes them for a host of ``count`` devices (a test
keeps the two equal). Each device is the profile's one, so ``count`` devices give ``count``
times the units: more device throughput, and fewer reads queued on each device per batch.
"""

from __future__ import annotations

import dataclasses

from sdm.errors import ConfigError
import numpy as np

from sdm.host.profile import RequestProfile, device_of
from sdm.host.spec import MAX_DEVICES, ScmSlot
from sdm.validate import check_int, check_number

__all__ = ["vary_profile", "with_scm_devices"]


def with_scm_devices(profile: RequestProfile, count: int) -> RequestProfile:
    """``profile`` on a host whose SCM tier has ``count`` devices (each the profile's SCM
    device), its blocks striped over them by block number (device ``block % count``). The
    CPU times, hits and batch order are the profile's; only each SCM batch's parts and the
    device list change. Returns ``profile`` itself when it already has ``count`` devices.

    Raises:
        ConfigError: ``count`` not an integer in [1, 1024]; a profile without an SCM tier or
        without its block numbers (``scm_block_ptr``).
    """
    count = check_int(count, "SCM devices per host", lo=1, hi=MAX_DEVICES, error=ConfigError)
    scm = [i for i, d in enumerate(profile.devices) if d.group != "dram"]
    if not scm:
        raise ConfigError(f"profile of {profile.config!r} has no SCM tier to put {count} devices in")
    if len(scm) == count:
        return profile
    if profile.scm_block_ptr is None or profile.scm_block_ids is None:
        raise ConfigError(f"profile of {profile.config!r} keeps no SCM block numbers: it cannot be striped "
                          f"over {count} devices (build it again with sdm.host.profile.build_profile)")
    first = profile.devices[scm[0]]
    name = first.name.rsplit("#", 1)[0] if len(scm) > 1 else first.name
    devices = [d for d in profile.devices if d.group == "dram"]
    offset = len(devices)  # build_profile: the DRAM device, then the SCM tier's
    devices += [dataclasses.replace(first, name=name if count == 1 else f"{name}#{i}") for i in range(count)]
    ptr, ids = profile.scm_block_ptr, profile.scm_block_ids
    nb = profile.batch_qd.shape[0]
    per_batch = np.diff(ptr)
    grid = np.bincount(np.repeat(np.arange(nb, dtype=np.int64), per_batch) * count + ids % count,
                       minlength=nb * count).reshape(nb, count)
    devs, reads = [], []
    for b in range(nb):  # a Python loop over batches, once per count
        if per_batch[b]:
            used = np.flatnonzero(grid[b])
            devs.append(used + offset)
            reads.append(grid[b, used])
        else:
            lo, hi = profile.sub_ptr[b], profile.sub_ptr[b + 1]
            devs.append(profile.sub_dev[lo:hi])
            reads.append(profile.sub_reads[lo:hi])
    sub_ptr = np.concatenate(([0], np.cumsum([d.shape[0] for d in devs]))).astype(np.int64)
    cat = (lambda parts: np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64))
    host = profile.host
    slot = host.scm[0] if host.scm else ScmSlot()
    host = dataclasses.replace(host, scm=(ScmSlot(slot.device, count),) + tuple(host.scm[1:]))
    return dataclasses.replace(profile, host=host, devices=devices, sub_ptr=sub_ptr, sub_dev=cat(devs),
                               sub_reads=cat(reads))


def vary_profile(profile: RequestProfile, scm_device, *, core_speed: float = 1.0, scm_latency: float = 1.0,
                 scm_iops: float = 1.0) -> RequestProfile:
    """``profile`` on a host whose cores are ``core_speed`` times as fast and whose SCM device
    (``scm_device``: the :class:`~sdm.devices.DeviceSpec` or preset the profile's SCM tier was
    built with; ignored for a profile without SCM) has ``scm_latency`` times the read latency
    and ``scm_iops`` times the random-read IOPS. Factors are numbers > 0; 1 leaves an input as
    it was. Returns a new profile; ``profile`` is not changed.

    Raises:
        ConfigError: a factor that is not a number > 0.
    """
    from sdm.devices import get_device

    speed = check_number(core_speed, "core_speed factor", lo=0, lo_open=True, error=ConfigError)
    lat = check_number(scm_latency, "SCM read latency factor", lo=0, lo_open=True, error=ConfigError)
    iops = check_number(scm_iops, "SCM IOPS factor", lo=0, lo_open=True, error=ConfigError)
    devices = list(profile.devices)
    if (lat != 1.0 or iops != 1.0) and any(d.group != "dram" for d in devices):
        spec = get_device(scm_device)
        spec = dataclasses.replace(spec, read_latency_us=spec.read_latency_us * lat,
                                   max_read_iops=spec.max_read_iops * iops,
                                   # the bandwidth cap moves with the IOPS, so that the IOPS is what
                                   # changes the device's spacing (as a device with more units would)
                                   read_bandwidth_gbps=spec.read_bandwidth_gbps * iops)
        scm = [i for i, d in enumerate(devices) if d.group != "dram"]
        for k, i in enumerate(scm):
            devices[i] = dataclasses.replace(device_of(spec, devices[i].group, k if len(scm) > 1 else None),
                                             read_cpu_ns=devices[i].read_cpu_ns,
                                             read_threads=devices[i].read_threads)
    if speed == 1.0 and devices == list(profile.devices):
        return profile
    devices = [dataclasses.replace(d, read_cpu_ns=d.read_cpu_ns / speed) for d in devices]
    return dataclasses.replace(
        profile, devices=devices, cpu_emb_ns=profile.cpu_emb_ns / speed,
        cpu_bottom_ns=profile.cpu_bottom_ns / speed, cpu_top_ns=profile.cpu_top_ns / speed,
        batch_after_ns=None if profile.batch_after_ns is None else profile.batch_after_ns / speed,
        batch_cold_ns=None if profile.batch_cold_ns is None else profile.batch_cold_ns / speed,
        bottom_ns_per_sample=profile.bottom_ns_per_sample / speed,
        top_ns_per_sample=profile.top_ns_per_sample / speed)
