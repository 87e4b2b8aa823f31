"""Calibrate the device model to a real disk (``sdm devices calibrate PATH``).

Random ``block_bytes`` reads with O_DIRECT (so the page cache is out of the way) at each
queue depth, ``q`` threads each keeping one read in flight, give the disk's mean latency,
IOPS and host CPU per read at that depth; large reads give its bandwidth. The reads go
through libc's ``pread`` in a Numba loop with the GIL released, as a ``direct`` tier's IO
engine issues them (:func:`sdm.tiers.io_engine.pread_pages`). The
device model of :mod:`sdm.kernels.devqueue` is then fitted: the model predicts
``latency(q) = max(latency, q / max_iops)`` and ``IOPS(q) = min(q / latency, max_iops)``,
and ``read_latency_us`` and ``max_read_iops`` are chosen to minimize the squared log error of
the latency over the queue depths measured; the fit error at each depth is reported beside
the measurement. The
result is a :class:`~sdm.devices.DeviceSpec` written as TOML, which a hierarchy names with
``device = "that.toml"``, so ``direct`` runs and ``modeled`` ones describe the same disk.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from dataclasses import dataclass

import numpy as np

from sdm.devices import DeviceSpec
from sdm.errors import InvalidArgumentError, StoreError
from sdm.tiers.io_engine import pread_pages
from sdm.validate import check_int, check_number

__all__ = ["calibrate", "Calibration", "QUEUE_DEPTHS"]

QUEUE_DEPTHS = (1, 2, 4, 8, 16, 32, 64)
_MIN_FILE_BYTES = 64 << 20
_BANDWIDTH_READ_BYTES = 1 << 20
_CHUNK = 8 << 20
#: Reads per call of the GIL-free read loop (at most :data:`_LOOP_BYTES` of them); the
#: deadline is checked between calls.
_LOOP_READS = 32
_LOOP_BYTES = 1 << 20


@dataclass
class Calibration:
    """What :func:`calibrate` measured and fitted.

    ``points``: per queue depth ``{queue_depth, iops, latency_us, cpu_us_per_read,
    model_iops, model_latency_us, iops_error, latency_error}`` (errors relative to the
    measurement; ``cpu_us_per_read``: the process's CPU time, the kernel's included, over the
    reads);
    ``device``: the fitted :class:`DeviceSpec`.
    """

    path: str
    block_bytes: int
    seconds: float
    points: list
    bandwidth_gbps: float
    device: DeviceSpec

    @property
    def units(self) -> float:
        return self.device.max_read_iops * self.device.read_latency_us * 1e-6

    def to_json(self) -> dict:
        d = self.device
        return {"path": self.path, "block_bytes": self.block_bytes, "seconds_per_depth": self.seconds,
                "points": self.points, "bandwidth_gbps": self.bandwidth_gbps, "units": self.units,
                "device": {"name": d.name, "read_latency_us": d.read_latency_us,
                           "max_read_iops": d.max_read_iops, "read_bandwidth_gbps": d.read_bandwidth_gbps,
                           "access_bytes": d.access_bytes, "capacity_gb": d.capacity_gb}}

    def to_toml(self) -> str:
        """The fitted device as a TOML table of DeviceSpec fields (``[device]``)."""
        d = self.device
        worst = max(abs(p["latency_error"]) for p in self.points)
        lines = [
            f"# Fitted by `sdm devices calibrate {self.path}`: O_DIRECT random {self.block_bytes} B "
            f"reads at queue depths {', '.join(str(p['queue_depth']) for p in self.points)}, "
            f"{self.seconds:g} s each; worst latency fit error {worst:.1%}.",
            "# Power and price are not measured: parameters (listed as unverified).",
            "[device]",
            f'name = "{d.name}"',
            f'media = "{d.media}"',
            f"access_bytes = {d.access_bytes}",
            f"read_latency_us = {d.read_latency_us:.3f}",
            f"max_read_iops = {d.max_read_iops:.0f}",
            f"read_bandwidth_gbps = {d.read_bandwidth_gbps:.4f}",
            f"active_watts = {d.active_watts}",
            f"idle_watts = {d.idle_watts}",
            f"capacity_gb = {d.capacity_gb:.1f}",
            f"usd_per_gb = {d.usd_per_gb}",
            'unverified = ["active_watts", "idle_watts", "usd_per_gb"]',
        ]
        return "\n".join(lines) + "\n"


def calibrate(path, *, queue_depths=QUEUE_DEPTHS, seconds: float = 1.0, file_bytes: int = 1 << 30,
              block_bytes: int = 4096, name: str | None = None, progress=None) -> Calibration:
    """Measure the device holding ``path`` and fit the device model to it.

    Args:
        path: a directory on the device (a ``file_bytes`` test file is written there and
            removed afterwards) or an existing file of at least 64 MiB (read only).
        queue_depths: reads in flight to measure at, each in ``[1, 256]``.
        seconds: measuring time per queue depth.
        file_bytes: size of the test file (in a directory); reads spread over all of it.
        block_bytes: the read size, a power of two >= 512.
        name: the device's name (default ``disk-<device id>``).
        progress: ``progress(text)`` called before each step, or None.

    Raises:
        InvalidArgumentError: bad arguments. StoreError: the file system refuses O_DIRECT.
    """
    path = os.fspath(path)
    depths = [check_int(q, "queue depth", lo=1, hi=256) for q in queue_depths]
    if not depths:
        raise InvalidArgumentError("queue_depths is empty")
    seconds = check_number(seconds, "seconds", lo=0, hi=600, lo_open=True)
    block_bytes = check_int(block_bytes, "block_bytes", lo=512, hi=1 << 24)
    if block_bytes & (block_bytes - 1):
        raise InvalidArgumentError(f"block_bytes {block_bytes} is not a power of two")
    say = progress or (lambda text: None)
    own = os.path.isdir(path)
    if own:
        file_bytes = check_int(file_bytes, "file_bytes", lo=_MIN_FILE_BYTES, hi=1 << 40)
        target = os.path.join(path, f".sdm-calibrate-{os.getpid()}.bin")
        say(f"writing a {file_bytes >> 20} MiB test file in {path}")
        _write_file(target, file_bytes)
    elif os.path.isfile(path):
        target = path
        file_bytes = os.path.getsize(path)
        if file_bytes < _MIN_FILE_BYTES:
            raise InvalidArgumentError(f"{path} has {file_bytes} bytes; calibrating needs at least "
                                       f"{_MIN_FILE_BYTES} (or give a directory)")
    else:
        raise InvalidArgumentError(f"{path!r} is neither a directory nor a file")
    try:
        fd = _open_direct(target)
        try:
            blocks = file_bytes // block_bytes
            probe = _aligned_buffer(block_bytes)
            _read_blocks(fd, np.zeros(1, dtype=np.int64), probe, block_bytes)  # compiles the loop, untimed
            measured = []
            for q in depths:
                say(f"queue depth {q}: {seconds:g} s of random {block_bytes} B reads")
                measured.append((q, *_random_reads(fd, blocks, block_bytes, q, seconds)))
            say("bandwidth: 1 MiB reads at queue depth 8")
            bandwidth = _bandwidth(fd, file_bytes, min(seconds, 2.0))
        finally:
            os.close(fd)
    finally:
        if own:
            os.unlink(target)
    return _fit(path, measured, bandwidth, block_bytes, seconds, name)


def _fit(path, measured, bandwidth, block_bytes, seconds, name) -> Calibration:
    by_depth = {q: (iops, lat, cpu) for q, iops, lat, cpu in measured}
    latency_us, max_iops = _fit_model(np.array([(q, lat) for q, (_, lat, _) in sorted(by_depth.items())]),
                                      max(iops for iops, _, _ in by_depth.values()))
    points = []
    for q, (iops, lat, cpu) in sorted(by_depth.items()):
        model_iops = min(q / (latency_us * 1e-6), max_iops)
        model_lat = max(latency_us, q / max_iops * 1e6)
        points.append({"queue_depth": q, "iops": iops, "latency_us": lat, "cpu_us_per_read": cpu,
                       "model_iops": model_iops, "model_latency_us": model_lat,
                       "iops_error": model_iops / iops - 1, "latency_error": model_lat / lat - 1})
    st = os.statvfs(path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path)))
    device = DeviceSpec(
        name=name or f"disk-{os.stat(path).st_dev:x}", media="measured (O_DIRECT random reads)",
        access_bytes=block_bytes, read_latency_us=latency_us, max_read_iops=max_iops,
        read_bandwidth_gbps=max(bandwidth, max_iops * block_bytes / 1e9), active_watts=10.0,
        idle_watts=5.0, capacity_gb=st.f_blocks * st.f_frsize / 1e9, usd_per_gb=0.1,
        sources=(("read_latency_us", "sdm devices calibrate: mean at queue depth 1"),
                 ("max_read_iops", "sdm devices calibrate: the highest measured throughput"),
                 ("read_bandwidth_gbps", "sdm devices calibrate: 1 MiB reads at queue depth 8")),
        unverified=frozenset({"active_watts", "idle_watts", "usd_per_gb"}))
    return Calibration(path, block_bytes, seconds, points, bandwidth, device)


def _fit_model(q_lat: np.ndarray, top_iops: float) -> tuple[float, float]:
    """``(latency_us, max_iops)`` of ``latency(q) = max(latency, q / max_iops)`` closest to the
    measured ``(q, latency_us)`` rows in squared log error (relative errors weigh alike at
    every depth): a grid around the lowest-depth latency and the highest throughput seen."""
    q, lat = q_lat[:, 0], q_lat[:, 1]
    lats = lat[0] * np.linspace(0.5, 1.5, 201)
    iops = top_iops * np.linspace(0.5, 2.0, 301)
    model = np.maximum(lats[:, None, None], q[None, None, :] / iops[None, :, None] * 1e6)
    err = ((np.log(model) - np.log(lat)[None, None, :]) ** 2).sum(axis=2)
    i, j = np.unravel_index(np.argmin(err), err.shape)
    return float(lats[i]), float(iops[j])


def _write_file(target: str, nbytes: int) -> None:
    rng = np.random.default_rng(0)
    chunk = rng.integers(0, 256, _CHUNK, dtype=np.uint8).tobytes()  # incompressible
    with open(target, "wb") as f:
        for start in range(0, nbytes, _CHUNK):
            f.write(chunk[: min(_CHUNK, nbytes - start)])
        f.flush()
        os.fsync(f.fileno())


def _open_direct(target: str) -> int:
    try:
        return os.open(target, os.O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        raise StoreError(f"cannot open {target} with O_DIRECT: {exc.strerror}") from None


def _random_reads(fd: int, blocks: int, block_bytes: int, q: int, seconds: float) -> tuple:
    """``(iops, mean latency us, CPU us per read)`` of ``q`` threads each reading random
    blocks back to back for about ``seconds``.

    Each thread reads up to :data:`_LOOP_READS` blocks per call of the IO engine's GIL-free loop
    and checks the time between calls, so a read waits on the disk, not on the GIL. Threads
    that each called ``os.preadv`` took the GIL back after every read, and on the 2-core AMD
    EPYC VM that wait, not the disk, set the rate past 8 in flight: 49-61K reads/s at depth 8,
    then 26-48K at 16-64 with a "latency" of 0.3-2.5 ms, where this loop read 63-113K/s at
    0.12-0.9 ms at depths 8-64 (bench/RESULTS.md). A thread's mean latency is its time over
    its reads (one in flight at a time); IOPS sums each thread's reads over its own time."""
    per_loop = max(1, min(_LOOP_READS, _LOOP_BYTES // block_bytes))
    # Buffers and generators made here: a thread that failed before the barrier would leave
    # every other party waiting at it.
    buffers = [_aligned_buffer(per_loop * block_bytes) for _ in range(q)]
    rngs = [np.random.default_rng([k, q]) for k in range(q)]
    done = [(0, 0)] * q
    failed: list[BaseException] = []
    start = threading.Barrier(q + 1)
    deadline = [0]

    def run(k: int) -> None:
        try:
            start.wait()
        except threading.BrokenBarrierError:  # the caller gave up before the window opened
            return
        n = 0
        t0 = now = time.perf_counter_ns()
        try:
            while n == 0 or now < deadline[0]:  # at least one loop, however short the window
                _read_blocks(fd, rngs[k].integers(0, blocks, per_loop), buffers[k], block_bytes)
                n += per_loop
                now = time.perf_counter_ns()
        except BaseException as exc:  # noqa: BLE001 - raised by the caller once all threads end
            failed.append(exc)
        done[k] = (n, now - t0)

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(q)]
    try:
        for t in threads:
            t.start()
        cpu0 = time.process_time_ns()
        deadline[0] = time.perf_counter_ns() + int(seconds * 1e9)
        start.wait()
    except BaseException:
        start.abort()  # the threads started return; none is left at the barrier
        raise
    for t in threads:
        t.join()
    cpu = time.process_time_ns() - cpu0
    if failed:
        raise failed[0]
    reads = sum(n for n, _ in done)
    iops = sum(n / ns for n, ns in done) * 1e9
    latency_us = float(np.mean([ns / n for n, ns in done])) / 1e3
    return iops, latency_us, cpu / reads / 1e3


def _aligned_buffer(nbytes: int) -> np.ndarray:
    """``(nbytes,)`` uint8 starting at a page-aligned address, as O_DIRECT needs."""
    raw = np.empty(nbytes + mmap.PAGESIZE, dtype=np.uint8)
    skip = -raw.ctypes.data % mmap.PAGESIZE
    return raw[skip:skip + nbytes]  # a view: it keeps ``raw`` alive


def _read_blocks(fd: int, blocks: np.ndarray, buf: np.ndarray, block_bytes: int) -> None:
    """Read ``blocks`` ``(n,)`` int64 of ``fd`` into ``buf`` (aligned, at least ``n x
    block_bytes``), with the GIL released. A block whose read failed is read once more with
    ``os.preadv`` for its errno (the IO engine does the same).

    Raises:
        StoreError: a read failed again or came back short.
    """
    got = np.empty(blocks.shape[0], dtype=np.int64)
    pread_pages(fd, blocks, 0, 1, buf.ctypes.data, block_bytes, got)
    for j in np.flatnonzero(got != block_bytes).tolist():
        offset = int(blocks[j]) * block_bytes
        try:
            again = os.preadv(fd, [memoryview(buf[j * block_bytes:(j + 1) * block_bytes])], offset)
        except OSError as exc:
            raise StoreError(f"an O_DIRECT read of {block_bytes} B at offset {offset} failed: "
                             f"{exc.strerror}") from None
        if again != block_bytes:
            raise StoreError(f"an O_DIRECT read of {block_bytes} B at offset {offset} returned {again} B")


def _bandwidth(fd: int, file_bytes: int, seconds: float) -> float:
    """GB/s of 1 MiB O_DIRECT reads, 8 in flight."""
    chunks = max(1, file_bytes // _BANDWIDTH_READ_BYTES)
    done = [0] * 8
    deadline = time.perf_counter() + seconds

    def run(k: int) -> None:
        buf = mmap.mmap(-1, _BANDWIDTH_READ_BYTES)
        i = k
        while time.perf_counter() < deadline:
            done[k] += os.preadv(fd, [buf], (i % chunks) * _BANDWIDTH_READ_BYTES)
            i += 8
        buf.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - t0) / 1e9
