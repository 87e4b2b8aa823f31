"""``sdm shard build``: one store directory per worker of a plan, cut from a store.

The output directory holds ``plan.json`` (the plan the shards were cut by, written last: a
directory without it is incomplete) and ``w<k>/`` for every worker ``k`` that holds a shard:
an ordinary store whose table ``s<i>`` (:func:`sdm.cluster.planner.shard_table_name`) holds the
rows and columns of the plan's shard ``i``, re-indexed from 0. The directory appears only when
complete (built under a temporary name, then renamed).

Every shard holds exactly the source store's bytes. fp32 and fp16 rows are read as float32
(exact for both) and written back. The store has no raw write, so an int8 shard is written as
float rows chosen so that the store's encoder reproduces the source's codes, scale and bias
exactly (:func:`int8_preimage`); every chunk is checked and a row that cannot be reproduced
stops the build.
"""

from __future__ import annotations

import os
import shutil
import uuid

import numpy as np

import sdm
from sdm.cluster.errors import PlanError
from sdm.cluster.planner import Plan, shard_table_name

__all__ = ["build", "check_plan", "worker_dir", "int8_preimage", "PLAN_FILE"]

PLAN_FILE = "plan.json"
_CHUNK_BYTES = 8 << 20  # float32 rows read from the source per step
_EPS = np.float32(1e-8)  # the encoder's epsilon (sdm.quantize_rows)
_255 = np.float32(255)


def worker_dir(root, worker: int) -> str:
    """The store directory of ``worker`` under a built shard directory ``root``."""
    return os.path.join(os.fspath(root), f"w{worker}")


def check_plan(plan: Plan, tables) -> None:
    """PlanError unless ``plan`` was made for exactly these tables (``{name: TableSpec}``,
    in store order)."""
    have = [t.spec for t in plan.tables]
    want = list(tables.values())
    if have != want:
        i = next((i for i, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want)))
        ours, theirs = (specs[i] if i < len(specs) else "nothing" for specs in (have, want))
        raise PlanError(f"the plan's tables are not the store's ({len(have)} vs {len(want)} tables): "
                        f"table {i} is {ours} in the plan, {theirs} in the store")


def build(store, plan, out_dir, *, progress: bool | None = None) -> str:
    """Cut ``store`` (a path) into the per-worker store directories of ``plan`` (a
    :class:`~sdm.cluster.planner.Plan` or a plan file) under ``out_dir``. Returns ``out_dir``,
    absolute.

    Raises:
        StoreExistsError: ``out_dir`` exists (nothing is touched).
        PlanError: the plan does not match the store's tables.
        StoreError: ``out_dir``'s parent is missing, or a source row cannot be reproduced.
    """
    plan = plan if isinstance(plan, Plan) else Plan.load(plan)
    out_dir = os.path.abspath(os.fspath(out_dir))
    if os.path.lexists(out_dir):
        raise sdm.errors.StoreExistsError(f"cannot build shards at {out_dir}: it already exists")
    parent = os.path.dirname(out_dir)
    if not os.path.isdir(parent):
        raise sdm.errors.StoreNotFoundError(f"cannot build shards at {out_dir}: {parent} is not a directory")
    with sdm.Store.open(store, config="ssd", readonly=True) as src:
        check_plan(plan, src.tables)
        tmp = os.path.join(parent, f".{os.path.basename(out_dir)}.building-{uuid.uuid4().hex[:12]}")
        os.mkdir(tmp)
        try:
            shards = list(enumerate(plan.shards))
            for w in sorted({s.worker for _, s in shards}):
                mine = [(i, s) for i, s in shards if s.worker == w]
                specs = [_shard_spec(plan, i, s) for i, s in mine]
                with sdm.Store.create(worker_dir(tmp, w), specs, config="ssd") as dst:
                    for (_, s), spec in zip(mine, specs):
                        dst.write_table(spec.name, _rows(src, plan.table(s.table).spec, s), progress=progress)
            plan.save(os.path.join(tmp, PLAN_FILE))
            os.rename(tmp, out_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out_dir


def _shard_spec(plan: Plan, index: int, shard) -> sdm.TableSpec:
    spec = plan.table(shard.table).spec
    return sdm.TableSpec(shard_table_name(index), shard.rows[1] - shard.rows[0],
                         shard.columns[1] - shard.columns[0], spec.fmt)


def _rows(src, spec: sdm.TableSpec, shard):
    """The shard's rows as float32 chunks that encode to the source's exact bytes."""
    (start, stop), (c0, c1) = shard.rows, shard.columns
    step = max(1, _CHUNK_BYTES // (4 * spec.dim))
    for lo in range(start, stop, step):
        ids = np.arange(lo, min(lo + step, stop))
        if spec.fmt != "int8":
            yield src.lookup(spec.name, ids)[:, c0:c1]
            continue
        raw = src.lookup_raw(spec.name, ids)
        rows = int8_preimage(raw, spec.dim)
        if not np.isfinite(rows).all():
            r = int(ids[np.flatnonzero(~np.isfinite(rows).all(axis=1))[0]])
            raise sdm.errors.StoreError(f"row {r} of table {spec.name!r}: its int8 bytes cannot be "
                                        f"reproduced through Store.write_table")
        yield rows


def int8_preimage(raw: np.ndarray, dim: int) -> np.ndarray:
    """Float rows that :func:`sdm.quantize_rows` encodes to exactly ``raw``.

    Args:
        raw: ``(n, dim + 8) uint8`` int8 rows made by :func:`sdm.quantize_rows`.
        dim: values per row.

    Returns:
        ``(n, dim) float32``; a row for which none was found is all NaN.

    The decoded row (``q * scale + bias``) re-encodes to itself for almost every row; where
    it does not, the float rounding of the span ``max - min`` moved the scale by an ulp. Then
    spans near ``255 * scale`` are tried, nearest first, that divide back to the scale and are
    a float difference from the bias; each gives a row with ``min == bias``, ``max == bias +
    span`` and every code placed by the encoder's inverse scale (nudged by an ulp where the
    rounding of ``x - min`` disagrees), kept once it encodes to ``raw``.
    """
    raw = np.ascontiguousarray(raw)
    out = sdm.dequantize_rows(raw, "int8", dim)
    todo = np.flatnonzero((sdm.quantize_rows(out, "int8") != raw).any(axis=1))
    if not len(todo):
        return out
    out[todo] = np.nan
    codes = raw[:, :dim].astype(np.float32)
    tail = np.ascontiguousarray(raw[:, dim:]).view(np.float32)
    scale, bias = tail[:, 0], tail[:, 1]
    top = np.argmax(raw[:, :dim], axis=1)
    base = _255 * scale
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(4096):
            if not len(todo):
                break
            step = np.float32((k + 1) // 2 * (1 if k % 2 else -1))
            span = (base[todo] + step * np.spacing(base[todo])).astype(np.float32)
            lo = bias[todo]
            hi = (lo + span).astype(np.float32)
            ok = ((span / _255).astype(np.float32) == scale[todo]) & ((hi - lo).astype(np.float32) == span)
            if not ok.any():
                continue
            rows, span, lo, hi = todo[ok], span[ok], lo[ok, None], hi[ok, None]
            inv = (_255 / (span + _EPS)).astype(np.float32)
            q = codes[rows]
            x = np.clip((lo + (q / inv[:, None]).astype(np.float32)).astype(np.float32), lo, hi)
            x = np.where(q == 0, lo, x)
            x[np.arange(len(rows)), top[rows]] = hi[:, 0]
            for _ in range(3):
                got = sdm.quantize_rows(x, "int8")
                done = (got == raw[rows]).all(axis=1)
                out[rows[done]] = x[done]
                off = got[:, :dim].astype(np.int16) - raw[rows, :dim]
                x = np.where(off < 0, np.nextafter(x, np.float32(np.inf)),
                             np.where(off > 0, np.nextafter(x, np.float32(-np.inf)), x))
            todo = todo[~np.isfinite(out[todo, 0])]
    return out
