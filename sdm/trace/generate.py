"""Seeded synthetic trace generators and the named profiles of ``sdm trace gen``.

Kinds of generator (every profile is one of them with preset parameters):

* ``uniform``: ids uniform over each table.
* ``zipf``: per table, popularity rank ``r`` drawn with ``P(r) ~ (r + 1) ** -alpha_t`` and ranks
  scattered over the rows by a fixed seeded permutation (an affine map ``(a r + c) mod n`` with
  ``gcd(a, n) = 1``: a bijection needing no per-row memory, so 40M-row tables cost nothing).
  ``drift_rows_per_batch`` rotates ranks over rows as batches go by (hot-set drift).
* ``inference``: requests of one user x ``items_per_request`` candidate items; the first
  ``user_tables`` tables are user-side, drawn once per request and repeated for each item
  (``request_ids`` records the request of each sample); the other tables are per item.
* ``stack-distance``: one table whose key stream follows a reference DLRM distribution file.
* ``meta-2021``: per batch, the reuse histograms of Meta's 2021 dlrm_datasets traces (the
  aggregate of ``locality_stats_2021.txt``, constants below). Each batch is built from the
  histogram: a multiset of per-row reuse counts whose row shares and lookup shares per bin
  match, rows handed to tables in proportion to their pooling, row ids drawn from a per-table
  Zipf prior (hot counts on low ranks, so hot rows stay hot across batches), lookups shuffled
  into bags.

Bag lengths: ``fixed_pooling`` gives every bag exactly ``pooling`` ids (Criteo: one id per
feature); otherwise lengths are Poisson with mean ``pooling`` (empty bags happen, as in Meta's
traces).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, replace
from typing import Iterator

import numpy as np

from sdm.kernels.jit import jit
from sdm.errors import ConfigError, IdOutOfRangeError, InvalidArgumentError
from sdm.model.presets import PRESETS as MODEL_PRESETS
from sdm.trace.format import Batch, TraceWriter
from sdm.trace.stackdist import StackDistanceDistribution, generate_stack_distance_keys, read_dist_file
from sdm.tiers.manifest import MAX_TABLES
from sdm.validate import check_fits_memory, check_int

__all__ = [
    "PROFILES",
    "Profile",
    "GeneratedTrace",
    "generate",
    "generate_to",
    "get_profile",
    "zipf_ranks",
    "META_2021_ROWS",
    "META_2021_LOOKUPS",
    "META_2021_AVG_REUSE",
    "REUSE_BIN_EDGES",
]

# Reuse bins of dlrm_datasets' locality_stats: (0,1], (1,2], (2,4], ..., (16384,32768], 32768+.
REUSE_BIN_EDGES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)

# Aggregate of facebookresearch/dlrm_datasets embedding_bag/2021/locality_stats.txt
# (fixtures/dlrm_datasets/locality_stats_2021.txt, first block: 856 tables, batch 65,536,
# 887,017,990 lookups, 128,435,723 distinct rows). Share of distinct rows per reuse bin ...
META_2021_ROWS = (0.473, 0.152, 0.139, 0.112, 0.072, 0.032, 0.011, 0.005, 0.002, 0.001,
                  0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
# ... and share of lookups falling on rows of each bin.
META_2021_LOOKUPS = (0.069, 0.044, 0.068, 0.101, 0.121, 0.104, 0.073, 0.058, 0.052, 0.050,
                     0.049, 0.048, 0.048, 0.043, 0.031, 0.023, 0.019)
META_2021_AVG_REUSE = 887_017_990 / 128_435_723  # 6.906


# ---------------------------------------------------------------------------------- profiles


@dataclass(frozen=True)
class Profile:
    """Parameters of one generator run; ``PROFILES`` holds the named presets.

    Per-table tuples (``table_sizes``, ``pooling``, ``alpha``) have one entry per table.
    ``batch_size`` counts samples per batch (``inference``: requests per batch, each of
    ``items_per_request`` samples). ``batches`` is the default length; ``requests``, when set,
    is the exact total (the last batch holds the remainder).
    """

    name: str
    kind: str
    table_sizes: tuple
    pooling: tuple
    alpha: tuple = ()
    fixed_pooling: bool = False
    batch_size: int = 1024
    batches: int = 16
    dense: int = 0
    drift_rows_per_batch: float = 0.0
    items_per_request: int = 1
    user_tables: int = 0
    row_alpha: float = 1.0
    dist_file: str | None = None
    requests: int | None = None
    max_rows: int | None = None
    description: str = ""
    source: str = ""

    @property
    def num_tables(self) -> int:
        return len(self.table_sizes)


def _t(v, n):
    return (v,) * n


# Zipf exponent of the model-shape presets: a parameter, not a measured figure (*unverified*);
# 1.05 is the skew the REFERENCES.md gather benchmark uses.
_ALPHA = 1.05


def _model_profile(name: str, batch_size: int, batches: int, source: str, **extra) -> Profile:
    """A Zipf profile shaped like model preset ``name``: its tables, its pooling (one lookup
    a bag for the Criteo models, whose categorical features are one-hot)."""
    m = MODEL_PRESETS[name]
    n = len(m.table_sizes)
    return Profile(name, "zipf", m.table_sizes, _t(m.pooling, n), _t(_ALPHA, n), True, batch_size,
                   batches, source=source, **extra)


# meta-2021 shape: pooling factors averaging 15.75 lookups per (sample, table), close to the
# 15.8 of the 2021 traces (887M lookups / (856 tables x 65,536 samples)).
_META_POOLING = (2, 4, 8, 12, 16, 20, 28, 36)

PROFILES: dict[str, Profile] = {p.name: p for p in [
    Profile("uniform", "uniform", _t(1_000_000, 4), _t(20, 4), batch_size=1024, batches=16,
            description="4 tables x 1M rows, ids uniform, Poisson pooling 20"),
    Profile("zipf", "zipf", _t(1_000_000, 4), _t(20, 4), (0.8, 1.0, 1.05, 1.2), batch_size=1024,
            batches=16, description="4 tables x 1M rows, Zipf alpha 0.8/1.0/1.05/1.2, pooling 20"),
    Profile("drift", "zipf", _t(1_000_000, 4), _t(20, 4), _t(1.05, 4), batch_size=1024, batches=32,
            drift_rows_per_batch=2000.0,
            description="zipf with the popularity ranking rotating 2000 rows per batch"),
    Profile("inference", "inference", (1_000_000,) * 4 + (500_000,) * 4, (20,) * 4 + (1,) * 4,
            _t(1.05, 8), batch_size=16, batches=32, items_per_request=64, user_tables=4,
            description="requests of 1 user x 64 candidate items; 4 user tables (pooling 20, "
                        "repeated across a request's items) + 4 item tables (pooling 1)"),
    Profile("stack-distance", "stack-distance", (), (1,), batch_size=1024, batches=16,
            description="one table whose LRU stack distances follow a reference DLRM "
                        "distribution file (--dist FILE)",
            source="facebookresearch/dlrm dlrm_data_pytorch.py trace generation (Hassan et al. 2007)"),
    _model_profile("criteo-kaggle", 2048, 32, "REFERENCES.md model presets; dlrm "
                   "bench/dlrm_s_criteo_kaggle.sh", dense=13),
    _model_profile("criteo-terabyte", 2048, 32, "REFERENCES.md; dlrm bench/dlrm_s_criteo_terabyte.sh "
                   "(ids capped 10M)", dense=13),
    _model_profile("mlperf-dlrm", 2048, 32, "REFERENCES.md; MLPerf v1 DLRM (ids capped 40M)", dense=13),
    _model_profile("dlrm-bench", 1024, 8, "REFERENCES.md; dlrm bench/dlrm_s_benchmark.sh (8 x 1M, "
                   "100 per lookup)"),
    _model_profile("rm1", 1024, 8, "REFERENCES.md; DeepRecSys dlrm_rm1.json"),
    _model_profile("rm2", 256, 8, "REFERENCES.md; DeepRecSys dlrm_rm2.json"),
    _model_profile("rm3", 1024, 16, "REFERENCES.md; DeepRecSys dlrm_rm3.json"),
    Profile("meta-2021", "meta-2021", _t(2_000_000, 8), _META_POOLING, (), False, 16384, 4,
            row_alpha=1.0,
            description="per-batch reuse histograms of Meta's 2021 embedding traces; 8 tables x "
                        "2M rows, pooling 2..36 (mean 15.75), 16,384 samples (~2.1M lookups) "
                        "per batch, enough for every reuse bin up to 32768+ to be populated",
            source="facebookresearch/dlrm_datasets embedding_bag/2021/locality_stats.txt"),
]}


def _int(value, what: str) -> int:
    """An integer option (an int, an integral float, or its decimal text); ConfigError otherwise."""
    out = None
    if isinstance(value, (int, np.integer, str)) and not isinstance(value, (bool, np.bool_)):
        try:
            out = int(value)
        except ValueError:
            pass
    elif isinstance(value, (float, np.floating)) and float(value).is_integer():
        out = int(value)
    if out is None:
        raise ConfigError(f"{what} must be an integer, got {value!r}")
    if not -2**63 <= out < 2**63:
        raise ConfigError(f"{what} {out} does not fit a 64-bit integer (at most 2**63 - 1)")
    return out


def _num(value, what: str) -> float:
    """A finite number option (or its decimal text); ConfigError otherwise."""
    try:
        out = None if isinstance(value, (bool, np.bool_)) else float(value)
    except (TypeError, ValueError):
        out = None
    if out is None or not math.isfinite(out):
        raise ConfigError(f"{what} must be a finite number, got {value!r}")
    return out


def _per_table(value, n: int, what: str, cast=float) -> tuple:
    conv = _int if cast is int else _num
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
        if not value:
            raise ConfigError(f"{what} must be one value or a comma list, got none")
    if np.ndim(value) == 0:
        return (conv(value, what),) * n
    vals = tuple(conv(v, what) for v in value)
    if len(vals) == 1:
        return vals * n
    if len(vals) != n:
        raise ConfigError(f"{what} has {len(vals)} entries; the profile has {n} tables "
                          f"(give one value or one per table)")
    return vals


def get_profile(name: str = "zipf", *, tables: int | None = None, table_size=None, pooling=None,
                alpha=None, batch_size: int | None = None, batches: int | None = None,
                requests: int | None = None, max_rows: int | None = None, drift=None,
                items_per_request: int | None = None, dense: int | None = None,
                dist_file=None) -> Profile:
    """Resolve a named profile with overrides into a :class:`Profile`.

    ``requests`` is the number of samples to generate (``inference``: user requests); it sets
    ``batches = ceil(requests / batch_size)``. ``max_rows`` caps every table (ids of the capped
    tables are drawn over the capped size; the metadata records the cap). ``tables`` and
    ``table_size`` reshape the tables of the uniform / zipf / drift / meta-2021 profiles.

    Raises:
        ConfigError: an unknown profile name or an inconsistent override.
    """
    if name not in PROFILES:
        raise ConfigError(f"unknown trace profile {name!r}; choose one of {sorted(PROFILES)}")
    p = PROFILES[name]
    sizes, pool = p.table_sizes, p.pooling
    alphas = p.alpha
    if tables is not None or table_size is not None:
        # a store holds at most MAX_TABLES tables; checked before a tuple per table is built
        n = len(sizes) if tables is None else check_int(_int(tables, "tables"), "tables", lo=1, hi=MAX_TABLES,
                                                        error=ConfigError)
        base = table_size if table_size is not None else (sizes[0] if sizes else 1_000_000)
        sizes = _per_table(base, n, "table_size", int)
        if len(pool) != n:
            pool = tuple(pool[i % len(pool)] for i in range(n))
        if alphas and len(alphas) != n:
            alphas = tuple(alphas[i % len(alphas)] for i in range(n))
    if pooling is not None:
        pool = _per_table(pooling, len(pool), "pooling")
    if alpha is not None:
        alphas = _per_table(alpha, len(sizes) or 1, "alpha")
        if min(alphas) < 0:
            raise ConfigError(f"alpha (the Zipf exponent) must be >= 0, got {min(alphas):g}")
    if max_rows is not None:
        max_rows = check_int(_int(max_rows, "max_rows"), "max_rows", lo=1, error=ConfigError)
        sizes = tuple(min(int(s), max_rows) for s in sizes)
    kw = {} if max_rows is None else {"max_rows": max_rows}
    if batch_size is not None:
        kw["batch_size"] = check_int(_int(batch_size, "batch_size"), "batch_size", lo=1, error=ConfigError)
    bs = kw.get("batch_size", p.batch_size)
    if requests is not None:
        requests = check_int(_int(requests, "requests"), "requests", lo=1, error=ConfigError)
        kw["batches"] = -(-requests // bs)
        kw["requests"] = requests
    if batches is not None:
        kw["batches"] = check_int(_int(batches, "batches"), "batches", lo=1, error=ConfigError)
        kw["requests"] = None
    if drift is not None:
        kw["drift_rows_per_batch"] = _num(drift, "drift")
    if items_per_request is not None:
        kw["items_per_request"] = check_int(_int(items_per_request, "items_per_request"), "items_per_request",
                                            lo=1, error=ConfigError)
    if dense is not None:
        kw["dense"] = check_int(_int(dense, "dense"), "dense (features per sample)", lo=0, error=ConfigError)
    if dist_file is not None:
        if p.kind != "stack-distance":
            raise ConfigError(f"a distribution file (--dist) drives the stack-distance profile only, "
                              f"not {name!r}")
        kw["dist_file"] = os.fspath(dist_file) if isinstance(dist_file, os.PathLike) else str(dist_file)
    prof = replace(p, table_sizes=tuple(int(s) for s in sizes), pooling=tuple(float(x) for x in pool),
                   alpha=tuple(float(a) for a in alphas), **kw)
    if prof.kind != "stack-distance":
        if not prof.table_sizes or min(prof.table_sizes) < 1:
            raise ConfigError(f"every table needs >= 1 row, got {prof.table_sizes}")
        if len(prof.pooling) != prof.num_tables:
            raise ConfigError(f"pooling has {len(prof.pooling)} entries for {prof.num_tables} tables")
        if min(prof.pooling) < 0:
            raise ConfigError(f"pooling must be >= 0, got {min(prof.pooling)}")
        per_batch = prof.batch_size * (prof.items_per_request or 1) * sum(prof.pooling)
        check_fits_memory(int(per_batch * _BYTES_PER_LOOKUP), "batch_size x pooling",
                          f"{prof.batch_size} x {sum(prof.pooling):g} (summed over {prof.num_tables} tables)",
                          f"a batch of {per_batch:,.0f} lookups", error=ConfigError)
    if prof.kind == "stack-distance" and prof.dist_file is None:
        raise ConfigError("the stack-distance profile needs a distribution file (--dist FILE, the "
                          "reference DLRM's 3-line format; `sdm trace stats --dist-out` writes one)")
    return prof


# ---------------------------------------------------------------------------------- samplers


_ZIPF_HEAD = 1024
#: Memory one generated lookup takes at its peak (its id, the draws it came from, their sort
#: and the CSR copy), a bound for the check made before a batch is generated.
_BYTES_PER_LOOKUP = 64


def _zipf_tail_h(x, alpha):
    """Antiderivative of ``x ** -alpha``."""
    if abs(alpha - 1.0) < 1e-9:
        return np.log(x)
    return x ** (1.0 - alpha) / (1.0 - alpha)


def _zipf_tail_hinv(y, alpha):
    if abs(alpha - 1.0) < 1e-9:
        return np.exp(y)
    return (y * (1.0 - alpha)) ** (1.0 / (1.0 - alpha))


def zipf_ranks(u, n: int, alpha: float) -> np.ndarray:
    """Map uniforms ``u`` in [0, 1) to Zipf ranks in ``[0, n)`` with ``P(r) ~ (r + 1) ** -alpha``.

    The first 1024 ranks use the exact discrete CDF; beyond them, the inverse CDF of the
    continuous power law on ``[1024.5, n + 0.5)`` rounded to the nearest integer, which puts mass
    ``integral over [k - 1/2, k + 1/2) of x ** -alpha`` on rank ``k - 1`` (within 1e-6 relative of
    ``k ** -alpha`` there). O(1) per draw and no per-row memory for any ``n``. ``alpha = 0`` is
    uniform. Returns ``(len(u),)`` int64.
    """
    u = np.asarray(u, dtype=np.float64)
    head_n = min(n, _ZIPF_HEAD)
    w = np.arange(1, head_n + 1, dtype=np.float64) ** -alpha
    head = np.cumsum(w)
    tail = 0.0
    if n > head_n:
        lo, hi = head_n + 0.5, n + 0.5
        tail = float(_zipf_tail_h(hi, alpha) - _zipf_tail_h(lo, alpha))
    z = head[-1] + tail
    x = u * z
    r = np.searchsorted(head, x, side="right").astype(np.int64)
    in_tail = r >= head_n
    if n > head_n and in_tail.any():
        y = _zipf_tail_h(head_n + 0.5, alpha) + (x[in_tail] - head[-1])
        r[in_tail] = np.floor(_zipf_tail_hinv(y, alpha) + 0.5).astype(np.int64) - 1
    return np.clip(r, 0, n - 1, out=r)


def _affine_perm(n: int, rng) -> tuple[int, int]:
    """A seeded bijection ``r -> (a r + c) mod n`` of ``[0, n)`` (``gcd(a, n) = 1``)."""
    if n <= 2:
        return 1, int(rng.integers(0, n))
    # a * r must fit int64 for r < n: tables beyond ~3e9 rows get a smaller multiplier
    hi = min(n, (2**63 - 1) // n)
    if hi < 3:
        return 1, int(rng.integers(0, n))
    lo = max(1, min(n // 3, hi // 3))  # far from 1 so neighbouring ranks land far apart
    while True:
        a = int(rng.integers(lo, hi))
        if math.gcd(a, n) == 1:
            return a, int(rng.integers(0, n))


def _bag_lengths(rng, batch: int, pooling: float, fixed: bool) -> np.ndarray:
    if fixed:
        return np.full(batch, int(round(pooling)), dtype=np.int64)
    return rng.poisson(pooling, size=batch).astype(np.int64)


def _offsets(lengths) -> np.ndarray:
    off = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return off


@jit
def _first_distinct(ranks, seen, out, have):
    """Append ranks not yet seen to ``out`` (first-appearance order) until it is full."""
    k = out.shape[0]
    for i in range(ranks.shape[0]):
        if have == k:
            break
        r = ranks[i]
        if not seen[r]:
            seen[r] = True
            out[have] = r
            have += 1
    return have


@jit
def _fill_bin(counts, lo, hi, total):
    """Nudge ``counts`` (each in ``[lo, hi]``) by +-1 until they sum to ``total``."""
    s = 0
    for c in counts:
        s += c
    n = counts.shape[0]
    diff = total - s
    i = 0
    idle = 0
    while diff != 0 and idle <= n:
        c = counts[i]
        if diff > 0 and c < hi:
            step = min(hi - c, max(1, diff // n))
            counts[i] = c + step
            diff -= step
            idle = 0
        elif diff < 0 and c > lo:
            step = min(c - lo, max(1, (-diff) // n))
            counts[i] = c - step
            diff += step
            idle = 0
        else:
            idle += 1
        i += 1
        if i == n:
            i = 0
    return diff


@jit
def _assign_tables(counts, budget, u):
    """Hand rows (counts in descending order) to tables, each with probability proportional to
    the table's remaining lookup budget among tables that still fit the row, so that per-table
    lookup totals follow the pooling while the hottest rows spread over the big tables."""
    ntab = budget.shape[0]
    rem = budget.copy()
    out = np.empty(counts.shape[0], dtype=np.int64)
    for i in range(counts.shape[0]):
        c = counts[i]
        tot = 0.0
        for t in range(ntab):
            if rem[t] >= c:
                tot += rem[t]
        if tot <= 0.0:
            best = 0
            for t in range(1, ntab):
                if rem[t] > rem[best]:
                    best = t
            out[i] = best
            rem[best] -= c
            continue
        x = u[i] * tot
        pick = ntab - 1
        acc = 0.0
        for t in range(ntab):
            if rem[t] >= c:
                acc += rem[t]
                if x < acc:
                    pick = t
                    break
        out[i] = pick
        rem[pick] -= c
    return out


def _bin_means(rows, lookups, avg_reuse):
    """Mean reuse count inside each bin: from the two shares where the row share is published
    with precision, else the bin's geometric middle."""
    lo = (0,) + REUSE_BIN_EDGES
    means = []
    for k, (r, l) in enumerate(zip(rows, lookups)):
        a = lo[k] + 1
        b = REUSE_BIN_EDGES[k] if k < len(REUSE_BIN_EDGES) else 4 * lo[k]
        if r >= 0.001:
            m = l / r * avg_reuse
        else:
            m = math.sqrt(a * b)
        means.append(min(max(m, a), b))
    return np.array(means)


def reuse_counts(total: int, rng, rows=META_2021_ROWS, lookups=META_2021_LOOKUPS,
                 avg_reuse=META_2021_AVG_REUSE) -> np.ndarray:
    """A multiset of per-row reuse counts summing to ``total`` whose histograms match the target.

    Per bin ``(lo, hi]`` the lookup budget is ``total * lookups[k]`` and the row count is that
    budget over the bin's mean reuse; counts inside a bin spread between ``lo + 1`` and ``hi``
    around that mean. A budget too small for even one row of its bin moves one bin down (only at
    small ``total``). Returns ``(D,)`` int64 counts in descending order.
    """
    lk = np.asarray(lookups, dtype=np.float64)
    lk = lk / lk.sum()
    means = _bin_means(rows, lk, avg_reuse)
    nb = lk.shape[0]
    budgets = np.floor(lk * total).astype(np.int64)
    budgets[0] += total - budgets.sum()
    parts = []
    carry = 0
    for k in range(nb - 1, -1, -1):
        s = int(budgets[k]) + carry
        carry = 0
        lo = 0 if k == 0 else REUSE_BIN_EDGES[k - 1]
        hi = REUSE_BIN_EDGES[k] if k < len(REUSE_BIN_EDGES) else 4 * lo
        if k == 0:
            parts.append(np.ones(s, dtype=np.int64))
            continue
        if s < lo + 1:
            carry = s
            continue
        n = int(round(s / means[k]))
        n = min(max(n, -(-s // hi), 1), s // (lo + 1))
        mu = s / n
        if hi > lo + 1:
            # power of a uniform: exponent chosen so the expected count is the bin's mean
            g = (hi - lo) / max(mu - lo - 0.5, 1e-9) - 1.0
            g = min(max(g, 0.05), 50.0)
            c = lo + 1 + np.floor(rng.random(n) ** g * (hi - lo)).astype(np.int64)
            np.clip(c, lo + 1, hi, out=c)
            left = _fill_bin(c, lo + 1, hi, s)
            if left:  # cannot happen with n chosen above; kept exact by construction
                carry = int(left)
        else:
            c = np.full(n, hi, dtype=np.int64)
            carry = s - n * hi
        parts.append(c)
    counts = np.concatenate(parts)
    return np.sort(counts)[::-1].copy()


# ---------------------------------------------------------------------------------- generator


class GeneratedTrace:
    """A generated trace, produced lazily batch by batch (iterate it or pass it to ``save``).

    Attributes: ``profile`` (:class:`Profile`), ``seed``, ``table_sizes`` ``(T,)`` int64,
    ``metadata`` (dict: generator, profile, seed, parameters). Batch ``i`` depends only on
    ``(seed, i)``, so any batch can be regenerated alone.
    """

    def __init__(self, profile: Profile, seed: int = 0):
        self.profile = profile
        self.seed = check_int(seed, "seed", lo=0, error=ConfigError)
        self._dist: StackDistanceDistribution | None = None
        if profile.kind == "stack-distance":
            self._dist = read_dist_file(profile.dist_file)
            self.table_sizes = np.array([int(self._dist.unique_accesses.max()) + 1], dtype=np.int64)
            self._sd_keys = None
        else:
            self.table_sizes = np.array(profile.table_sizes, dtype=np.int64)
        trng = np.random.default_rng([self.seed, 0x5D3])
        self._perms = [_affine_perm(int(n), trng) for n in self.table_sizes]
        params = {k: v for k, v in asdict(profile).items() if k not in ("name", "description")}
        self.metadata = {"generator": f"sdm.trace.generate/{profile.kind}", "profile": profile.name,
                         "seed": self.seed, "params": params}

    def __len__(self) -> int:
        return self.profile.batches

    def __iter__(self) -> Iterator[Batch]:
        for i in range(len(self)):
            yield self.batch(i)

    def _ids(self, t: int, ranks: np.ndarray, i: int) -> np.ndarray:
        n = int(self.table_sizes[t])
        a, c = self._perms[t]
        shift = int(self.profile.drift_rows_per_batch * i)
        if shift:
            ranks = (ranks + shift) % n
        return (ranks * a + c) % n

    def _size(self, i: int) -> int:
        """Samples (inference: requests) of batch ``i``: full batches, then the remainder."""
        p = self.profile
        if p.requests is None:
            return p.batch_size
        return max(0, min(p.batch_size, p.requests - i * p.batch_size))

    def _table(self, rng, t: int, bsz: int, i: int):
        p = self.profile
        lengths = _bag_lengths(rng, bsz, p.pooling[t], p.fixed_pooling)
        nnz = int(lengths.sum())
        n = int(self.table_sizes[t])
        if p.kind == "uniform":
            ids = rng.integers(0, n, size=nnz, dtype=np.int64)
        else:
            ids = self._ids(t, zipf_ranks(rng.random(nnz), n, p.alpha[t]), i)
        return ids, _offsets(lengths)

    def batch(self, i: int) -> Batch:
        """Batch ``i`` (0-based) of the trace."""
        if not 0 <= i < len(self):
            raise IdOutOfRangeError(f"batch {i} out of range for a trace of {len(self)} batch{'' if len(self) == 1 else 'es'}")
        p = self.profile
        rng = np.random.default_rng([self.seed, int(i)])
        if p.kind == "meta-2021":
            return self._meta_batch(rng, i)
        if p.kind == "stack-distance":
            return self._sd_batch(i)
        if p.kind == "inference":
            return self._inference_batch(rng, i)
        ind, off = [], []
        for t in range(p.num_tables):
            ids, o = self._table(rng, t, self._size(i), i)
            ind.append(ids)
            off.append(o)
        return Batch(ind, off, dense=self._dense(rng, self._size(i)))

    def _dense(self, rng, bsz):
        if not self.profile.dense:
            return None
        # Criteo-like dense counts after DLRM's log(x + 1)
        raw = np.floor(rng.exponential(8.0, size=(bsz, self.profile.dense)))
        return np.log1p(raw).astype(np.float32)

    def _inference_batch(self, rng, i):
        p = self.profile
        reqs, items = self._size(i), p.items_per_request
        bsz = reqs * items
        ind, off = [], []
        for t in range(p.num_tables):
            if t < p.user_tables:
                ids, o = self._table(rng, t, reqs, i)
                lengths = np.repeat(np.diff(o), items)
                # every item of a request repeats the user's bag
                starts = np.repeat(o[:-1], items)
                pos = np.repeat(starts - _offsets(lengths)[:-1], lengths) + np.arange(lengths.sum())
                ind.append(ids[pos])
                off.append(_offsets(lengths))
            else:
                ids, o = self._table(rng, t, bsz, i)
                ind.append(ids)
                off.append(o)
        first = i * p.batch_size
        req = np.repeat(np.arange(first, first + reqs, dtype=np.int64), items)
        return Batch(ind, off, dense=self._dense(rng, bsz), request_ids=req)

    def _sd_batch(self, i):
        p = self.profile
        per = int(round(p.pooling[0])) or 1
        if self._sd_keys is None:
            # the LRU stack spans batches, so the whole stream is drawn once and sliced
            rng = np.random.default_rng([self.seed, 0x5D])
            total = sum(self._size(j) for j in range(len(self))) * per
            self._sd_keys = generate_stack_distance_keys(self._dist, total, rng)
        start = i * p.batch_size * per
        ids = self._sd_keys[start:start + self._size(i) * per]
        return Batch([ids], [np.arange(0, ids.shape[0] + 1, per, dtype=np.int64)])

    def _meta_batch(self, rng, i):
        p = self.profile
        bsz, ntab = self._size(i), p.num_tables
        pool = np.array(p.pooling, dtype=np.float64)
        total = int(round(bsz * pool.sum()))
        counts = reuse_counts(total, rng)
        table_of = _assign_tables(counts, pool / pool.sum() * total, rng.random(counts.shape[0]))
        ind, off = [], []
        for t in range(ntab):
            c = counts[table_of == t]
            n = int(self.table_sizes[t])
            if c.shape[0] > n:
                raise ConfigError(f"table {t} has {n} rows but a meta-2021 batch needs "
                                  f"{c.shape[0]} distinct rows in it; raise --table-size or lower "
                                  f"--batch-size")
            ranks = self._distinct_ranks(rng, n, c.shape[0])
            ids = np.repeat(self._ids(t, ranks, i), c)
            rng.shuffle(ids)
            lengths = rng.multinomial(ids.shape[0], np.full(bsz, 1.0 / bsz)).astype(np.int64)
            ind.append(ids)
            off.append(_offsets(lengths))
        return Batch(ind, off)

    def _distinct_ranks(self, rng, n: int, k: int) -> np.ndarray:
        """``k`` distinct ranks touched by a Zipf(row_alpha) stream, ascending."""
        out = np.empty(k, dtype=np.int64)
        seen = np.zeros(n, dtype=np.bool_)
        have = 0
        for _ in range(64):
            if have == k:
                break
            have = _first_distinct(zipf_ranks(rng.random(max(4 * (k - have), 1024)), n,
                                              self.profile.row_alpha), seen, out, have)
        if have < k:  # a prior too skewed for k: finish with uniformly drawn unseen rows
            rest = np.flatnonzero(~seen)
            out[have:] = rng.choice(rest, size=k - have, replace=False)
        # hottest counts on the lowest ranks drawn: the head is drawn in every batch, so hot rows
        # stay hot across batches while the once-used tail changes
        return np.sort(out)


def generate(profile: str | Profile = "zipf", *, seed: int = 0, **overrides) -> GeneratedTrace:
    """A seeded synthetic trace from a named profile (see ``PROFILES``) with overrides of
    :func:`get_profile` (``requests``, ``batches``, ``batch_size``, ``tables``, ``table_size``,
    ``pooling``, ``alpha``, ``max_rows``, ``drift``, ``items_per_request``, ``dense``,
    ``dist_file``). Nothing is drawn until batches are iterated."""
    if not isinstance(profile, Profile):
        profile = get_profile(profile, **overrides)
    elif overrides:
        raise InvalidArgumentError("overrides apply to profile names, not to a Profile object")
    return GeneratedTrace(profile, seed)


def generate_to(path, profile: str | Profile = "zipf", *, seed: int = 0, compress: bool = False,
                progress: bool = False, **overrides) -> str:
    """Generate a trace and write it to ``path`` batch by batch (optionally with a tqdm bar)."""
    gen = generate(profile, seed=seed, **overrides)
    it = iter(gen)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, total=len(gen), unit="batch", desc=f"trace gen {gen.profile.name}")
    with TraceWriter(path, gen.table_sizes, gen.metadata, compress=compress) as w:
        for b in it:
            w.add(b)
    return w.path
