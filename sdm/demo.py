"""The embedded default job: build a small store from generated tables, serve a stream of
pooled lookups through each hierarchy preset, and compare what each tier did.

Used by ``sdm run`` (and so ``make run``); needs no download and no server.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from sdm.store import Store, TableSpec

DEMO_TABLES = (
    TableSpec("user_id", 200_000, 64, "fp32"),
    TableSpec("item_id", 100_000, 64, "fp16"),
    TableSpec("category", 5_000, 32, "int8"),
    TableSpec("context", 50_000, 64, "int8"),
)


@dataclass
class PresetRun:
    """What one preset did on the demo stream."""

    preset: str
    lookups: int
    seconds: float
    tiers: list = field(default_factory=list)
    checksum: float = 0.0

    @property
    def lookups_per_s(self) -> float:
        return self.lookups / self.seconds if self.seconds else float("inf")


def zipf_batches(specs, *, batches: int, bags: int, pooling: int, alpha: float, seed: int):
    """``batches`` requests ``{name: (indices int64, offsets int64 (bags+1,))}`` with Zipf(alpha)
    ids whose ranks are scattered over each table by a fixed permutation."""
    rng = np.random.default_rng(seed)
    perms = {s.name: rng.permutation(s.num_rows) for s in specs}
    out = []
    for _ in range(batches):
        batch = {}
        for s in specs:
            lengths = rng.integers(0, 2 * pooling + 1, bags)
            ranks = (rng.zipf(alpha, int(lengths.sum())) - 1) % s.num_rows
            batch[s.name] = (perms[s.name][ranks], np.concatenate([[0], np.cumsum(lengths)]))
        out.append(batch)
    return out


def run_demo(presets=("dram", "ssd"), *, batches: int = 40, bags: int = 256, pooling: int = 20,
             alpha: float = 1.05, seed: int = 0, workdir: str | None = None) -> list[PresetRun]:
    """Build the demo store under ``workdir`` (a temp dir by default) and replay one Zipf
    stream through each preset. Returns one :class:`PresetRun` per preset."""
    with tempfile.TemporaryDirectory(prefix="sdm-demo-", dir=workdir) as tmp:
        path = os.path.join(tmp, "store")
        rng = np.random.default_rng(seed)
        with Store.create(path, DEMO_TABLES) as store:
            for spec in DEMO_TABLES:
                store.write_table(spec.name, rng.standard_normal((spec.num_rows, spec.dim), dtype=np.float32))
        stream = zipf_batches(DEMO_TABLES, batches=batches, bags=bags, pooling=pooling, alpha=alpha, seed=seed)
        runs = []
        for preset in presets:
            with Store.open(path, config=preset) as store:
                store.embedding_bags(stream[0])  # warm: load DRAM tables, compile kernels
                warm = store.stats()
                t0 = time.perf_counter()
                total = 0.0
                for batch in stream:
                    pooled = store.embedding_bags(batch)
                    total += float(sum(p.sum(dtype=np.float64) for p in pooled.values()))
                seconds = time.perf_counter() - t0
                stats = store.stats()
            tiers = [_minus(t, w) for t, w in zip(stats["tiers"], warm["tiers"])]
            runs.append(PresetRun(preset, stats["lookups"] - warm["lookups"], seconds, tiers, total))
        return runs


def _minus(after: dict, before: dict) -> dict:
    return {k: (v - before.get(k, 0) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
            for k, v in after.items()}
