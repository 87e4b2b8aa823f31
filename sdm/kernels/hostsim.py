"""Discrete-event simulation of one serving host: requests on C cores and shared devices.

A request ``n`` arrives at ``arrivals[n]`` and is an instance of profiled request
``r = n % R``. It has up to three CPU tasks and one chain of device batches:

* its embedding task (``cpu_emb[r]``: dedup, probe, pooling) and, with a DLRM, its bottom
  MLP (``cpu_bottom[r]``) are queued for a core at arrival, in that order;
* its device batches are issued one after another (the store serves a request's tables in
  turn): batch ``b`` reads ``sub_reads[k]`` blocks from device ``sub_dev[k]`` for ``k`` in
  ``sub_ptr[b]:sub_ptr[b+1]`` (a tier's blocks striped over its devices), ``batch_qd[b]`` in
  flight per device, on the units each device's earlier batches left free
  (:func:`sdm.kernels.devqueue.reserve`, the live store's device model); the next batch is
  issued when the last read of this one completes. The first is issued when the embedding
  task ends, or, with ``overlap``, when it starts on a core: a ``paced`` store charges a
  request's reads as its CPU work reaches them and waits for them once, at the request's
  end, so its CPU work runs while the devices serve (:func:`sdm.tiers.clock.paced_request`).
  So with ``overlap`` batch ``b`` also issues no earlier than ``batch_after_ns[b]`` of CPU
  time into the embedding task, plus ``(f - 1) x batch_cold_ns[b]`` on a core whose cold
  factor is ``f`` (the part of a cold task's extra time spent before the batch): the store
  reaches a table's reads only after the tables before it;
* a read that costs the host CPU (``dev_read_cpu[d]`` ns on device ``d``: direct IO's, in the
  kernel) makes its batch CPU work too: the batch's reads x their CPU, split into
  ``min(batch_qd[b], cores, reads, dev_read_threads[d])`` equal tasks (a 0 there: no bound)
  queued for the cores when the batch issues (the threads that read run side by side, beside
  the device: reader threads, one job per read at most, or with kernel AIO the request's own
  thread, 1);
  the batch is done when its reads and those tasks are. They are work the device's reads
  bring, not the request's: no cold-core factor and no stall applies to them;
* when the embedding task and its reads and the bottom MLP are done, its top task
  (``cpu_top[r]``: interaction and top MLP) is queued; the request completes when that ends.

What the machine itself takes (:mod:`sdm.host.platform`, measured; zeros on an ideal host):
``stall_ns[n, s]`` is added to CPU task ``s`` of arrival ``n`` (the time its core was taken
from it while it ran), and a request that blocks wakes late: one that finds a free worker
starts ``wake_ns[n, 0]`` after its arrival, and one that read from a device continues
``wake_ns[n, 1]`` after its last read (with ``overlap``, only if its embedding task ended
before that read: otherwise the thread never slept). A task also runs slower on a core that
was idle for a while before it: its time is multiplied by row ``cold_row[n]`` of
``cold_factor`` interpolated at the core's idle time in ``cold_gap_ns`` (measured,
:mod:`sdm.host.profile`: row ``s`` holds the ``s``-th smallest measured slowdown at every
gap, so each request draws its rank; none: 1).

Cores take CPU tasks first come first served, one task per core at a time, the core idle
the shortest time first (the warmest); a task of zero time needs no core and waits for none. Events are processed in time order, ties in the order they were made,
so a run is a deterministic function of its inputs.
"""

from __future__ import annotations

import numpy as np

from sdm.kernels.devqueue import reserve
from sdm.kernels.jit import jit

__all__ = ["simulate_host"]

_ARRIVAL = 0
_CPU_DONE = 1  # a task that held a core
_FREE_DONE = 2  # a task of zero time
_READS_DONE = 3
_WOKEN = 4  # a request that found a free worker starts serving
_READS_WOKEN = 5  # a request's thread is back from its last device wait
_READS_START = 6  # with overlap: a request's embedding task started, and so its reads
_BATCH_DUE = 7  # with overlap: the embedding task's CPU work reached a batch that waited for it


@jit
def _before(h_time, h_seq, i, j):
    """Whether heap entry ``i`` comes before ``j``: earlier, or as early and made first."""
    return h_time[i] < h_time[j] or (h_time[i] == h_time[j] and h_seq[i] < h_seq[j])


@jit
def _swap(h_time, h_seq, h_kind, h_arg, i, j):
    h_time[i], h_time[j] = h_time[j], h_time[i]
    h_seq[i], h_seq[j] = h_seq[j], h_seq[i]
    h_kind[i], h_kind[j] = h_kind[j], h_kind[i]
    h_arg[i], h_arg[j] = h_arg[j], h_arg[i]


@jit
def _push(h_time, h_seq, h_kind, h_arg, size, seq, t, kind, arg):
    """Push onto the binary min-heap keyed (time, seq); returns the new size."""
    i = size
    h_time[i], h_seq[i], h_kind[i], h_arg[i] = t, seq, kind, arg
    while i > 0:
        parent = (i - 1) >> 1
        if _before(h_time, h_seq, parent, i):
            break
        _swap(h_time, h_seq, h_kind, h_arg, i, parent)
        i = parent
    return size + 1


@jit
def _pop(h_time, h_seq, h_kind, h_arg, size):
    """Remove the heap's top into slot ``size - 1`` (read it there); returns the new size."""
    last = size - 1
    _swap(h_time, h_seq, h_kind, h_arg, 0, last)
    i = 0
    while True:
        child = 2 * i + 1
        if child >= last:
            break
        if child + 1 < last and _before(h_time, h_seq, child + 1, child):
            child += 1
        if _before(h_time, h_seq, i, child):
            break
        _swap(h_time, h_seq, h_kind, h_arg, i, child)
        i = child
    return last


@jit
def _room(fifo, head, tail, more):
    """``fifo``'s waiting tasks ``[head:tail]`` moved to its front, in a buffer with room for
    ``more`` after them (grown to twice what they need when they need over half of it, so each
    move frees at least as many slots as it copies)."""
    waiting = tail - head
    out = fifo
    if 2 * (waiting + more) > fifo.shape[0]:
        out = np.empty(2 * (waiting + more), dtype=np.int64)
    for i in range(waiting):  # forward: in place, each task moves to a lower index
        out[i] = fifo[head + i]
    return out


@jit
def simulate_host(arrivals, num_profiles, cpu_emb, cpu_bottom, cpu_top, batch_ptr, batch_qd, sub_ptr,
                  sub_dev, sub_reads, dev_latency, dev_spacing, dev_read_cpu, dev_read_threads, cores, workers,
                  stall_ns, wake_ns, overlap, batch_after_ns, batch_cold_ns, cold_gap_ns, cold_factor, cold_row,
                  latency_out, dev_reads_out,
                  dev_busy_out):
    """Run the host of this module's docstring over ``N`` arrivals.

    Args:
        arrivals: ``(N,)`` float64 ns, nondecreasing.
        num_profiles: ``R``; arrival ``n`` is profiled request ``n % R``.
        cpu_emb, cpu_bottom, cpu_top: ``(R,)`` float64 ns of each CPU task (0: none).
        batch_ptr: ``(R + 1,)`` int64 CSR of each request's batches into ``batch_qd``.
        batch_qd: ``(nb,)`` int64 reads in flight per device, >= 1.
        sub_ptr: ``(nb + 1,)`` int64 CSR of each batch's per-device parts.
        sub_dev, sub_reads: ``(ns,)`` int64 device index and block reads of each part.
        dev_latency, dev_spacing: ``(D,)`` float64 ns: each device's read latency and work
            per read (:class:`sdm.tiers.metered.DeviceQueue`).
        dev_read_cpu: ``(D,)`` float64 ns of core time each read on the device costs (0: none).
        dev_read_threads: ``(D,)`` int64: at most this many tasks a batch's read CPU on the
            device splits into (0: no bound beyond the batch's queue depth).
        cores: C >= 1.
        workers: at most this many requests in service at once, the others waiting first come
            first served for one (their wait counts in their latency); <= 0: no limit.
        stall_ns: ``(N, 3)`` float64 ns added to each arrival's embedding, bottom and top task
            (a task of zero time stays one).
        wake_ns: ``(N, 2)`` float64 ns: each arrival's wake-up at its start (when a worker was
            free) and after its last device read.
        overlap: bool: a request's reads start when its embedding task starts (a ``paced``
            store), not when it ends.
        batch_after_ns: ``(nb,)`` float64 ns, with ``overlap``: the embedding task's CPU time
            on a warm core that batch ``b`` issues after at the earliest.
        batch_cold_ns: ``(nb,)`` float64 ns, with ``overlap``: how much of the task's time
            before batch ``b`` a cold core stretches (``batch_after_ns`` if evenly).
        cold_gap_ns: ``(G,)`` float64, gaps ascending; ``G = 0``: no slowdown.
        cold_factor: ``(S, G)`` float64: a task of arrival ``n`` on a core idle ``g`` ns
            takes ``np.interp(g, cold_gap_ns, cold_factor[cold_row[n]])`` times its time.
        cold_row: ``(N,)`` int64 in ``[0, S)``: each arrival's row of ``cold_factor``.
        latency_out: ``(N,)`` float64 out: completion minus arrival, ns.
        dev_reads_out: ``(D,)`` int64 out: reads each device served.
        dev_busy_out: ``(D + 2,)`` float64 out: ``[:D]`` each device's busy time, reads x
            spacing (ns: the unit-ns its reads held over its units), ``[D]`` the cores' (ns:
            busy time, stalls, cold cores and reads' CPU included), ``[D + 1]`` the workers' (ns: a
            request holds one from when it got it to its completion, blocked or not).

    Returns:
        When the last request completed (ns).
    """
    n_req = arrivals.shape[0]
    n_dev = dev_latency.shape[0]
    cap = 4 * n_req + cores + 2  # pending events: one arrival, four per request, one per core
    h_time = np.empty(cap, dtype=np.float64)
    h_seq = np.empty(cap, dtype=np.int64)
    h_kind = np.empty(cap, dtype=np.int64)
    h_arg = np.empty(cap, dtype=np.int64)
    # CPU tasks (4 n + stage: 0 embeddings, 1 bottom MLP, 2 top, 3 a part of a batch's read
    # CPU) in the order they became ready; [head:tail] wait, the buffer grows when full
    fifo = np.empty(3 * n_req + 1, dtype=np.int64)
    head = 0
    tail = 0
    # each device's units in use over time (sdm.kernels.devqueue), a row per device
    bp_times = np.zeros((n_dev, 16), dtype=np.float64)
    bp_used = np.zeros((n_dev, 16), dtype=np.float64)
    bp_count = np.zeros(n_dev, dtype=np.int64)
    bp_scratch = np.zeros((2, 16), dtype=np.float64)
    dev_units = dev_latency / dev_spacing
    pending = np.zeros(n_req, dtype=np.int64)  # branches (reads, embeddings, bottom MLP) still running
    emb_done = np.zeros(n_req, dtype=np.bool_)
    emb_start = np.zeros(n_req)  # with overlap: when the embedding task started, and its cold factor
    emb_scale = np.ones(n_req)
    idle_cores = np.arange(cores)  # a stack: [:idle] are idle, the last freed on top
    core_free_ns = np.zeros(cores)  # when each core last became idle
    next_batch = np.zeros(n_req, dtype=np.int64)
    batch_left = np.zeros(n_req, dtype=np.int64)  # of the batch in flight: its reads and CPU parts running
    read_part_ns = np.zeros(n_req)  # of the batch in flight: each CPU part's time
    waiting = np.empty(n_req, dtype=np.int64)  # arrivals waiting for a worker
    held_from = np.zeros(n_req)  # when each request got its worker
    w_head = 0
    w_tail = 0
    active = 0
    dev_reads_out[:] = 0
    dev_busy_out[:] = 0.0
    idle = cores
    size = 0
    seq = 0
    last_done = 0.0
    if n_req > 0:
        size = _push(h_time, h_seq, h_kind, h_arg, size, seq, arrivals[0], _ARRIVAL, 0)
        seq += 1
    while size > 0:
        size = _pop(h_time, h_seq, h_kind, h_arg, size)
        now, kind, arg = h_time[size], h_kind[size], h_arg[size]
        ready = -1  # tasks this event makes ready (4 n + stage), queued for a core below
        ready2 = -1
        issue = -1  # the request whose next batch this event issues
        begin = -1  # the request a worker starts serving now
        if kind == _ARRIVAL:
            n = arg
            if n + 1 < n_req:
                size = _push(h_time, h_seq, h_kind, h_arg, size, seq, arrivals[n + 1], _ARRIVAL, n + 1)
                seq += 1
            if workers <= 0 or active < workers:
                active += 1
                held_from[n] = now
                if wake_ns[n, 0] > 0.0:
                    size = _push(h_time, h_seq, h_kind, h_arg, size, seq, now + wake_ns[n, 0], _WOKEN, n)
                    seq += 1
                else:
                    begin = n
            else:
                waiting[w_tail] = n
                w_tail += 1
        elif kind == _WOKEN:
            begin = arg
        elif kind == _READS_WOKEN:
            pending[arg] -= 1
            if pending[arg] == 0:
                ready = 4 * arg + 2
        elif kind == _READS_DONE:
            batch_left[arg] -= 1
            if batch_left[arg] == 0:
                issue = arg
                next_batch[arg] += 1
        elif kind == _READS_START:
            issue = arg
            next_batch[arg] = 0
        elif kind == _BATCH_DUE:
            issue = arg
        else:
            if kind == _CPU_DONE:
                core = arg % cores
                arg //= cores
                idle_cores[idle] = core
                core_free_ns[core] = now
                idle += 1
            n = arg // 4
            stage = arg - 4 * n
            if stage == 0 and overlap:
                emb_done[n] = True
                pending[n] -= 1
                if pending[n] == 0:
                    ready = 4 * n + 2
            elif stage == 0:
                issue = n
                next_batch[n] = 0
            elif stage == 1:
                pending[n] -= 1
                if pending[n] == 0:
                    ready = 4 * n + 2
            elif stage == 3:
                batch_left[n] -= 1
                if batch_left[n] == 0:
                    issue = n
                    next_batch[n] += 1
            else:
                latency_out[n] = now - arrivals[n]
                last_done = max(last_done, now)
                active -= 1
                dev_busy_out[n_dev + 1] += now - held_from[n]
                if w_head < w_tail:
                    begin = waiting[w_head]
                    w_head += 1
                    active += 1
                    held_from[begin] = now
        if begin >= 0:
            has_bottom = cpu_bottom[begin % num_profiles] > 0.0
            pending[begin] = (2 if has_bottom else 1) + (1 if overlap else 0)
            ready = 4 * begin
            if has_bottom:
                ready2 = 4 * begin + 1
        if issue >= 0:
            n = issue
            r = n % num_profiles
            b = batch_ptr[r] + next_batch[n]
            due = now
            if overlap and b < batch_ptr[r + 1]:
                due = emb_start[n] + batch_after_ns[b] + (emb_scale[n] - 1.0) * batch_cold_ns[b]
            if due > now:  # the CPU work has not reached this batch yet
                size = _push(h_time, h_seq, h_kind, h_arg, size, seq, due, _BATCH_DUE, n)
                seq += 1
            elif b < batch_ptr[r + 1]:
                done = 0.0
                read_cpu = 0.0
                cpu_reads = 0  # reads that cost CPU: no more reader threads than that run
                cpu_threads = batch_qd[b]
                for k in range(sub_ptr[b], sub_ptr[b + 1]):
                    d = sub_dev[k]
                    if bp_count[d] + 3 > bp_times.shape[1]:  # two breakpoints per batch in flight, at most
                        grown_t = np.zeros((n_dev, 2 * bp_times.shape[1]), dtype=np.float64)
                        grown_u = np.zeros((n_dev, 2 * bp_times.shape[1]), dtype=np.float64)
                        grown_t[:, :bp_times.shape[1]] = bp_times
                        grown_u[:, :bp_times.shape[1]] = bp_used
                        bp_times = grown_t
                        bp_used = grown_u
                        bp_scratch = np.zeros((2, bp_times.shape[1]), dtype=np.float64)
                    t, _ = reserve(bp_times[d], bp_used[d], bp_count[d:d + 1], bp_scratch, now, now, sub_reads[k],
                                   batch_qd[b], dev_latency[d], dev_units[d])
                    dev_busy_out[d] += sub_reads[k] * dev_spacing[d]
                    done = max(done, t)
                    dev_reads_out[d] += sub_reads[k]
                    read_cpu += sub_reads[k] * dev_read_cpu[d]
                    if dev_read_cpu[d] > 0.0:
                        cpu_reads += sub_reads[k]
                        if dev_read_threads[d] > 0:
                            cpu_threads = min(cpu_threads, dev_read_threads[d])
                size = _push(h_time, h_seq, h_kind, h_arg, size, seq, now + done, _READS_DONE, n)
                seq += 1
                batch_left[n] = 1
                if read_cpu > 0.0:
                    parts = min(cpu_threads, cores, cpu_reads)
                    read_part_ns[n] = read_cpu / parts
                    batch_left[n] += parts
                    if tail + parts > fifo.shape[0]:
                        fifo = _room(fifo, head, tail, parts)
                        tail -= head
                        head = 0
                    for _ in range(parts):
                        fifo[tail] = 4 * n + 3
                        tail += 1
            elif next_batch[n] > 0 and wake_ns[n, 1] > 0.0 and (emb_done[n] or not overlap):
                size = _push(h_time, h_seq, h_kind, h_arg, size, seq, now + wake_ns[n, 1], _READS_WOKEN, n)
                seq += 1
            else:
                pending[n] -= 1
                if pending[n] == 0:
                    ready = 4 * n + 2
        # A task of zero time ends at once, needing no core; the others queue for one.
        for task in (ready, ready2):
            if task < 0:
                continue
            n = task // 4
            stage = task - 4 * n
            r = n % num_profiles
            cost = cpu_emb[r] if stage == 0 else (cpu_bottom[r] if stage == 1 else cpu_top[r])
            if cost <= 0.0:
                size = _push(h_time, h_seq, h_kind, h_arg, size, seq, now, _FREE_DONE, task)
                seq += 1
                if stage == 0 and overlap:
                    emb_start[n] = now
                    size = _push(h_time, h_seq, h_kind, h_arg, size, seq, now, _READS_START, n)
                    seq += 1
            else:
                if tail == fifo.shape[0]:
                    fifo = _room(fifo, head, tail, 1)
                    tail -= head
                    head = 0
                fifo[tail] = task
                tail += 1
        while head < tail and idle > 0:
            task = fifo[head]
            head += 1
            n = task // 4
            stage = task - 4 * n
            idle -= 1
            core = idle_cores[idle]
            scale = 1.0
            if stage == 3:  # a read's CPU: the device's, not the request's, so no cold factor or stall
                cost = read_part_ns[n]
            else:
                r = n % num_profiles
                cost = cpu_emb[r] if stage == 0 else (cpu_bottom[r] if stage == 1 else cpu_top[r])
                if cold_gap_ns.shape[0] > 0:
                    scale = np.interp(now - core_free_ns[core], cold_gap_ns, cold_factor[cold_row[n]])
                cost = cost * scale + stall_ns[n, stage]
            dev_busy_out[n_dev] += cost
            size = _push(h_time, h_seq, h_kind, h_arg, size, seq, now + cost, _CPU_DONE, task * cores + core)
            seq += 1
            if stage == 0 and overlap:
                emb_start[n] = now
                emb_scale[n] = scale
                size = _push(h_time, h_seq, h_kind, h_arg, size, seq, now, _READS_START, n)
                seq += 1
    return last_done
