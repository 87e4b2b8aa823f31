"""Slow, obviously-correct pure-Python cache policies: the oracle of the kernel tests.

Each policy is a class over OrderedDicts with the libCacheSim decomposition
(``hit`` / ``pre_miss`` / ``victim`` / ``evict`` / ``insert``) so admission filters wrap any
of them the same way the kernels do. ``reference_hits(keys, policy, capacity)`` returns
the per-request hit list.
"""

from __future__ import annotations

from collections import OrderedDict

M64 = (1 << 64) - 1
NEVER = 1 << 62


def mix64(key: int) -> int:
    """splitmix64 finalizer, as sdm.kernels.hashmap.mix64."""
    z = (key + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


class Policy:
    def __init__(self, capacity: int):
        self.c = capacity

    def __len__(self):
        raise NotImplementedError

    def pre_miss(self, key, t, nu):
        pass


class LRU(Policy):
    def __init__(self, c):
        super().__init__(c)
        self.d = OrderedDict()

    def __len__(self):
        return len(self.d)

    def __contains__(self, k):
        return k in self.d

    def hit(self, k, t, nu):
        self.d.move_to_end(k)

    def victim(self):
        return next(iter(self.d))

    def evict(self, k):
        del self.d[k]

    def insert(self, k, t, nu):
        self.d[k] = True


class FIFO(LRU):
    def hit(self, k, t, nu):
        pass


class Clock(LRU):
    def hit(self, k, t, nu):
        self.d[k] = 1

    def victim(self):
        while True:
            k, ref = next(iter(self.d.items()))
            if not ref:
                return k
            del self.d[k]
            self.d[k] = 0  # second chance: to the newest end, bit cleared

    def insert(self, k, t, nu):
        self.d[k] = 0


class LFU(LRU):
    """Least frequently used; ties to the least recently used."""

    def hit(self, k, t, nu):
        f, _ = self.d[k]
        self.d[k] = (f + 1, t)

    def victim(self):
        return min(self.d, key=lambda k: self.d[k])

    def insert(self, k, t, nu):
        self.d[k] = (1, t)


class Belady(LRU):
    """Evict the farthest next use; among keys never used again, the most recent."""

    def hit(self, k, t, nu):
        self.d[k] = nu if nu < NEVER else NEVER + t

    def victim(self):
        return max(self.d, key=lambda k: self.d[k])

    def insert(self, k, t, nu):
        self.hit(k, t, nu)


class Sieve(Policy):
    def __init__(self, c):
        super().__init__(c)
        self.q = []          # oldest first
        self.visited = {}
        self.hand = None     # index into q; None = start from the oldest

    def __len__(self):
        return len(self.q)

    def __contains__(self, k):
        return k in self.visited

    def hit(self, k, t, nu):
        self.visited[k] = 1

    def victim(self):
        i = 0 if self.hand is None else self.hand
        while self.visited[self.q[i]]:
            self.visited[self.q[i]] = 0
            i = i + 1 if i + 1 < len(self.q) else 0
        self.hand = i
        return self.q[i]

    def evict(self, k):
        i = self.q.index(k)
        del self.q[i]
        del self.visited[k]
        # the hand moves on to the next newer key (the one that slid into index i)
        self.hand = i if i < len(self.q) else None

    def insert(self, k, t, nu):
        self.q.append(k)
        self.visited[k] = 0


class S3FIFO(Policy):
    def __init__(self, c, small_ratio=0.1, ghost_ratio=0.9, move_to_main=2):
        super().__init__(c)
        self.small_cap = max(1, c * round(small_ratio * 1000) // 1000)
        self.main_cap = c - self.small_cap
        self.ghost_cap = c * round(ghost_ratio * 1000) // 1000
        self.small = OrderedDict()
        self.main = OrderedDict()
        self.ghost = OrderedDict()
        self.move = move_to_main
        self.has_evicted = False
        self.to_main = False

    def __len__(self):
        return len(self.small) + len(self.main)

    def __contains__(self, k):
        return k in self.small or k in self.main

    def hit(self, k, t, nu):
        q = self.small if k in self.small else self.main
        q[k] += 1

    def pre_miss(self, k, t, nu):
        self.to_main = False
        if self.ghost_cap > 0 and k in self.ghost:
            del self.ghost[k]
            self.to_main = True

    def victim(self):
        self.has_evicted = True
        while True:
            if len(self.main) > self.main_cap or not self.small:
                k, f = next(iter(self.main.items()))
                if f == 0:
                    return k
                del self.main[k]
                self.main[k] = min(f, 3) - 1
            else:
                k, f = next(iter(self.small.items()))
                if f < self.move:
                    return k
                del self.small[k]
                self.main[k] = 0

    def evict(self, k):
        if k in self.small:
            del self.small[k]
            if self.ghost_cap > 0:
                if len(self.ghost) >= self.ghost_cap:
                    self.ghost.popitem(last=False)
                self.ghost[k] = True
        else:
            del self.main[k]

    def insert(self, k, t, nu):
        if self.to_main or (not self.has_evicted and len(self.small) >= self.small_cap):
            self.main[k] = 0
        else:
            self.small[k] = 0


class ARC(Policy):
    """Megiddo and Modha's ARC; OrderedDicts are LRU first, MRU last."""

    def __init__(self, c):
        super().__init__(c)
        self.t1, self.t2, self.b1, self.b2 = OrderedDict(), OrderedDict(), OrderedDict(), OrderedDict()
        self.p = 0.0
        self.to_main = self.in_b2 = self.no_ghost = False

    def __len__(self):
        return len(self.t1) + len(self.t2)

    def __contains__(self, k):
        return k in self.t1 or k in self.t2

    def hit(self, k, t, nu):
        (self.t1 if k in self.t1 else self.t2).pop(k)
        self.t2[k] = True

    def pre_miss(self, k, t, nu):
        c = self.c
        self.to_main = self.in_b2 = self.no_ghost = False
        b1, b2 = len(self.b1), len(self.b2)
        if k in self.b1:
            self.p = min(self.p + (1.0 if b1 >= b2 else b2 / b1), float(c))
            del self.b1[k]
            self.to_main = True
        elif k in self.b2:
            self.p = max(self.p - (1.0 if b2 >= b1 else b1 / b2), 0.0)
            del self.b2[k]
            self.to_main = self.in_b2 = True
        elif len(self.t1) + b1 >= c:
            if len(self.t1) < c:
                self.b1.popitem(last=False)
            else:
                self.no_ghost = True
        elif len(self.t1) + len(self.t2) + b1 + b2 >= c:
            if len(self.t1) + len(self.t2) + b1 + b2 >= 2 * c:
                self.b2.popitem(last=False)

    def victim(self):
        t1 = len(self.t1)
        if self.no_ghost:
            return next(iter(self.t1))
        if t1 >= 1 and (t1 > self.p or (self.in_b2 and t1 == self.p)):
            return next(iter(self.t1))
        return next(iter(self.t2)) if self.t2 else next(iter(self.t1))

    def evict(self, k):
        if k in self.t1:
            del self.t1[k]
            if not self.no_ghost:
                self.b1[k] = True
        else:
            del self.t2[k]
            if not self.no_ghost:
                self.b2[k] = True

    def insert(self, k, t, nu):
        (self.t2 if self.to_main else self.t1)[k] = True


class Random(Policy):
    """Uniform random victim over slots, drawing like the kernel (splitmix64 of a
    seeded counter) so masks compare exactly."""

    def __init__(self, c, seed=0):
        super().__init__(c)
        self.slots = [None] * c
        self.where = {}
        self.counter = (seed & ((1 << 32) - 1)) << 24

    def __len__(self):
        return len(self.where)

    def __contains__(self, k):
        return k in self.where

    def hit(self, k, t, nu):
        pass

    def victim(self):
        self.counter += 1
        return self.slots[mix64(self.counter) % self.c]

    def evict(self, k):
        s = self.where.pop(k)
        self.slots[s] = None

    def insert(self, k, t, nu):
        s = self.slots.index(None)  # the kernel hands out free slots 0, 1, 2, ... first
        self.slots[s] = k
        self.where[k] = s


POLICY_CLASSES = {"lru": LRU, "fifo": FIFO, "clock": Clock, "lfu": LFU, "sieve": Sieve,
                  "s3fifo": S3FIFO, "arc": ARC, "random": Random, "belady": Belady}


class Threshold:
    def __init__(self, capacity, threshold=2, history=None):
        self.k = threshold
        self.limit = history if history is not None else 4 * capacity
        self.counts = {}

    def admit_miss(self, key):
        if key not in self.counts and len(self.counts) >= self.limit:
            self.counts.clear()
        self.counts[key] = self.counts.get(key, 0) + 1
        return self.counts[key] >= self.k


class TinyLFU:
    def __init__(self, capacity, sample_factor=10):
        w = 16
        while w < capacity:
            w *= 2
        self.w = w
        self.sketch = [[0] * w for _ in range(4)]
        self.door = [0] * (4 * w)
        self.period = max(sample_factor * capacity, 1)
        self.adds = 0

    def _idx(self, key):
        h = mix64(key)
        h1, h2 = h & 0xFFFFFFFF, (h >> 32) | 1
        return [((h1 + r * h2) & M64) & (self.w - 1) for r in range(4)], (h >> 40) & (4 * self.w - 1)

    def record(self, key):
        rows, d = self._idx(key)
        if not self.door[d]:
            self.door[d] = 1
        else:
            for r, i in enumerate(rows):
                self.sketch[r][i] = min(self.sketch[r][i] + 1, 15)
        self.adds += 1
        if self.adds >= self.period:
            self.sketch = [[v >> 1 for v in row] for row in self.sketch]
            self.door = [0] * len(self.door)
            self.adds = 0

    def estimate(self, key):
        rows, d = self._idx(key)
        return min(self.sketch[r][i] for r, i in enumerate(rows)) + self.door[d]


def reference_hits(keys, policy, capacity, *, admission=None, seed=0, threshold=2,
                   history=None, sample_factor=10):
    """Per-request hit list of ``policy`` over ``keys`` (any iterable of ints)."""
    keys = [int(k) for k in keys]
    cls = POLICY_CLASSES[policy]
    cache = cls(capacity, seed=seed) if policy == "random" else cls(capacity)
    nxt = [NEVER] * len(keys)
    seen = {}
    for i in range(len(keys) - 1, -1, -1):
        nxt[i] = seen.get(keys[i], NEVER)
        seen[keys[i]] = i
    thr = Threshold(capacity, threshold, history) if admission == "threshold" else None
    tiny = TinyLFU(capacity, sample_factor) if admission == "tinylfu" else None
    out = []
    for t, k in enumerate(keys):
        if tiny:
            tiny.record(k)
        if k in cache:
            cache.hit(k, t, nxt[t])
            out.append(True)
            continue
        out.append(False)
        if thr and not thr.admit_miss(k):
            continue
        cache.pre_miss(k, t, nxt[t])
        if len(cache) >= capacity:
            v = cache.victim()
            if tiny and tiny.estimate(k) <= tiny.estimate(v):
                continue
            cache.evict(v)
        cache.insert(k, t, nxt[t])
    return out
