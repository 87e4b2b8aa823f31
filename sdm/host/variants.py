"""A request profile with one of the host's measured inputs scaled: CPU speed, SCM latency, SCM IOPS.

A profile (:class:`~sdm.host.profile.RequestProfile`) splits into what the trace and the cache
decide (per request: rows, hits, device blocks) and what the host's parts cost (CPU time
per request, each device's latency and spacing). :func:`vary_profile` changes only the
second part, exactly as :func:`~sdm.host.profile.build_profile` would have made it with a
faster core or a different device, without serving the trace again: core speed divides the
measured CPU times (as ``HostSpec.core_speed`` does), and an SCM device is rebuilt from its
:class:`~sdm.devices.DeviceSpec` with ``read_latency_us`` or ``max_read_iops`` scaled, through
the same :func:`~sdm.host.profile.device_of` the profile used. The DRAM device is left as is.
"""

from __future__ import annotations

import dataclasses

from sdm.errors import ConfigError
from sdm.host.profile import RequestProfile, device_of
from sdm.validate import check_number

__all__ = ["vary_profile"]


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
            devices[i] = device_of(spec, devices[i].group, k if len(scm) > 1 else None)
    if speed == 1.0 and devices == list(profile.devices):
        return profile
    return dataclasses.replace(
        profile, devices=devices, cpu_emb_ns=profile.cpu_emb_ns / speed,
        cpu_bottom_ns=profile.cpu_bottom_ns / speed, cpu_top_ns=profile.cpu_top_ns / speed,
        bottom_ns_per_sample=profile.bottom_ns_per_sample / speed,
        top_ns_per_sample=profile.top_ns_per_sample / speed)
