"""Bad-input corpus over the public API (DESIGN.md §6).

Every case feeds one malformed value to one public function and asserts the exact typed
error of ``sdm.errors`` (each subclasses the builtin a caller expects) and that the message
names the bad value or field and, where there is one, the limit. Cases that touch a store
also assert that nothing on disk changed.

A case is ``(call, error class, words)``: ``call`` takes the fixture context, ``words`` must
all appear in the message.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import sdm
from sdm import errors
from sdm import trace as tr
from sdm.store.config import HierarchyConfig, TierConfig, load_toml, resolve_config, with_io_mode, with_options
from sdm.model import load_npz
from sdm.store.placement import Placement
from sdm.replay.planner import plan
from sdm.policies import Cache
from sdm.store.prefetch import Lookahead
from sdm.report import load_scenario
from test_store_errors import tree_digest  # every file's bytes under a store

E = errors
TABLE = np.arange(40, dtype=np.float32).reshape(10, 4)
OFF = np.array([0, 1])


def check(call, err, words, ctx=None):
    with pytest.raises(err) as info:
        call(ctx) if ctx is not None else call()
    assert type(info.value) is err, f"expected exactly {err.__name__}, got {type(info.value).__name__}"
    msg = str(info.value)
    for word in words:
        assert word in msg, f"{word!r} not in {msg!r}"
    assert "\n" not in msg.strip(), f"message is not one line: {msg!r}"


def cases(*rows):
    """``pytest.param`` per row ``(id, call, err, words[, marks])``."""
    return [pytest.param(*r[1:4], id=r[0], marks=r[4] if len(r) > 4 else ()) for r in rows]


# -- sdm.embedding_bag ------------------------------------------------------------------

BAG = cases(
    # ids
    ("ids-negative", lambda: sdm.embedding_bag(TABLE, [-1], OFF), E.IdOutOfRangeError, ["-1", "[0, 10)"]),
    ("ids-too-large", lambda: sdm.embedding_bag(TABLE, [10], OFF), E.IdOutOfRangeError, ["10", "[0, 10)"]),
    ("ids-huge-uint64", lambda: sdm.embedding_bag(TABLE, np.array([2**64 - 1], np.uint64), OFF),
     E.IdOutOfRangeError, [str(2**64 - 1), "10 rows"]),
    ("ids-float", lambda: sdm.embedding_bag(TABLE, [1.0], OFF), E.InvalidArgumentError, ["integer", "float64"]),
    ("ids-nan", lambda: sdm.embedding_bag(TABLE, [np.nan], OFF), E.InvalidArgumentError, ["integer", "float64"]),
    ("ids-bool", lambda: sdm.embedding_bag(TABLE, [True], OFF), E.InvalidArgumentError, ["integer", "bool"]),
    ("ids-object", lambda: sdm.embedding_bag(TABLE, np.array([1], dtype=object), OFF),
     E.InvalidArgumentError, ["integer", "object"]),
    ("ids-str", lambda: sdm.embedding_bag(TABLE, ["1"], OFF), E.InvalidArgumentError, ["integer", "<U1"]),
    ("ids-2d", lambda: sdm.embedding_bag(TABLE, [[1]], OFF), E.InvalidArgumentError, ["1-D", "(1, 1)"]),
    ("ids-scalar", lambda: sdm.embedding_bag(TABLE, 3, OFF), E.InvalidArgumentError, ["1-D", "()"]),
    ("ids-none", lambda: sdm.embedding_bag(TABLE, None, OFF), E.InvalidArgumentError, ["1-D"]),
    ("ids-ragged", lambda: sdm.embedding_bag(TABLE, [[1], [1, 2]], OFF), E.InvalidArgumentError, ["ragged", "list"]),
    # offsets
    ("offsets-not-from-0", lambda: sdm.embedding_bag(TABLE, [0], [1, 1]), E.InvalidOffsetsError, ["offsets[0]", "1"]),
    ("offsets-decreasing", lambda: sdm.embedding_bag(TABLE, [0, 1], [0, 2, 1, 2]), E.InvalidOffsetsError,
     ["non-decreasing", "offsets[2] = 1"]),
    ("offsets-wrong-last", lambda: sdm.embedding_bag(TABLE, [0, 1], [0, 1]), E.InvalidOffsetsError,
     ["offsets[-1]", "= 2", "got 1"]),
    ("offsets-float", lambda: sdm.embedding_bag(TABLE, [0], [0.0, 1.0]), E.InvalidOffsetsError, ["integer", "float64"]),
    ("offsets-bool", lambda: sdm.embedding_bag(TABLE, [0], [False, True]), E.InvalidOffsetsError, ["integer", "bool"]),
    ("offsets-object", lambda: sdm.embedding_bag(TABLE, [0], np.array([0, 1], dtype=object)),
     E.InvalidOffsetsError, ["integer", "object"]),
    ("offsets-2d", lambda: sdm.embedding_bag(TABLE, [0], [[0, 1]]), E.InvalidOffsetsError, ["1-D", "(1, 2)"]),
    ("offsets-empty", lambda: sdm.embedding_bag(TABLE, [0], []), E.InvalidOffsetsError, ["B + 1", "got 0"]),
    ("offsets-ragged", lambda: sdm.embedding_bag(TABLE, [0], [[0], [0, 1]]), E.InvalidOffsetsError, ["offsets", "ragged"]),
    # formats, modes, dims, tables, weights, out
    ("fmt-unknown", lambda: sdm.embedding_bag(TABLE, [0], OFF, fmt="fp64"), E.InvalidArgumentError, ["'fp64'", "fp32"]),
    ("fmt-none", lambda: sdm.embedding_bag(TABLE, [0], OFF, fmt=None), E.InvalidArgumentError, ["None", "fp32"]),
    ("mode-unknown", lambda: sdm.embedding_bag(TABLE, [0], OFF, mode="max"), E.InvalidArgumentError, ["'max'", "sum"]),
    ("mode-unhashable", lambda: sdm.embedding_bag(TABLE, [0], OFF, mode=[]), E.InvalidArgumentError, ["[]", "mean"]),
    ("dim-mismatch", lambda: sdm.embedding_bag(TABLE, [0], OFF, dim=5), E.InvalidArgumentError, ["dim 5", "4 columns"]),
    ("dim-str", lambda: sdm.embedding_bag(TABLE, [0], OFF, dim="4"), E.InvalidArgumentError, ["dim", "'4'"]),
    ("dim-bool", lambda: sdm.embedding_bag(TABLE, [0], OFF, dim=True), E.InvalidArgumentError, ["dim", "True"]),
    ("int8-dim-str", lambda: sdm.embedding_bag(np.zeros((2, 12), np.uint8), [0], OFF, fmt="int8", dim="4"),
     E.InvalidArgumentError, ["dim", "'4'"]),
    ("table-1d", lambda: sdm.embedding_bag(np.zeros(4, np.float32), [0], OFF), E.InvalidArgumentError, ["2-D", "(4,)"]),
    ("table-float64", lambda: sdm.embedding_bag(np.zeros((2, 2)), [0], OFF), E.InvalidArgumentError,
     ["float32", "float64"]),
    ("table-fp16-is-float32", lambda: sdm.embedding_bag(TABLE, [0], OFF, fmt="fp16"), E.InvalidArgumentError,
     ["float16", "float32"]),
    ("table-int8-float32", lambda: sdm.embedding_bag(np.zeros((2, 12), np.float32), [0], OFF, fmt="int8"),
     E.InvalidArgumentError, ["uint8", "float32"]),
    ("table-int8-too-narrow", lambda: sdm.embedding_bag(np.zeros((2, 8), np.uint8), [0], OFF, fmt="int8"),
     E.InvalidArgumentError, ["bytes per row", "8"]),
    ("table-no-columns", lambda: sdm.embedding_bag(np.zeros((2, 0), np.float32), [0], OFF), E.InvalidArgumentError,
     ["dim >= 1", "0 columns"]),
    ("table-object", lambda: sdm.embedding_bag(np.zeros((2, 2), object), [0], OFF), E.InvalidArgumentError,
     ["float32", "object"]),
    ("table-ragged", lambda: sdm.embedding_bag([[1.0], [1.0, 2.0]], [0], OFF), E.InvalidArgumentError, ["table", "ragged"]),
    ("weights-int", lambda: sdm.embedding_bag(TABLE, [0], OFF, per_sample_weights=[1]), E.InvalidArgumentError,
     ["floating", "int64"]),
    ("weights-length", lambda: sdm.embedding_bag(TABLE, [0], OFF, per_sample_weights=[1.0, 2.0]),
     E.InvalidArgumentError, ["(1,)", "(2,)"]),
    ("weights-2d", lambda: sdm.embedding_bag(TABLE, [0], OFF, per_sample_weights=[[1.0]]), E.InvalidArgumentError,
     ["(1,)", "(1, 1)"]),
    ("weights-ragged", lambda: sdm.embedding_bag(TABLE, [0], OFF, per_sample_weights=[[1.0], [1.0, 2.0]]),
     E.InvalidArgumentError, ["per_sample_weights", "ragged"]),
    ("out-shape", lambda: sdm.embedding_bag(TABLE, [0], OFF, out=np.empty((2, 4), np.float32)),
     E.InvalidArgumentError, ["(1, 4)", "float32"]),
    ("out-dtype", lambda: sdm.embedding_bag(TABLE, [0], OFF, out=np.empty((1, 4))), E.InvalidArgumentError,
     ["(1, 4)", "float32"]),
    ("out-list", lambda: sdm.embedding_bag(TABLE, [0], OFF, out=[[0.0] * 4]), E.InvalidArgumentError, ["out", "(1, 4)"]),
)


@pytest.mark.parametrize("call, err, words", BAG)
def test_embedding_bag(call, err, words):
    check(call, err, words)


# -- row formats ------------------------------------------------------------------------

RAW = np.zeros((1, 4), np.uint8)
FORMATS = cases(
    ("quantize-1d", lambda: sdm.quantize_rows([1.0], "fp32"), E.InvalidArgumentError, ["2-D", "(1,)"]),
    ("quantize-3d", lambda: sdm.quantize_rows(np.zeros((1, 1, 1)), "fp32"), E.InvalidArgumentError, ["2-D", "(1, 1, 1)"]),
    ("quantize-nan", lambda: sdm.quantize_rows([[np.nan]], "fp32"), E.InvalidArgumentError, ["finite", "NaN"]),
    ("quantize-inf-int8", lambda: sdm.quantize_rows([[np.inf]], "int8"), E.InvalidArgumentError, ["finite"]),
    ("quantize-float64-overflow", lambda: sdm.quantize_rows([[1e300]], "fp32"), E.InvalidArgumentError, ["finite"]),
    ("quantize-fp16-overflow", lambda: sdm.quantize_rows([[1.0, 1e6]], "fp16"), E.InvalidArgumentError,
     ["1000000.0", "65504"]),
    ("quantize-int8-span-overflow", lambda: sdm.quantize_rows([[3e38, -3e38]], "int8"), E.InvalidArgumentError,
     ["row 0", "float32"]),
    ("quantize-str", lambda: sdm.quantize_rows([["a"]], "fp32"), E.InvalidArgumentError, ["numeric", "<U1"]),
    ("quantize-object", lambda: sdm.quantize_rows(np.zeros((1, 1), object), "fp32"), E.InvalidArgumentError,
     ["numeric", "object"]),
    ("quantize-complex", lambda: sdm.quantize_rows([[1j]], "fp32"), E.InvalidArgumentError, ["numeric", "complex128"]),
    ("quantize-dim-0", lambda: sdm.quantize_rows(np.zeros((1, 0)), "fp32"), E.InvalidArgumentError, ["dim >= 1", "dim 0"]),
    ("quantize-fmt", lambda: sdm.quantize_rows([[1.0]], "fp64"), E.InvalidArgumentError, ["'fp64'", "int8"]),
    ("quantize-fmt-int", lambda: sdm.quantize_rows([[1.0]], 3), E.InvalidArgumentError, ["3", "fp16"]),
    ("dequantize-float32", lambda: sdm.dequantize_rows(np.zeros((1, 4), np.float32), "fp32", 1),
     E.InvalidArgumentError, ["(n, 4) uint8", "float32"]),
    ("dequantize-width", lambda: sdm.dequantize_rows(np.zeros((1, 3), np.uint8), "fp32", 1), E.InvalidArgumentError,
     ["(n, 4) uint8", "(1, 3)"]),
    ("dequantize-1d", lambda: sdm.dequantize_rows(np.zeros(4, np.uint8), "fp32", 1), E.InvalidArgumentError,
     ["(n, 4) uint8", "(4,)"]),
    ("dequantize-dim-0", lambda: sdm.dequantize_rows(RAW, "fp32", 0), E.InvalidArgumentError, ["positive", "0"]),
    ("dequantize-dim-float", lambda: sdm.dequantize_rows(RAW, "fp32", 1.0), E.InvalidArgumentError, ["positive", "1.0"]),
    ("dequantize-dim-bool", lambda: sdm.dequantize_rows(RAW, "fp32", True), E.InvalidArgumentError, ["positive", "True"]),
    ("dequantize-dim-str", lambda: sdm.dequantize_rows(RAW, "fp32", "1"), E.InvalidArgumentError, ["positive", "'1'"]),
    ("dequantize-fmt", lambda: sdm.dequantize_rows(RAW, "bf16", 1), E.InvalidArgumentError, ["'bf16'", "fp32"]),
)


@pytest.mark.parametrize("call, err, words", FORMATS)
def test_formats(call, err, words):
    check(call, err, words)


# -- simulator and Cache ----------------------------------------------------------------

K = np.array([1, 2, 3, 1])
SIM = cases(
    ("policy-unknown", lambda: sdm.simulate(K, policy="lrux", capacity=2), E.InvalidArgumentError, ["'lrux'", "lru"]),
    ("policy-none", lambda: sdm.simulate(K, policy=None, capacity=2), E.InvalidArgumentError, ["None", "fifo"]),
    ("capacity-0", lambda: sdm.simulate(K, policy="lru", capacity=0), E.InvalidArgumentError, ["0", "[1, 2147483647]"]),
    ("capacity-huge", lambda: sdm.simulate(K, policy="lru", capacity=2**40), E.InvalidArgumentError,
     [str(2**40), "2147483647"]),
    ("capacity-float", lambda: sdm.simulate(K, policy="lru", capacity=2.0), E.InvalidArgumentError, ["integer", "2.0"]),
    ("capacity-str", lambda: sdm.simulate(K, policy="lru", capacity="2"), E.InvalidArgumentError, ["integer", "'2'"]),
    ("capacity-bool", lambda: sdm.simulate(K, policy="lru", capacity=True), E.InvalidArgumentError, ["integer", "True"]),
    ("admission-unknown", lambda: sdm.simulate(K, policy="lru", capacity=2, admission="x"), E.InvalidArgumentError,
     ["'x'", "tinylfu"]),
    ("seed-str", lambda: sdm.simulate(K, policy="random", capacity=2, seed="x"), E.InvalidArgumentError, ["seed", "'x'"]),
    ("seed-none", lambda: sdm.simulate(K, policy="random", capacity=2, seed=None), E.InvalidArgumentError,
     ["seed", "None"]),
    ("small-ratio-str", lambda: sdm.simulate(K, policy="s3fifo", capacity=2, small_ratio="x"), E.InvalidArgumentError,
     ["small_ratio", "'x'", "(0, 1)"]),
    ("small-ratio-none", lambda: sdm.simulate(K, policy="s3fifo", capacity=2, small_ratio=None),
     E.InvalidArgumentError, ["small_ratio", "None"]),
    ("ghost-ratio-1", lambda: sdm.simulate(K, policy="s3fifo", capacity=2, ghost_ratio=1.0), E.InvalidArgumentError,
     ["ghost_ratio", "1.0", "(0, 1)"]),
    ("small-ratio-nan", lambda: sdm.simulate(K, policy="s3fifo", capacity=2, small_ratio=float("nan")),
     E.InvalidArgumentError, ["small_ratio", "nan"]),
    ("move-to-main-bool", lambda: sdm.simulate(K, policy="s3fifo", capacity=2, move_to_main=True),
     E.InvalidArgumentError, ["move_to_main", "True"]),
    ("keys-negative", lambda: sdm.simulate([-1], policy="lru", capacity=2), E.InvalidArgumentError, ["-1", ">= 0"]),
    ("keys-float", lambda: sdm.simulate([1.0], policy="lru", capacity=2), E.InvalidArgumentError, ["integer", "float64"]),
    ("keys-nan", lambda: sdm.simulate([np.nan], policy="lru", capacity=2), E.InvalidArgumentError, ["integer", "float64"]),
    ("keys-bool", lambda: sdm.simulate([True], policy="lru", capacity=2), E.InvalidArgumentError, ["integer", "bool"]),
    ("keys-object", lambda: sdm.simulate(np.array([1], object), policy="lru", capacity=2), E.InvalidArgumentError,
     ["integer", "object"]),
    ("keys-2d", lambda: sdm.simulate([[1]], policy="lru", capacity=2), E.InvalidArgumentError, ["1-D", "(1, 1)"]),
    ("keys-ragged", lambda: sdm.simulate([[1], [1, 2]], policy="lru", capacity=2), E.InvalidArgumentError,
     ["keys", "ragged"]),
    ("keys-uint64-huge", lambda: sdm.simulate(np.array([2**64 - 1], np.uint64), policy="lru", capacity=2),
     E.InvalidArgumentError, [str(2**64 - 1), str(2**63 - 1)]),
    ("mrc-keys-negative", lambda: sdm.miss_ratio_curve([-5], [1]), E.InvalidArgumentError, ["-5", ">= 0"]),
    ("mrc-capacity-float", lambda: sdm.miss_ratio_curve(K, [1.5]), E.InvalidArgumentError, ["capacities", "float64"]),
    ("mrc-capacity-0", lambda: sdm.miss_ratio_curve(K, [0]), E.InvalidArgumentError, ["0", "[1, 2147483647]"]),
    ("mrc-capacity-2d", lambda: sdm.miss_ratio_curve(K, [[1]]), E.InvalidArgumentError, ["1-D", "(1, 1)"]),
    ("mrc-sample-rate-0", lambda: sdm.miss_ratio_curve(K, [1], sample_rate=0), E.InvalidArgumentError,
     ["sample_rate", "(0, 1]"]),
    ("mrc-sample-rate-fifo", lambda: sdm.miss_ratio_curve(K, [1], policy="fifo", sample_rate=0.5),
     E.InvalidArgumentError, ["sample_rate", "lru"]),
    ("mrc-policy", lambda: sdm.miss_ratio_curve(K, [1], policy="x"), E.InvalidArgumentError, ["'x'", "lru"]),
    ("cache-access-float", lambda: Cache(4).access([1.0]), E.InvalidArgumentError, ["integer", "float64"]),
    ("cache-lookup-negative", lambda: Cache(4).lookup([-1]), E.InvalidArgumentError, ["-1", ">= 0"]),
    ("cache-remove-2d", lambda: Cache(4).remove([[1]]), E.InvalidArgumentError, ["1-D", "(1, 1)"]),
    ("cache-pin-out-of-range", lambda: Cache(4).pin([4]), E.InvalidArgumentError, ["slot 4", "[0, 4)"]),
    ("cache-pin-negative", lambda: Cache(4).pin([-1]), E.InvalidArgumentError, ["slot -1", "[0, 4)"]),
    ("cache-pin-float", lambda: Cache(4).pin([1.0]), E.InvalidArgumentError, ["integer", "float64"]),
    ("cache-contains-negative", lambda: -1 in Cache(4), E.InvalidArgumentError, ["-1", ">= 0"]),
    ("cache-contains-str", lambda: "a" in Cache(4), E.InvalidArgumentError, ["integer", "<U1"]),
    ("cache-belady-no-next-use", lambda: Cache(2, "belady").access([1]), E.InvalidArgumentError,
     ["belady", "next_use"]),
    ("cache-belady-next-use-float", lambda: Cache(2, "belady").access([1], next_use=[1.0]), E.InvalidArgumentError,
     ["next_use", "float64"]),
)


@pytest.mark.parametrize("call, err, words", SIM)
def test_simulator_and_cache(call, err, words):
    check(call, err, words)


# -- TableSpec ------------------------------------------------------------------------

NAME_RULE = "letters, digits"
SPECS = cases(
    ("name-int", lambda: sdm.TableSpec(3, 10, 4), E.InvalidArgumentError, ["name 3", NAME_RULE]),
    ("name-none", lambda: sdm.TableSpec(None, 10, 4), E.InvalidArgumentError, ["name None", NAME_RULE]),
    ("name-empty", lambda: sdm.TableSpec("", 10, 4), E.InvalidArgumentError, ["name ''", "1-128"]),
    ("name-slash", lambda: sdm.TableSpec("a/b", 10, 4), E.InvalidArgumentError, ["'a/b'", NAME_RULE]),
    ("name-parent-slash", lambda: sdm.TableSpec("../x", 10, 4), E.InvalidArgumentError, ["'../x'", NAME_RULE]),
    ("name-absolute", lambda: sdm.TableSpec("/etc/passwd", 10, 4), E.InvalidArgumentError, ["'/etc/passwd'"]),
    ("name-backslash", lambda: sdm.TableSpec("a\\b", 10, 4), E.InvalidArgumentError, ["a\\\\b", NAME_RULE]),
    ("name-nul", lambda: sdm.TableSpec("a\0b", 10, 4), E.InvalidArgumentError, ["a\\x00b", NAME_RULE]),
    ("name-too-long", lambda: sdm.TableSpec("a" * 129, 10, 4), E.InvalidArgumentError, ["1-128"]),
    ("name-non-ascii", lambda: sdm.TableSpec("é", 10, 4), E.InvalidArgumentError, ["'é'", NAME_RULE]),
    ("name-space", lambda: sdm.TableSpec("a b", 10, 4), E.InvalidArgumentError, ["'a b'", NAME_RULE]),
    # manifest.py's _NAME ends in `$`, which also matches before a trailing newline
    ("name-trailing-newline", lambda: sdm.TableSpec("emb\n", 10, 4), E.InvalidArgumentError,
     ["'emb\\n'", NAME_RULE]),
    ("rows-0", lambda: sdm.TableSpec("a", 0, 4), E.InvalidArgumentError, ["num_rows", "[1, 281474976710656]", "got 0"]),
    ("rows-huge", lambda: sdm.TableSpec("a", 2**49, 4), E.InvalidArgumentError, ["num_rows", str(2**49)]),
    ("rows-float", lambda: sdm.TableSpec("a", 10.0, 4), E.InvalidArgumentError, ["num_rows", "10.0"]),
    ("rows-bool", lambda: sdm.TableSpec("a", True, 4), E.InvalidArgumentError, ["num_rows", "True"]),
    ("dim-0", lambda: sdm.TableSpec("a", 10, 0), E.InvalidArgumentError, ["dim", "[1, 65536]", "got 0"]),
    ("dim-huge", lambda: sdm.TableSpec("a", 10, 2**17), E.InvalidArgumentError, ["dim", "131072"]),
    ("dim-str", lambda: sdm.TableSpec("a", 10, "4"), E.InvalidArgumentError, ["dim", "'4'"]),
    ("fmt-unknown", lambda: sdm.TableSpec("a", 10, 4, "fp64"), E.InvalidArgumentError, ["'fp64'", "int8"]),
    ("fmt-none", lambda: sdm.TableSpec("a", 10, 4, None), E.InvalidArgumentError, ["None", "fp32"]),
)


@pytest.mark.parametrize("call, err, words", SPECS)
def test_table_spec(call, err, words):
    check(call, err, words)


# -- Store.create / Store.open -----------------------------------------------------------

SPEC = sdm.TableSpec("emb", 10, 4)
CREATE = cases(
    ("no-tables", lambda p: sdm.Store.create(p / "new", []), E.InvalidArgumentError, ["at least one table"]),
    ("not-a-spec", lambda p: sdm.Store.create(p / "new", [("emb", 10, 4)]), E.InvalidArgumentError,
     ["TableSpec", "tuple"]),
    ("tables-str", lambda p: sdm.Store.create(p / "new", "emb"), E.InvalidArgumentError, ["TableSpec", "str"]),
    ("duplicate-names", lambda p: sdm.Store.create(p / "new", [SPEC, SPEC]), E.InvalidArgumentError,
     ["unique", "'emb'"]),
    ("exists", lambda p: sdm.Store.create(p / "store", [SPEC]), E.StoreExistsError, ["store", "already exists"]),
    ("parent-missing", lambda p: sdm.Store.create(p / "nope" / "new", [SPEC]), E.StoreNotFoundError,
     ["nope", "not a directory"]),
    ("parent-is-file", lambda p: sdm.Store.create(p / "file" / "new", [SPEC]), E.StoreNotFoundError,
     ["file", "not a directory"]),
    ("config-unknown", lambda p: sdm.Store.create(p / "new", [SPEC], config="nvme"), E.ConfigError,
     ["'nvme'", "sdm-nand"]),
    ("config-int", lambda p: sdm.Store.create(p / "new", [SPEC], config=3), E.ConfigError, ["preset", "int"]),
    ("tables-none", lambda p: sdm.Store.create(p / "new", None), E.InvalidArgumentError, ["tables", "None"]),
    ("path-none", lambda p: sdm.Store.create(None, [SPEC]), E.InvalidArgumentError, ["path", "None"]),
    ("path-nul", lambda p: sdm.Store.create(str(p / "a\0b"), [SPEC]), E.InvalidArgumentError, ["\\x00"]),
    ("open-missing", lambda p: sdm.Store.open(p / "missing"), E.StoreNotFoundError, ["missing", "manifest.json"]),
    ("open-file", lambda p: sdm.Store.open(p / "file"), E.StoreNotFoundError, ["file", "manifest.json"]),
    ("open-empty-dir", lambda p: sdm.Store.open(p / "empty"), E.StoreNotFoundError, ["empty", "manifest.json"]),
    ("open-foreign-manifest", lambda p: sdm.Store.open(p / "foreign"), E.CorruptStoreError,
     ["manifest.json", "not an sdm store manifest"]),
    ("open-manifest-not-json", lambda p: sdm.Store.open(p / "notjson"), E.CorruptStoreError,
     ["manifest.json", "not valid JSON"]),
    ("open-config-unknown", lambda p: sdm.Store.open(p / "store", config="zzz"), E.ConfigError, ["'zzz'", "dram"]),
    ("open-config-bad-toml", lambda p: sdm.Store.open(p / "store", config=str(p / "bad.toml")), E.ConfigError,
     ["bad.toml", "not valid TOML"]),
    ("open-path-none", lambda p: sdm.Store.open(None), E.InvalidArgumentError, ["path", "None"]),
)


@pytest.fixture
def store_dir(tmp_path):
    sdm.Store.create(tmp_path / "store", [SPEC]).close()
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "manifest.json").write_text("{}")
    (tmp_path / "notjson").mkdir()
    (tmp_path / "notjson" / "manifest.json").write_bytes(b"\xff{")
    (tmp_path / "bad.toml").write_text("tiers = [\n")
    return tmp_path


@pytest.mark.parametrize("call, err, words", CREATE)
def test_store_create_open(store_dir, call, err, words):
    before = sorted(os.listdir(store_dir))
    digest = tree_digest(store_dir)
    check(call, err, words, store_dir)
    assert sorted(os.listdir(store_dir)) == before  # no half-created store, no temp dir left
    assert tree_digest(store_dir) == digest


# -- Store reads and writes ------------------------------------------------------------

I2, O2 = np.array([0, 1]), np.array([0, 2])
ROWS = np.ones((10, 4), np.float32)
STORE = cases(
    ("lookup-negative", lambda s: s.lookup("emb", [-1]), E.IdOutOfRangeError, ["-1", "[0, 10)"]),
    ("lookup-too-large", lambda s: s.lookup("emb", [10]), E.IdOutOfRangeError, ["10", "[0, 10)"]),
    ("lookup-float", lambda s: s.lookup("emb", [1.0]), E.InvalidArgumentError, ["integer", "float64"]),
    ("lookup-nan", lambda s: s.lookup("emb", [np.nan]), E.InvalidArgumentError, ["integer", "float64"]),
    ("lookup-bool", lambda s: s.lookup("emb", [True]), E.InvalidArgumentError, ["integer", "bool"]),
    ("lookup-object", lambda s: s.lookup("emb", np.array([1], object)), E.InvalidArgumentError, ["integer", "object"]),
    ("lookup-2d", lambda s: s.lookup("emb", [[1]]), E.InvalidArgumentError, ["1-D", "(1, 1)"]),
    ("lookup-ragged", lambda s: s.lookup("emb", [[1], [1, 2]]), E.InvalidArgumentError, ["'emb'", "ragged"]),
    ("lookup-unknown-table", lambda s: s.lookup("nope", [0]), E.UnknownTableError, ["'nope'", "'emb'"]),
    ("lookup-table-int", lambda s: s.lookup(3, [0]), E.UnknownTableError, ["table 3", "'emb'"]),
    ("lookup-table-path", lambda s: s.lookup("../emb", [0]), E.UnknownTableError, ["'../emb'"]),
    ("lookup-unwritten", lambda s: s.lookup("unwritten", [0]), E.StoreError, ["'unwritten'", "no rows yet"]),
    ("bag-ids-too-large", lambda s: s.embedding_bag("emb", [0, 10], O2), E.IdOutOfRangeError, ["10", "[0, 10)"]),
    ("bag-offsets-not-from-0", lambda s: s.embedding_bag("emb", I2, [1, 2]), E.InvalidOffsetsError, ["offsets[0]"]),
    ("bag-offsets-decreasing", lambda s: s.embedding_bag("emb", I2, [0, 2, 1, 2]), E.InvalidOffsetsError,
     ["non-decreasing"]),
    ("bag-offsets-wrong-last", lambda s: s.embedding_bag("emb", I2, [0, 1]), E.InvalidOffsetsError,
     ["offsets[-1]", "2", "got 1"]),
    ("bag-offsets-float", lambda s: s.embedding_bag("emb", I2, [0.0, 2.0]), E.InvalidOffsetsError, ["float64"]),
    ("bag-offsets-object", lambda s: s.embedding_bag("emb", I2, np.array([0, 2], object)), E.InvalidOffsetsError,
     ["object"]),
    ("bag-weights-ragged", lambda s: s.embedding_bag("emb", I2, O2, per_sample_weights=[[1.0], [1.0, 2.0]]),
     E.InvalidArgumentError, ["per_sample_weights", "ragged"]),
    ("bag-weights-int", lambda s: s.embedding_bag("emb", I2, O2, per_sample_weights=[1, 2]), E.InvalidArgumentError,
     ["floating", "int64"]),
    ("bag-mode", lambda s: s.embedding_bag("emb", I2, O2, mode="max"), E.InvalidArgumentError, ["'max'", "sum"]),
    ("bags-not-mapping", lambda s: s.embedding_bags([("emb", (I2, O2))]), E.InvalidArgumentError, ["mapping", "list"]),
    ("bags-none", lambda s: s.embedding_bags(None), E.InvalidArgumentError, ["mapping", "NoneType"]),
    ("bags-request-str", lambda s: s.embedding_bags({"emb": "ab"}), E.InvalidArgumentError, ["'emb'", "(indices, offsets)"]),
    ("bags-request-1", lambda s: s.embedding_bags({"emb": (I2,)}), E.InvalidArgumentError, ["'emb'", "(indices, offsets)"]),
    ("bags-request-4", lambda s: s.embedding_bags({"emb": (I2, O2, None, None)}), E.InvalidArgumentError,
     ["'emb'", "per_sample_weights"]),
    ("bags-unknown-table", lambda s: s.embedding_bags({"emb": (I2, O2), "zz": (I2, O2)}), E.UnknownTableError,
     ["'zz'"]),
    ("bags-second-bad", lambda s: s.embedding_bags({"emb": (I2, O2), "e8": ([0, 99], O2)}), E.IdOutOfRangeError,
     ["99", "[0, 10)"]),
    ("prefetch-none", lambda s: s.prefetch(None), E.InvalidArgumentError, ["mapping", "NoneType"]),
    ("prefetch-bad-ids", lambda s: s.prefetch({"emb": ([99], [0, 1])}), E.IdOutOfRangeError, ["99", "[0, 10)"]),
    ("release-none", lambda s: s.release(None), E.InvalidArgumentError, ["ticket", "NoneType"]),
    ("release-twice", lambda s: [s.release(t) for t in [s.prefetch({"emb": (I2, O2)})] * 2], E.InvalidArgumentError,
     ["released already"]),
    ("write-unknown-table", lambda s: s.write_table("nope", ROWS), E.UnknownTableError, ["'nope'", "'emb'"]),
    ("write-table-int", lambda s: s.write_table(3, ROWS), E.UnknownTableError, ["table 3"]),
    ("write-rows-short", lambda s: s.write_table("emb", np.ones((9, 4))), E.InvalidArgumentError, ["10 rows", "(9, 4)"]),
    ("write-dim", lambda s: s.write_table("emb", np.ones((10, 3))), E.InvalidArgumentError, ["(k, 4)", "(10, 3)"]),
    ("write-1d", lambda s: s.write_table("emb", np.ones(40)), E.InvalidArgumentError, ["(k, 4)", "(40,)"]),
    ("write-nan", lambda s: s.write_table("emb", np.full((10, 4), np.nan)), E.InvalidArgumentError, ["finite"]),
    ("write-inf", lambda s: s.write_table("emb", np.full((10, 4), np.inf)), E.InvalidArgumentError, ["finite"]),
    ("write-str", lambda s: s.write_table("emb", np.full((10, 4), "a")), E.InvalidArgumentError, ["numeric", "<U1"]),
    ("write-object", lambda s: s.write_table("emb", np.ones((10, 4), object)), E.InvalidArgumentError,
     ["numeric", "object"]),
    ("write-bool", lambda s: s.write_table("emb", np.ones((10, 4), bool)), E.InvalidArgumentError, ["numeric", "bool"]),
    ("write-complex", lambda s: s.write_table("emb", np.ones((10, 4), complex)), E.InvalidArgumentError,
     ["numeric", "complex128"]),
    ("write-none", lambda s: s.write_table("emb", None), E.InvalidArgumentError, ["iterable", "NoneType"]),
    ("write-int", lambda s: s.write_table("emb", 5), E.InvalidArgumentError, ["iterable", "int"]),
    ("write-fp16-overflow", lambda s: s.write_table("e16", np.full((10, 4), 1e5, np.float32)), E.InvalidArgumentError,
     ["100000.0", "65504"]),
    ("write-chunks-short", lambda s: s.write_table("emb", iter([np.ones((4, 4), np.float32)])),
     E.InvalidArgumentError, ["10 rows", "supplied 4"]),
    ("write-chunks-long", lambda s: s.write_table("emb", iter([np.ones((11, 4), np.float32)])),
     E.InvalidArgumentError, ["10 rows", "11"]),
    ("write-chunk-bad-dim", lambda s: s.write_table("emb", iter([np.ones((5, 4)), np.ones((5, 3))])),
     E.InvalidArgumentError, ["chunk 1", "(5, 3)"]),
    ("write-ragged-list", lambda s: s.write_table("emb", [[1.0] * 4] * 9 + [[1.0]]), E.InvalidArgumentError,
     ["'emb'", "ragged"]),
    ("write-ragged-chunk", lambda s: s.write_table("emb", iter([[[1.0], [1.0, 2.0]]])), E.InvalidArgumentError,
     ["chunk 0", "ragged"]),
    ("lookahead-depth-negative", lambda s: Lookahead(s, -1), E.InvalidArgumentError, ["depth", "[0, 64]", "-1"]),
    ("lookahead-depth-float", lambda s: Lookahead(s, 1.0), E.InvalidArgumentError, ["depth", "1.0"]),
    ("lookahead-depth-bool", lambda s: Lookahead(s, True), E.InvalidArgumentError, ["depth", "True"]),
    ("lookahead-compute-negative", lambda s: Lookahead(s, 1, compute_ns=-1), E.InvalidArgumentError,
     ["compute_ns", "-1"]),
    ("lookahead-store-none", lambda s: Lookahead(None, 1), E.InvalidArgumentError, ["sdm.Store", "NoneType"]),
    ("lookahead-batches-none", lambda s: list(Lookahead(s, 1).serve(None)), E.InvalidArgumentError,
     ["iterable", "NoneType"]),
    ("lookahead-batch-not-mapping", lambda s: list(Lookahead(s, 1).serve([3])), E.InvalidArgumentError,
     ["mapping", "int"]),
    ("lookahead-bad-ids", lambda s: list(Lookahead(s, 2).serve([{"emb": (I2, O2)}, {"emb": ([99], [0, 1])}])),
     E.IdOutOfRangeError, ["99", "[0, 10)"]),
    ("lookahead-mode", lambda s: list(Lookahead(s, 1, mode="max").serve([{"emb": (I2, O2)}])),
     E.InvalidArgumentError, ["'max'"]),
)


@pytest.fixture(scope="module")
def rw_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("bad-input") / "s"
    tables = [SPEC, sdm.TableSpec("e8", 10, 4, "int8"), sdm.TableSpec("e16", 10, 4, "fp16"),
              sdm.TableSpec("unwritten", 10, 4)]
    with sdm.Store.create(path, tables) as s:
        for name in ("emb", "e8", "e16"):
            s.write_table(name, np.arange(40, dtype=np.float32).reshape(10, 4))
    s = sdm.Store.open(path, config="sdm-nand")  # a cache tier, so prefetch pins rows
    yield s
    s.close()


@pytest.mark.parametrize("call, err, words", STORE)
def test_store_calls(rw_store, call, err, words):
    rows = rw_store.lookup("emb", np.arange(10))  # builds the SCM row file before the digest
    before = tree_digest(rw_store.path)
    check(call, err, words, rw_store)
    assert tree_digest(rw_store.path) == before
    np.testing.assert_array_equal(rw_store.lookup("emb", np.arange(10)), rows)
    cache = rw_store.stats()["tiers"][0]
    assert cache["pinned_rows"] == 0  # a rejected prefetch or serve leaves no pin behind


def test_closed_and_readonly_store(tmp_path):
    s = sdm.Store.create(tmp_path / "s", [SPEC])
    s.write_table("emb", ROWS)
    s.close()
    digest = tree_digest(tmp_path / "s")
    for call in (lambda: s.lookup("emb", [0]), lambda: s.write_table("emb", ROWS),
                 lambda: s.embedding_bags({"emb": (I2, O2)}), lambda: s.prefetch({"emb": (I2, O2)})):
        check(call, E.StoreError, ["closed"])
    with sdm.Store.open(tmp_path / "s", readonly=True) as ro:
        check(lambda: ro.write_table("emb", ROWS), E.ReadOnlyError, ["read-only", "'emb'"])
    assert tree_digest(tmp_path / "s") == digest


# -- trace files: load -------------------------------------------------------------------

class _Marker:
    """Unpickling this creates ``path``: proof that a loader ran pickle on a user file."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _members(**changes):
    base = dict(schema_version=np.array(1), table_sizes=np.array([4]), batch_sizes=np.array([1]),
                batch_lookups=np.array([2]), metadata=np.array("{}"),
                b00000000_indices=np.array([0, 1]), b00000000_offsets=np.array([0, 2]))
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


BAD_TRACES = {  # file name -> (members or bytes, error, words); read header and every batch
    "garbage": (b"garbage" * 10, tr.TraceFormatError, ["garbage.npz", "not a readable trace"]),
    "empty": (b"", tr.TraceFormatError, ["empty.npz", "not a readable trace"]),
    "npy": ("npy", tr.TraceFormatError, ["single .npy array"]),
    "pickled-version": (_members(schema_version="PICKLE"), tr.TraceFormatError, ["schema_version", "pickle"]),
    "pickled-sizes": (_members(table_sizes="PICKLE"), tr.TraceFormatError, ["table_sizes", "pickle"]),
    "pickled-indices": (_members(b00000000_indices="PICKLE"), tr.TraceFormatError, ["b00000000_indices", "pickle"]),
    "pickled-dense": (_members(b00000000_dense="PICKLE"), tr.TraceFormatError, ["b00000000_dense", "pickle"]),
    "version-2": (_members(schema_version=np.array(2)), tr.TraceFormatError, ["schema_version 2", "version 1"]),
    "version-str": (_members(schema_version=np.array("1")), tr.TraceFormatError, ["schema_version", "<U1"]),
    "version-1d": (_members(schema_version=np.array([1])), tr.TraceFormatError, ["schema_version", "(1,)"]),
    "no-version": (_members(schema_version=None), tr.TraceFormatError, ["'schema_version'", "truncated"]),
    "sizes-0": (_members(table_sizes=np.array([0])), tr.TraceFormatError, ["table_sizes[0] = 0", ">= 1 row"]),
    "sizes-float": (_members(table_sizes=np.array([4.0])), tr.TraceFormatError, ["table_sizes", "float64"]),
    "sizes-empty": (_members(table_sizes=np.array([], np.int64)), tr.TraceFormatError, ["table_sizes", "(0,)"]),
    "batch-sizes-negative": (_members(batch_sizes=np.array([-1])), tr.TraceFormatError, ["batch_sizes", ">= 0"]),
    "lookups-mismatch": (_members(batch_lookups=np.array([3])), tr.TraceFormatError, ["has 2 ids", "3"]),
    "metadata-not-json": (_members(metadata=np.array("{")), tr.TraceFormatError, ["metadata", "JSON"]),
    "metadata-list": (_members(metadata=np.array("[]")), tr.TraceFormatError, ["metadata", "JSON object"]),
    "batch-missing": (_members(batch_sizes=np.array([1, 1]), batch_lookups=np.array([2, 2])), tr.TraceFormatError,
                      ["batch 1", "b00000001_indices", "truncated"]),
    "ids-out-of-range": (_members(b00000000_indices=np.array([0, 9])), tr.TraceFormatError, ["id 9", "[0, 4)"]),
    "ids-negative": (_members(b00000000_indices=np.array([0, -1])), tr.TraceFormatError, ["id -1", "[0, 4)"]),
    "ids-float": (_members(b00000000_indices=np.array([0.0, 1.0])), tr.TraceFormatError, ["indices", "float64"]),
    "ids-2d": (_members(b00000000_indices=np.array([[0, 1]])), tr.TraceFormatError, ["indices", "(1, 2)"]),
    "offsets-not-from-0": (_members(b00000000_offsets=np.array([1, 2])), tr.TraceFormatError,
                           ["offsets run from 1", "from 0"]),
    "offsets-decreasing": (_members(batch_sizes=np.array([3]), b00000000_offsets=np.array([0, 2, 1, 2])),
                           tr.TraceFormatError, ["decreases", "1 < 2"]),
    "offsets-float": (_members(b00000000_offsets=np.array([0.0, 2.0])), tr.TraceFormatError, ["offsets", "float64"]),
    "offsets-short": (_members(b00000000_offsets=np.array([2])), tr.TraceFormatError, ["offsets", "T * B + 1", "2"]),
    "dense-rows": (_members(b00000000_dense=np.zeros((3, 2), np.float32)), tr.TraceFormatError, ["dense", "(1, D)"]),
    "labels-str": (_members(b00000000_labels=np.array(["x"])), tr.TraceFormatError, ["labels", "numeric", "<U1"]),
    "request-ids-float": (_members(b00000000_request_ids=np.array([0.5])), tr.TraceFormatError,
                          ["request_ids", "integer", "float64"]),
}


def _write_trace_file(path, content, marker):
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "npy":
        with open(path, "wb") as f:
            np.save(f, np.arange(3))
    else:
        arrays = {k: (np.array([_Marker(marker)], dtype=object) if isinstance(v, str) and v == "PICKLE" else v)
                  for k, v in content.items()}
        np.savez(path, **arrays)


@pytest.mark.parametrize("name", sorted(BAD_TRACES))
def test_trace_load(tmp_path, name):
    content, err, words = BAD_TRACES[name]
    path = tmp_path / f"{name}.npz"
    marker = tmp_path / "unpickled"
    _write_trace_file(path, content, marker)

    def read():
        with tr.load(path) as t:
            for batch in t:
                pass

    check(read, err, words)
    assert not marker.exists()


def test_trace_load_truncated(tmp_path):
    good = tr.save(tmp_path / "good.npz", [([np.array([0, 1])], [np.array([0, 1, 2])])] * 3, [4])
    raw = open(good, "rb").read()
    for cut in (0, 10, 100, len(raw) // 2, len(raw) - 22, len(raw) - 1):
        path = tmp_path / f"cut{cut}.npz"
        path.write_bytes(raw[:cut])

        def read():
            with tr.load(path) as t:
                list(t)

        with pytest.raises(tr.TraceFormatError) as info:
            read()
        assert f"cut{cut}.npz" in str(info.value) or info.value.field


TRACE_CALLS = cases(
    ("load-missing", lambda p: tr.load(p / "missing.npz"), tr.TraceNotFoundError, ["missing.npz"]),
    ("load-directory", lambda p: tr.load(p), tr.TraceFormatError, ["directory"]),
    ("load-none", lambda p: tr.load(None), E.InvalidArgumentError, ["trace path", "NoneType"]),
    ("load-int", lambda p: tr.load(3), E.InvalidArgumentError, ["trace path", "int"]),
    ("index-out-of-range", lambda p: tr.load(p / "good.npz")[5], E.IdOutOfRangeError, ["batch 5", "a trace of 1 batch"]),
    ("index-bool", lambda p: tr.load(p / "good.npz")[True], E.InvalidArgumentError, ["integer", "bool"]),
    ("index-str", lambda p: tr.load(p / "good.npz")["a"], E.InvalidArgumentError, ["integer", "str"]),
    ("save-sizes-none", lambda p: tr.save(p / "o.npz", [], None), E.InvalidArgumentError, ["no batches", "table_sizes"]),
    ("save-sizes-0", lambda p: tr.save(p / "o.npz", [], [0]), tr.TraceFormatError, ["table_sizes[0] = 0"]),
    ("save-sizes-float", lambda p: tr.save(p / "o.npz", [], [1.5]), tr.TraceFormatError, ["table_sizes", "float64"]),
    ("save-sizes-str", lambda p: tr.save(p / "o.npz", [], "abc"), tr.TraceFormatError, ["table_sizes", "<U3"]),
    ("save-sizes-ragged", lambda p: tr.save(p / "o.npz", [], [[1], [1, 2]]), tr.TraceFormatError,
     ["table_sizes", "ragged"]),
    ("save-batches-none", lambda p: tr.save(p / "o.npz", None, [4]), E.InvalidArgumentError, ["iterable", "NoneType"]),
    ("save-batch-str", lambda p: tr.save(p / "o.npz", ["ab"], [4]), E.InvalidArgumentError, ["batch 0", "str"]),
    ("save-batch-int", lambda p: tr.save(p / "o.npz", [3], [4]), E.InvalidArgumentError, ["batch 0", "int"]),
    ("save-batch-dict-no-offsets", lambda p: tr.save(p / "o.npz", [{"indices": [[1]]}], [4]), E.InvalidArgumentError,
     ["batch 0", "'offsets'"]),
    ("save-ids-out-of-range", lambda p: tr.save(p / "o.npz", [([[5]], [[0, 1]])], [4]), tr.TraceFormatError,
     ["batch 0.indices[0]", "id 5", "[0, 4)"]),
    ("save-ids-negative", lambda p: tr.save(p / "o.npz", [([[-1]], [[0, 1]])], [4]), tr.TraceFormatError,
     ["id -1", "[0, 4)"]),
    ("save-ids-float", lambda p: tr.save(p / "o.npz", [([[1.0]], [[0, 1]])], [4]), tr.TraceFormatError,
     ["indices[0]", "float64"]),
    ("save-ids-ragged", lambda p: tr.save(p / "o.npz", [([[[1], [1, 2]]], [[0, 1]])], [4]), tr.TraceFormatError,
     ["batch 0.indices[0]", "ragged"]),
    ("save-ids-none", lambda p: tr.save(p / "o.npz", [([None], [[0, 1]])], [4]), tr.TraceFormatError,
     ["indices[0]", "object"]),
    ("save-offsets-not-from-0", lambda p: tr.save(p / "o.npz", [([[1]], [[1, 1]])], [4]), tr.TraceFormatError,
     ["offsets[0][0]", "got 1"]),
    ("save-offsets-float", lambda p: tr.save(p / "o.npz", [([[1]], [[0.0, 1.0]])], [4]), tr.TraceFormatError,
     ["offsets[0]", "float64"]),
    ("save-offsets-decreasing", lambda p: tr.save(p / "o.npz", [([[1, 2]], [[0, 2, 1, 2]])], [4]),
     tr.TraceFormatError, ["decreases", "1 < 2"]),
    ("save-offsets-empty", lambda p: tr.save(p / "o.npz", [([np.array([], np.int64)], [[]])], [4]), tr.TraceFormatError,
     ["offsets[0]", "B + 1 >= 1"]),
    ("save-table-count", lambda p: tr.save(p / "o.npz", [([[1], [1]], [[0, 1], [0, 1]])], [4]), tr.TraceFormatError,
     ["2 index arrays", "1 tables"]),
    ("save-dense-rows", lambda p: tr.save(p / "o.npz", [{"indices": [[1]], "offsets": [[0, 1]],
                                                         "dense": np.zeros((2, 2))}], [4]),
     tr.TraceFormatError, ["dense", "(1, D)", "(2, 2)"]),
    ("save-dense-str", lambda p: tr.save(p / "o.npz", [{"indices": [[1]], "offsets": [[0, 1]],
                                                        "dense": np.array([["a"]])}], [4]),
     tr.TraceFormatError, ["dense", "numeric", "<U1"]),
    ("save-labels-object", lambda p: tr.save(p / "o.npz", [{"indices": [[1]], "offsets": [[0, 1]],
                                                            "labels": np.array([object()])}], [4]),
     tr.TraceFormatError, ["labels", "object"]),
    ("save-metadata-not-json", lambda p: tr.save(p / "o.npz", [], [4], foo=object()), E.InvalidArgumentError,
     ["JSON-serializable"]),
    ("save-to-directory", lambda p: tr.save(p, [], [4]), E.InvalidArgumentError, ["directory"]),
    ("save-parent-missing", lambda p: tr.save(p / "nope" / "o.npz", [], [4]), E.InvalidArgumentError,
     ["nope", "does not exist"]),
)


@pytest.mark.parametrize("call, err, words", TRACE_CALLS)
def test_trace_calls(tmp_path, call, err, words):
    tr.save(tmp_path / "good.npz", [([np.array([0, 1])], [np.array([0, 2])])], [4])
    before = sorted(os.listdir(tmp_path))
    check(call, err, words, tmp_path)
    assert sorted(os.listdir(tmp_path)) == before  # no trace and no temporary file written


def test_save_accepts_nested_lists(tmp_path):
    # found by the corpus: per-table lists (not arrays) crashed the writer with AttributeError
    path = tr.save(tmp_path / "l.npz", [([[1, 2]], [[0, 1, 2]])], [4])
    with tr.load(path) as t:
        np.testing.assert_array_equal(t[0].indices[0], [1, 2])


GENERATE = cases(
    ("profile-unknown", dict(profile="nope"), E.ConfigError, ["'nope'", "zipf"]),
    ("profile-none", dict(profile=None), E.ConfigError, ["None", "uniform"]),
    ("tables-0", dict(tables=0), E.ConfigError, ["tables", "[1, 65536]", "0"]),
    ("tables-str", dict(tables="x"), E.ConfigError, ["tables", "integer", "'x'"]),
    ("tables-fraction", dict(tables=1.5), E.ConfigError, ["tables", "integer", "1.5"]),
    ("table-size-0", dict(table_size=0), E.ConfigError, [">= 1 row"]),
    ("table-size-str", dict(table_size="abc"), E.ConfigError, ["table_size", "integer", "'abc'"]),
    ("table-size-commas", dict(table_size=","), E.ConfigError, ["table_size", "none"]),
    ("table-size-list-length", dict(tables=2, table_size=[1, 2, 3]), E.ConfigError, ["table_size", "3 entries", "2"]),
    ("pooling-negative", dict(pooling=-1), E.ConfigError, ["pooling", ">= 0", "-1"]),
    ("pooling-str", dict(pooling="x"), E.ConfigError, ["pooling", "finite", "'x'"]),
    ("pooling-nan", dict(pooling=float("nan")), E.ConfigError, ["pooling", "finite", "nan"]),
    ("pooling-inf", dict(pooling=float("inf")), E.ConfigError, ["pooling", "finite", "inf"]),
    ("alpha-str", dict(alpha="x"), E.ConfigError, ["alpha", "finite", "'x'"]),
    ("alpha-nan", dict(alpha=float("nan")), E.ConfigError, ["alpha", "finite", "nan"]),
    ("batch-size-0", dict(batch_size=0), E.ConfigError, ["batch_size", ">= 1", "0"]),
    ("batch-size-str", dict(batch_size="x"), E.ConfigError, ["batch_size", "integer", "'x'"]),
    ("batches-0", dict(batches=0), E.ConfigError, ["batches", ">= 1"]),
    ("requests-negative", dict(requests=-1), E.ConfigError, ["requests", ">= 1", "-1"]),
    ("max-rows-0", dict(max_rows=0), E.ConfigError, ["max_rows", ">= 1"]),
    ("drift-str", dict(drift="x"), E.ConfigError, ["drift", "finite", "'x'"]),
    ("drift-nan", dict(drift=float("nan")), E.ConfigError, ["drift", "finite", "nan"]),
    ("dense-negative", dict(dense=-1), E.ConfigError, ["dense", ">= 0", "-1"]),
    ("dense-str", dict(dense="x"), E.ConfigError, ["dense", "integer", "'x'"]),
    ("items-per-request-0", dict(profile="inference", items_per_request=0), E.ConfigError,
     ["items_per_request", ">= 1"]),
    ("seed-negative", dict(seed=-1), E.ConfigError, ["seed", ">= 0", "-1"]),
    ("seed-str", dict(seed="x"), E.ConfigError, ["seed", "'x'"]),
    ("seed-float", dict(seed=1.5), E.ConfigError, ["seed", "1.5"]),
    ("stack-distance-no-dist", dict(profile="stack-distance"), E.ConfigError, ["distribution file", "--dist"]),
    ("stack-distance-dist-missing", dict(profile="stack-distance", dist_file="@/missing"), tr.TraceNotFoundError,
     ["missing"]),
    ("stack-distance-dist-directory", dict(profile="stack-distance", dist_file="@"), tr.TraceFormatError,
     ["directory"]),
    ("stack-distance-dist-binary", dict(profile="stack-distance", dist_file="@/bin.dist"), tr.TraceFormatError,
     ["bin.dist", "UTF-8"]),
    ("stack-distance-dist-garbage", dict(profile="stack-distance", dist_file="@/bad.dist"), tr.TraceFormatError,
     ["bad.dist", "3 lines", "got 2"]),
)


@pytest.mark.parametrize("kwargs, err, words", GENERATE)
def test_trace_generate(tmp_path, kwargs, err, words):
    (tmp_path / "bin.dist").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "bad.dist").write_text("garbage\n1 2\n")
    kwargs = {k: (v.replace("@", str(tmp_path)) if isinstance(v, str) and v.startswith("@") else v)
              for k, v in kwargs.items()}

    def call():
        g = tr.generate(**kwargs)
        g.batch(0)

    check(call, err, words)


# -- configs -----------------------------------------------------------------------------

DEVICE = ('name="x"\nmedia="y"\naccess_bytes=4096\nread_latency_us=1.0\nmax_read_iops=1\n'
          'read_bandwidth_gbps=1.0\nactive_watts=1.0\nidle_watts=1.0\ncapacity_gb=1\nusd_per_gb=1.0\n')
LMDB = '[[tiers]]\nkind = "lmdb"\n'
TOMLS = {
    "not-toml": ("tiers = [\n", ["not valid TOML"]),
    "binary": (b"\xff\xfe\x00", ["not UTF-8"]),
    "empty": ("", ["at least one tier"]),
    "tiers-str": ('tiers = "x"\n', ["'tiers' must be an array of tables"]),
    "tiers-table": ('[tiers]\nkind = "dram"\n', ["'tiers' must be an array of tables"]),
    "unknown-key": ('foo = 1\n[[tiers]]\nkind = "dram"\n', ["unknown key(s) ['foo']", "allowed"]),
    "tier-unknown-key": ('[[tiers]]\nkind = "dram"\nfoo = 1\n', ["tiers[0]", "['foo']"]),
    "kind-unknown": ('[[tiers]]\nkind = "ssd"\n', ["'ssd'", "lmdb"]),
    "kind-int": ('[[tiers]]\nkind = 3\n', ["kind 3", "dram"]),
    "kind-missing": ('[[tiers]]\ndevice = "dram"\n', ["tiers[0]", "kind"]),
    "device-unknown": ('[[tiers]]\nkind = "dram"\ndevice = "nope"\n', ["'nope'"]),
    "device-int": ('[[tiers]]\nkind = "dram"\ndevice = 3\n', ["dram tier", "3"]),
    "device-table-incomplete": ('[[tiers]]\nkind = "dram"\n[tiers.device]\nname = "x"\n', ["tiers[0]", "device"]),
    "device-negative": ('[[tiers]]\nkind = "mmap"\n[tiers.device]\n' + DEVICE.replace("4096", "-1"),
                        ["access_bytes", "-1"]),
    "device-str-field": ('[[tiers]]\nkind = "mmap"\n[tiers.device]\n' + DEVICE.replace("4096", '"a"'),
                         ["access_bytes", "'a'"]),
    "device-nan": ('[[tiers]]\nkind = "mmap"\n[tiers.device]\n' + DEVICE.replace("read_latency_us=1.0", "read_latency_us=nan"),
                   ["read_latency_us", "nan"]),
    "cache-no-capacity": ('[[tiers]]\nkind = "cache"\n' + LMDB, ["cache needs capacity_rows or capacity_bytes"]),
    "cache-capacity-negative": ('[[tiers]]\nkind = "cache"\ncapacity_bytes = -1\n' + LMDB, ["capacity_bytes", ">= 1", "-1"]),
    "cache-capacity-float": ('[[tiers]]\nkind = "cache"\ncapacity_bytes = 1.5\n' + LMDB, ["capacity_bytes", "1.5"]),
    "cache-capacity-str": ('[[tiers]]\nkind = "cache"\ncapacity_bytes = "64M"\n' + LMDB, ["capacity_bytes", "'64M'"]),
    "cache-both-capacities": ('[[tiers]]\nkind = "cache"\ncapacity_bytes = 8\ncapacity_rows = 8\n' + LMDB, ["not both"]),
    "policy-belady": ('[[tiers]]\nkind = "cache"\ncapacity_rows = 5\npolicy = "belady"\n' + LMDB, ["'belady'", "lru"]),
    "policy-int": ('[[tiers]]\nkind = "cache"\ncapacity_rows = 5\npolicy = 3\n' + LMDB, ["policy 3"]),
    "policy-on-dram": ('[[tiers]]\nkind = "dram"\npolicy = "lru"\n', ["policy 'lru'", "only to kind 'cache'"]),
    "admission-unknown": ('[[tiers]]\nkind = "cache"\ncapacity_rows = 5\nadmission = "x"\n' + LMDB, ["admission 'x'"]),
    "queue-depth-0": ('[[tiers]]\nkind = "dram"\nqueue_depth = 0\n', ["queue_depth", "[1, 1024]", "0"]),
    "queue-depth-huge": ('[[tiers]]\nkind = "dram"\nqueue_depth = 100000\n', ["queue_depth", "100000"]),
    "only-cache": ('[[tiers]]\nkind = "cache"\ncapacity_rows = 5\n', ["last tier must hold all rows"]),
    "full-tier-not-last": ('[[tiers]]\nkind = "dram"\n' + LMDB, ["tiers[0] (dram)", "must be last"]),
    "io-mode-unknown": ('io_mode = "fast"\n[[tiers]]\nkind = "dram"\n', ["'fast'", "modeled"]),
    "io-mode-list": ('io_mode = []\n[[tiers]]\nkind = "dram"\n', ["io_mode []", "modeled"]),
    "pooled-negative": ('pooled_cache_bytes = -1\n[[tiers]]\nkind = "dram"\n', ["pooled_cache_bytes", ">= 0", "-1"]),
    "placement-int": ('placement = 3\n[[tiers]]\nkind = "dram"\n', ["placement", "3"]),
    "name-int": ('name = 3\n[[tiers]]\nkind = "dram"\n', ["name", "3"]),
    "name-empty": ('name = ""\n[[tiers]]\nkind = "dram"\n', ["name", "''"]),
}


@pytest.mark.parametrize("name", sorted(TOMLS))
def test_load_toml(tmp_path, name):
    text, words = TOMLS[name]
    path = tmp_path / f"{name}.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    check(lambda: load_toml(path), E.ConfigError, words)
    check(lambda: resolve_config(str(path)), E.ConfigError, words)


CONFIG_CALLS = cases(
    ("toml-missing", lambda p: load_toml(p / "missing.toml"), E.ConfigError, ["missing.toml", "does not exist"]),
    ("toml-directory", lambda p: load_toml(p / "dir.toml"), E.ConfigError, ["dir.toml", "cannot be read"]),
    ("toml-none", lambda p: load_toml(None), E.ConfigError, ["path", "NoneType"]),
    ("resolve-unknown", lambda p: resolve_config("nope"), E.ConfigError, ["'nope'", "sdm-nand"]),
    ("resolve-empty", lambda p: resolve_config(""), E.ConfigError, ["''", "preset"]),
    ("resolve-int", lambda p: resolve_config(3), E.ConfigError, ["preset", "int"]),
    ("resolve-dict", lambda p: resolve_config({}), E.ConfigError, ["preset", "dict"]),
    ("resolve-missing-toml", lambda p: resolve_config(str(p / "nope.toml")), E.ConfigError, ["does not exist"]),
    ("options-no-cache", lambda p: with_options("dram", cache_bytes=5), E.ConfigError, ["'dram'", "no cache tier"]),
    ("options-cache-negative", lambda p: with_options("sdm-nand", cache_bytes=-1), E.ConfigError,
     ["capacity_bytes", "-1"]),
    ("options-cache-str", lambda p: with_options("sdm-nand", cache_bytes="64M"), E.ConfigError,
     ["capacity_bytes", "'64M'"]),
    ("options-policy", lambda p: with_options("sdm-nand", policy="nope"), E.ConfigError, ["'nope'", "lru"]),
    ("options-admission", lambda p: with_options("sdm-nand", admission="x"), E.ConfigError, ["'x'", "tinylfu"]),
    ("options-unknown-field", lambda p: with_options("dram", foo=1), E.ConfigError, ["'dram'", "foo"]),
    ("options-io-mode", lambda p: with_options("dram", io_mode="x"), E.ConfigError, ["'x'", "direct"]),
    ("options-pooled-negative", lambda p: with_options("dram", pooled_cache_bytes=-1), E.ConfigError,
     ["pooled_cache_bytes", "-1"]),
    ("options-pooled-str", lambda p: with_options("dram", pooled_cache_bytes="8M"), E.ConfigError,
     ["pooled_cache_bytes", "'8M'"]),
    ("options-name-int", lambda p: with_options("dram", name=3), E.ConfigError, ["name", "3"]),
    ("options-tiers-int", lambda p: with_options("dram", tiers=3), E.ConfigError, ["tiers", "int"]),
    ("options-placement-int", lambda p: with_options("dram", placement=3), E.ConfigError, ["placement", "3"]),
    ("io-mode", lambda p: with_io_mode("dram", "x"), E.ConfigError, ["'x'", "modeled"]),
    ("hierarchy-no-tiers", lambda p: HierarchyConfig("h", ()), E.ConfigError, ["'h'", "at least one tier"]),
    ("hierarchy-tier-not-config", lambda p: HierarchyConfig("h", ("dram",)), E.ConfigError,
     ["tiers[0]", "TierConfig", "str"]),
    ("tier-kind", lambda p: TierConfig("ssd"), E.ConfigError, ["'ssd'", "mmap"]),
)


@pytest.mark.parametrize("call, err, words", CONFIG_CALLS)
def test_config_calls(tmp_path, call, err, words):
    (tmp_path / "dir.toml").mkdir()
    check(call, err, words, tmp_path)


# -- placements --------------------------------------------------------------------------

def _placement_members(tmp_path):
    good = Placement(("a",), {"b": np.array([1, 2])}, {"b": np.array([1, 0, 2])}, {"x": 1})
    with np.load(good.save(tmp_path / "good.npz")) as z:
        return {k: z[k] for k in z.files}


PLACEMENT_FILES = {  # member changes -> words
    "format": (dict(format=np.array("x")), ["not an sdm placement", "'x'"]),
    "version": (dict(version=np.array(9)), ["version", "9", "reads version 1"]),
    "names-2d": (dict(pinned_tables=np.array([["a"]])), ["'pinned_tables'", "1-D", "(1, 1)"]),
    "names-int": (dict(pinned_tables=np.array([1])), ["'pinned_tables'", "int64"]),
    "info-not-json": (dict(info=np.frombuffer(b"{", np.uint8)), ["'info'", "not JSON"]),
    "info-not-utf8": (dict(info=np.frombuffer(b"\xff", np.uint8)), ["'info'", "not JSON"]),
    "info-list": (dict(info=np.frombuffer(b"[]", np.uint8)), ["'info'", "JSON object"]),
    "rows-unsorted": (dict(pinned_rows_0=np.array([2, 1])), ["pinned_rows['b']", "sorted unique", "entry 1"]),
    "order-not-permutation": (dict(row_order_0=np.array([0, 0, 2])), ["row_order['b']", "permutation", "row 1"]),
    "order-float": (dict(row_order_0=np.array([0.0, 1.0, 2.0])), ["row_order['b']", "integer", "float64"]),
    "rows-member-missing": (dict(pinned_names=np.array(["b", "c"])), ["'pinned_rows_1'"]),
    "pinned-twice": (dict(pinned_tables=np.array(["a", "a"])), ["['a']", "more than once"]),
    "pinned-both-ways": (dict(pinned_tables=np.array(["b"])), ["'b'", "both pinned whole"]),
    "pickled-info": (dict(info="PICKLE"), ["cannot be read", "pickle"]),
    "pickled-rows": (dict(pinned_rows_0="PICKLE"), ["cannot be read", "pickle"]),
}


@pytest.mark.parametrize("name", sorted(PLACEMENT_FILES))
def test_placement_load(tmp_path, name):
    changes, words = PLACEMENT_FILES[name]
    marker = tmp_path / "unpickled"
    members = _placement_members(tmp_path)
    members.update({k: np.array([_Marker(marker)], dtype=object) if isinstance(v, str) else v
                    for k, v in changes.items()})
    np.savez(tmp_path / "bad.npz", **members)
    check(lambda: Placement.load(tmp_path / "bad.npz"), E.ConfigError, ["bad.npz"] + words)
    assert not marker.exists()


TABLES = {"t0": sdm.TableSpec("t0", 100, 4)}
PLACEMENT_CALLS = cases(
    ("load-missing", lambda p: Placement.load(p / "missing.npz"), E.ConfigError, ["no placement file", "missing.npz"]),
    ("load-directory", lambda p: Placement.load(p), E.ConfigError, ["no placement file"]),
    ("load-none", lambda p: Placement.load(None), E.ConfigError, ["path", "NoneType"]),
    ("load-garbage", lambda p: Placement.load(p / "garbage.npz"), E.ConfigError, ["garbage.npz", "cannot be read"]),
    ("load-truncated", lambda p: Placement.load(p / "cut.npz"), E.ConfigError, ["cut.npz", "cannot be read"]),
    ("load-npy", lambda p: Placement.load(p / "one.npy"), E.ConfigError, ["one.npy", "single .npy"]),
    ("pinned-tables-str", lambda p: Placement("abc"), E.ConfigError, ["sequence", "'abc'"]),
    ("pinned-tables-int", lambda p: Placement((1,)), E.ConfigError, ["pinned_tables", "1"]),
    ("pinned-rows-none", lambda p: Placement((), None), E.ConfigError, ["pinned_rows", "mapping", "NoneType"]),
    ("pinned-rows-list", lambda p: Placement((), [1, 2]), E.ConfigError, ["pinned_rows", "mapping", "list"]),
    ("pinned-rows-float", lambda p: Placement((), {"a": [1.5]}), E.ConfigError, ["pinned_rows['a']", "float64"]),
    ("pinned-rows-ragged", lambda p: Placement((), {"a": [[1], [1, 2]]}), E.ConfigError, ["pinned_rows['a']", "array"]),
    ("pinned-rows-key-int", lambda p: Placement((), {1: [1]}), E.ConfigError, ["key 1", "table name"]),
    ("row-order-object", lambda p: Placement((), {}, {"a": np.array([1], object)}), E.ConfigError,
     ["row_order['a']", "object"]),
    ("info-none", lambda p: Placement((), {}, {}, None), E.ConfigError, ["info", "NoneType"]),
    ("info-not-json", lambda p: Placement((), {}, {}, {"a": object()}), E.ConfigError, ["JSON-serializable"]),
    ("plan-dram-negative", lambda p: plan(p / "t.npz", TABLES, dram_bytes=-1), E.ConfigError, ["dram_bytes", "-1"]),
    ("plan-dram-str", lambda p: plan(p / "t.npz", TABLES, dram_bytes="1M"), E.ConfigError, ["dram_bytes", "'1M'"]),
    ("plan-dram-huge", lambda p: plan(p / "t.npz", TABLES, dram_bytes=2**80), E.ConfigError,
     ["dram_bytes", str(2**80), "2**63 - 1"]),
    ("plan-pin-fraction-2", lambda p: plan(p / "t.npz", TABLES, dram_bytes=100, pin_fraction=2), E.ConfigError,
     ["pin_fraction", "[0, 1]", "2"]),
    ("plan-pin-fraction-nan", lambda p: plan(p / "t.npz", TABLES, dram_bytes=100, pin_fraction=float("nan")),
     E.ConfigError, ["pin_fraction", "nan"]),
    ("plan-layout", lambda p: plan(p / "t.npz", TABLES, dram_bytes=100, layout="x"), E.ConfigError,
     ["'x'", "coaccess"]),
    ("plan-block-bytes-0", lambda p: plan(p / "t.npz", TABLES, dram_bytes=100, block_bytes=0), E.ConfigError,
     ["block_bytes", "[1, 2**63 - 1]", "0"]),
    ("plan-block-bytes-huge", lambda p: plan(p / "t.npz", TABLES, dram_bytes=100, block_bytes=2**80), E.ConfigError,
     ["block_bytes", str(2**80)]),
    ("plan-holdout-1", lambda p: plan(p / "t.npz", TABLES, dram_bytes=100, holdout=1.0), E.ConfigError,
     ["holdout", "[0, 1)"]),
    ("plan-rows-mismatch", lambda p: plan(p / "t.npz", {"t0": sdm.TableSpec("t0", 50, 4)}, dram_bytes=100),
     E.ConfigError, ["100 rows", "'t0'", "50"]),
    ("plan-table-count", lambda p: plan(p / "t.npz", {**TABLES, "t1": sdm.TableSpec("t1", 5, 4)}, dram_bytes=100),
     E.ConfigError, ["1 tables", "the store 2"]),
    ("plan-tables-list", lambda p: plan(p / "t.npz", [TABLES["t0"]], dram_bytes=100), E.InvalidArgumentError,
     ["map names to TableSpec", "list"]),
    ("plan-tables-value", lambda p: plan(p / "t.npz", {"t0": 3}, dram_bytes=100), E.InvalidArgumentError,
     ["tables['t0']", "int"]),
    ("plan-trace-missing", lambda p: plan(p / "nope.npz", TABLES, dram_bytes=100), tr.TraceNotFoundError, ["nope.npz"]),
    ("plan-trace-garbage", lambda p: plan(p / "garbage.npz", TABLES, dram_bytes=100), tr.TraceFormatError,
     ["garbage.npz"]),
    ("plan-trace-int", lambda p: plan(3, TABLES, dram_bytes=100), E.InvalidArgumentError, ["trace", "int"]),
)


@pytest.mark.parametrize("call, err, words", PLACEMENT_CALLS)
def test_placement_calls(tmp_path, call, err, words):
    tr.save(tmp_path / "t.npz", [([np.array([1, 2])], [np.array([0, 2])])] * 4, [100])
    (tmp_path / "garbage.npz").write_bytes(b"x" * 50)
    raw = open(Placement(("a",)).save(tmp_path / "full.npz"), "rb").read()
    (tmp_path / "cut.npz").write_bytes(raw[: len(raw) // 2])
    np.save(tmp_path / "one.npy", np.arange(3))
    check(call, err, words, tmp_path)


# -- scenarios ---------------------------------------------------------------------------

SCENARIO_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scenarios")


def _scenario_text(**replace):
    text = open(os.path.join(SCENARIO_DIR, "small-model.toml")).read()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


SCENARIOS = {
    "not-toml": ("a = [\n", ["not valid TOML"]),
    "binary": (b"\xff\xfe", ["not UTF-8"]),
    "empty": ("", ["section [model] is missing"]),
    "unknown-section": ("[foo]\n", ["unknown section(s) ['foo']"]),
    "model-str": ('model = "x"\n', ["model", "str"]),
    "configs-table": ("[configs]\n", ["section [model] is missing"]),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_load_scenario(tmp_path, name):
    text, words = SCENARIOS[name]
    path = tmp_path / f"{name}.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    check(lambda: load_scenario(path), E.ConfigError, words)


def test_load_scenario_field_errors(tmp_path):
    import tomllib

    data = tomllib.loads(_scenario_text())
    # every number the shipped scenario sets, made negative, a string and a NaN, is refused
    # naming its field
    touched = 0
    for section, table in data.items():
        if not isinstance(table, dict):
            continue
        for key, value in table.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            for bad in (-1, "x", float("nan")):
                broken = json.loads(json.dumps(data))
                broken[section][key] = bad
                path = tmp_path / "s.toml"
                path.write_text(_to_toml(broken))
                with pytest.raises(E.ConfigError) as info:
                    load_scenario(path)
                assert key in str(info.value), (section, key, bad, str(info.value))
                touched += 1
    assert touched >= 15


def _to_toml(data) -> str:
    """A tiny TOML writer for the scenario layout (tables, arrays of tables, scalars)."""
    def scalar(v):
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float) and v != v:
            return "nan"
        if isinstance(v, list):
            return "[" + ", ".join(scalar(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {scalar(x)}" for k, x in v.items()) + "}"
        return repr(v)

    lines, tables = [], []
    for k, v in data.items():
        if isinstance(v, dict) or (isinstance(v, list) and v and isinstance(v[0], dict)):
            tables.append((k, v))
        else:
            lines.append(f"{k} = {scalar(v)}")

    def table(prefix, t):
        out = [f"[{prefix}]"]
        subs = []
        for k, v in t.items():
            if isinstance(v, dict):
                subs.append((f"{prefix}.{k}", v))
            else:
                out.append(f"{k} = {scalar(v)}")
        for p, s in subs:
            out += table(p, s)
        return out

    for k, v in tables:
        if isinstance(v, dict):
            lines += table(k, v)
        else:
            for item in v:
                lines.append(f"[[{k}]]")
                lines += [f"{a} = {scalar(b)}" for a, b in item.items()]
    return "\n".join(lines) + "\n"


SCENARIO_CALLS = cases(
    ("missing", lambda p: load_scenario(p / "missing.toml"), E.ConfigError, ["missing.toml", "does not exist"]),
    ("directory", lambda p: load_scenario(p), E.ConfigError, ["is a directory"]),
    ("none", lambda p: load_scenario(None), E.ConfigError, ["path", "NoneType"]),
)


@pytest.mark.parametrize("call, err, words", SCENARIO_CALLS)
def test_scenario_calls(tmp_path, call, err, words):
    check(call, err, words, tmp_path)


# -- DLRM weights ------------------------------------------------------------------------

def _weights(**changes):
    base = dict(config_json=np.array("{}"), emb_0=np.zeros((3, 2), np.float32),
                bot_w_0=np.zeros((2, 4), np.float32), bot_b_0=np.zeros(2, np.float32),
                top_w_0=np.zeros((1, 3), np.float32), top_b_0=np.zeros(1, np.float32))
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


MODELS = {
    "garbage": (b"x" * 40, E.InvalidArgumentError, ["not a readable .npz"]),
    "npy": ("npy", E.InvalidArgumentError, ["single array"]),
    "pickled-config": (_weights(config_json="PICKLE"), E.InvalidArgumentError, ["'config_json'", "pickle"]),
    "pickled-table": (_weights(emb_0="PICKLE"), E.InvalidArgumentError, ["'emb_0'", "pickle"]),
    "config-not-json": (_weights(config_json=np.array("{")), E.InvalidArgumentError, ["config_json", "not JSON"]),
    "config-list": (_weights(config_json=np.array("[]")), E.InvalidArgumentError, ["config_json", "JSON object"]),
    "config-missing": (_weights(config_json=None), E.InvalidArgumentError, ["'config_json'"]),
    "ln-emb-int": (_weights(config_json=np.array('{"ln_emb": 3}')), E.InvalidArgumentError, ["ln_emb", "3"]),
    "ln-emb-count": (_weights(config_json=np.array('{"ln_emb": [3, 3]}')), E.InvalidArgumentError,
                     ["2 tables", "1 emb_k"]),
    "bias-missing": (_weights(bot_b_0=None), E.InvalidArgumentError, ["'bot_b_0'"]),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_load_npz(tmp_path, name):
    content, err, words = MODELS[name]
    path = tmp_path / "m.npz"
    marker = tmp_path / "unpickled"
    _write_trace_file(path, content, marker)
    check(lambda: load_npz(path), err, words)
    assert not marker.exists()


def test_load_npz_missing_is_file_not_found(tmp_path):
    # documented in load_npz: the builtin FileNotFoundError (not reachable from the CLI)
    with pytest.raises(FileNotFoundError):
        load_npz(tmp_path / "nope.npz")


def test_fbgemm_npz_with_object_arrays_is_refused(tmp_path):
    marker = tmp_path / "unpickled"
    np.savez(tmp_path / "f.npz", indices=np.array([_Marker(marker)], dtype=object),
             offsets=np.array([0, 1]), lengths=np.array([1]))
    with pytest.raises(tr.TraceFormatError, match="f.npz"):
        tr.read_fbgemm(tmp_path / "f.npz")
    assert not marker.exists()


# -- replay, sweep, report -------------------------------------------------------------

TINY_TRACE = os.path.join(os.path.dirname(SCENARIO_DIR), "traces", "tiny-zipf.npz")


def _replay(trace=TINY_TRACE, config="dram", **kw):
    from sdm.replay.live import replay

    return lambda p: replay(trace, config, workdir=str(p), **kw)


def _sweep(trace=TINY_TRACE, **kw):
    from sdm.replay.sweep import sweep

    return lambda p: sweep(trace, **kw)


def _report(scenarios=None, replays=(), out=None):
    from sdm.report import write_report

    return lambda p: write_report(scenarios, replays, out if out is not None else str(p / "out"))


RUNS = cases(
    ("replay-trace-none", _replay(trace=None), E.InvalidArgumentError, ["trace path", "NoneType"]),
    ("replay-trace-missing", lambda p: _replay(trace=str(p / "no.npz"))(p), tr.TraceNotFoundError, ["no.npz"]),
    ("replay-config", _replay(config="nvme"), E.ConfigError, ["'nvme'", "sdm-nand"]),
    ("replay-dim-0", _replay(dim=0), E.InvalidArgumentError, ["dim", "[1, 65536]", "0"]),
    ("replay-fmt", _replay(fmt="fp64"), E.InvalidArgumentError, ["'fp64'", "int8"]),
    ("replay-io-mode", _replay(io_mode="turbo"), E.ConfigError, ["'turbo'", "direct"]),
    ("replay-sla-negative", _replay(sla_us=-1), sdm.replay.live.SlaError, ["SLA", "-1"]),
    ("replay-sla-nan", _replay(sla_us=float("nan")), sdm.replay.live.SlaError, ["SLA", "nan"]),
    ("replay-request-size", _replay(request_size=-2), E.InvalidArgumentError, ["request_size", "-2"]),
    ("replay-warmup-none", _replay(warmup_batches=None), E.InvalidArgumentError, ["warmup_batches", "None"]),
    ("replay-warmup-all", _replay(warmup_batches=10**6), E.InvalidArgumentError, ["warmup_batches", "no batch"]),
    ("replay-max-batches-0", _replay(max_batches=0), E.InvalidArgumentError, ["max_batches", "0"]),
    ("replay-model", _replay(model="rm9"), E.ConfigError, ["'rm9'", "rm2"]),
    ("replay-store-missing", _replay(store="/nonexistent/store"), E.StoreNotFoundError, ["/nonexistent/store"]),
    ("sweep-policies-none", _sweep(policies=None), E.InvalidArgumentError, ["policies", "None"]),
    ("sweep-policy", _sweep(policies=["lrux"]), E.InvalidArgumentError, ["'lrux'", "sieve"]),
    ("sweep-size-0", _sweep(cache_sizes=[0]), E.InvalidArgumentError, ["size 0", "1 byte"]),
    ("sweep-size-text", _sweep(cache_sizes=["abc"]), E.InvalidArgumentError, ["'abc'", "64M"]),
    ("sweep-device", _sweep(devices=["floppy"]), E.ConfigError, ["'floppy'", "nand-p4500"]),
    ("sweep-queue-depth", _sweep(queue_depth=0), E.InvalidArgumentError, ["queue_depth", "[1, 1024]"]),
    ("sweep-workers", _sweep(workers=0), E.InvalidArgumentError, ["workers", "0"]),
    ("report-scenario-missing", _report("nope.toml"), E.ConfigError, ["nope.toml", "does not exist"]),
    ("report-replay-not-json", _report(replays=[os.path.join(SCENARIO_DIR, "README.md")]), E.ConfigError,
     ["README.md", "not JSON"]),
    ("report-replay-int", _report(replays=[3]), E.ConfigError, ["replay result", "int"]),
    ("report-out-under-file", _report(out=os.path.join(SCENARIO_DIR, "README.md", "x")), E.ConfigError,
     ["README.md", "Not a directory"]),
)


@pytest.mark.parametrize("call, err, words", RUNS)
def test_replay_sweep_report_calls(tmp_path, call, err, words):
    check(call, err, words, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written


def test_corpus_size():
    sizes = {"embedding_bag": len(BAG), "formats": len(FORMATS), "simulate/Cache": len(SIM),
             "TableSpec": len(SPECS), "Store.create/open": len(CREATE), "Store calls": len(STORE),
             "trace.load files": len(BAD_TRACES), "trace calls": len(TRACE_CALLS),
             "trace.generate": len(GENERATE), "load_toml": len(TOMLS), "config calls": len(CONFIG_CALLS),
             "Placement.load files": len(PLACEMENT_FILES), "placement calls": len(PLACEMENT_CALLS),
             "scenarios": len(SCENARIOS) + len(SCENARIO_CALLS), "load_npz": len(MODELS),
             "replay/sweep/report": len(RUNS)}
    assert sum(sizes.values()) >= 300, sizes
