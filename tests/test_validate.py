"""sdm.validate: the validators every public entry point checks its arguments with."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdm.errors import ConfigError, IdOutOfRangeError, InvalidArgumentError
from sdm.validate import (INT64_MAX, as_array, as_int_array, check_choice, check_id_array, check_int,
                          check_number, check_permutation)

NUMPY_INTS = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)


# -- check_int -------------------------------------------------------------------------------------

@given(st.integers(-1000, 1000), st.integers(-1000, 1000), st.integers(-1000, 1000))
def test_int_in_range_or_refused_naming_both_bounds(value, lo, hi):
    if lo <= value <= hi:
        got = check_int(value, "n", lo=lo, hi=hi)
        assert got == value and type(got) is int
    else:
        with pytest.raises(InvalidArgumentError) as err:
            check_int(value, "n", lo=lo, hi=hi)
        assert str(err.value) == f"n must be an integer in [{lo}, {hi}], got {value}"


@pytest.mark.parametrize("lo, hi, limit", [
    (0, None, ">= 0"), (None, 5, "<= 5"), (1, None, "positive integer (>= 1)"), (2, None, ">= 2"),
    (1, INT64_MAX, "[1, 2**63 - 1]"),
])
def test_int_message_names_the_limit(lo, hi, limit):
    bad = -7 if lo is not None else 6
    with pytest.raises(InvalidArgumentError) as err:
        check_int(bad, "queue_depth", lo=lo, hi=hi)
    msg = str(err.value)
    assert msg.startswith("queue_depth must be ") and limit in msg and msg.endswith(f"got {bad}")


def test_int_unbounded_takes_any_integer():
    for v in (-(2**80), 0, 2**80):
        assert check_int(v, "seed") == v


@pytest.mark.parametrize("value", [True, False, np.bool_(True)])
def test_bools_are_not_integers(value):
    with pytest.raises(InvalidArgumentError, match=r"n must be an integer in \[0, 9\], got (np\.)?(True|False)_? \(bool_?\)"):
        check_int(value, "n", lo=0, hi=9)


@pytest.mark.parametrize("value", [1.0, 2.5, float("nan"), float("inf"), "3", b"3", None, [1], Fraction(1, 1),
                                   np.float64(1.0), np.array(1), 1j])
def test_non_integers_are_refused_with_their_type(value):
    with pytest.raises(InvalidArgumentError) as err:
        check_int(value, "dim", lo=1, hi=10)
    msg = str(err.value)
    assert msg.startswith("dim must be an integer in [1, 10], got ")
    assert (value is None and msg.endswith("None")) or f"({type(value).__name__})" in msg


@given(st.sampled_from(NUMPY_INTS), st.integers(0, 127))
def test_numpy_integers_come_back_as_int(dtype, value):
    got = check_int(dtype(value), "n", lo=0, hi=127)
    assert got == value and type(got) is int


def test_numpy_integer_out_of_range_is_shown_plainly():
    with pytest.raises(InvalidArgumentError, match=r"got 300$"):
        check_int(np.int64(300), "n", lo=0, hi=255)


def test_the_error_class_is_the_callers():
    with pytest.raises(ConfigError):
        check_int(0, "capacity_bytes", lo=1, error=ConfigError)
    with pytest.raises(ConfigError):
        check_int("x", "capacity_bytes", lo=1, error=ConfigError)


# -- check_number ----------------------------------------------------------------------------------

@given(st.floats(allow_nan=False, allow_infinity=False, width=64), st.booleans(), st.booleans())
def test_number_bounds_open_and_closed(value, lo_open, hi_open):
    inside = (value > 0 if lo_open else value >= 0) and (value < 1 if hi_open else value <= 1)
    if inside:
        assert check_number(value, "r", lo=0, hi=1, lo_open=lo_open, hi_open=hi_open) == value
    else:
        with pytest.raises(InvalidArgumentError) as err:
            check_number(value, "r", lo=0, hi=1, lo_open=lo_open, hi_open=hi_open)
        span = f"{'(' if lo_open else '['}0, 1{')' if hi_open else ']'}"
        assert str(err.value) == f"r must be a finite number in {span}, got {value!r}"


@pytest.mark.parametrize("value", [float("nan"), np.float32("nan"), float("inf"), -float("inf"), np.inf])
def test_nan_and_infinities_are_refused(value):
    with pytest.raises(InvalidArgumentError, match=r"sla must be a finite number > 0, got -?(nan|inf)"):
        check_number(value, "sla", lo=0, lo_open=True)


def test_infinity_allowed_when_asked_but_never_nan():
    assert check_number(float("inf"), "x", lo=0, finite=False) == math.inf
    with pytest.raises(InvalidArgumentError, match="x must be a number >= 0, got nan"):
        check_number(float("nan"), "x", lo=0, finite=False)


@pytest.mark.parametrize("value", [True, np.bool_(False), "0.5", None, 1j, [0.5]])
def test_non_numbers_are_refused(value):
    with pytest.raises(InvalidArgumentError, match=r"^p must be a finite number in \[0, 1\], got "):
        check_number(value, "p", lo=0, hi=1)


@pytest.mark.parametrize("value, want", [(1, 1.0), (np.int64(2), 2.0), (np.float32(0.5), 0.5),
                                         (np.float16(0.25), 0.25), (Fraction(1, 2), 0.5)])
def test_numbers_come_back_as_float(value, want):
    got = check_number(value, "x")
    assert got == want and type(got) is float


def test_number_shows_an_int_as_an_int():
    with pytest.raises(InvalidArgumentError, match=r"got -1$"):
        check_number(-1, "years", lo=0)
    with pytest.raises(InvalidArgumentError, match=r"got 2\.5$"):
        check_number(np.float64(2.5), "pin_fraction", lo=0, hi=1)


# -- check_choice ----------------------------------------------------------------------------------

def test_choice():
    assert check_choice("lru", "policy", ("lru", "fifo")) == "lru"
    assert check_choice(2, "level", (1, 2)) == 2
    for bad in ("LRU", "lru ", None, 3, [], ["lru"], True, b"lru"):
        with pytest.raises(InvalidArgumentError) as err:
            check_choice(bad, "policy", ("lru", "fifo"))
        assert str(err.value) == f"policy {bad!r} is not one of ('lru', 'fifo')"


def test_a_bool_is_not_a_numbered_choice():
    with pytest.raises(InvalidArgumentError):
        check_choice(True, "level", (0, 1))


# -- arrays ----------------------------------------------------------------------------------------

def test_ragged_input_is_refused_naming_it():
    with pytest.raises(InvalidArgumentError, match=r"^offsets must be an array, got a ragged list"):
        as_array([[1], [1, 2]], "offsets")
    with pytest.raises(ConfigError, match="ragged tuple"):
        as_array(([1], [1, 2]), "rows", error=ConfigError)


@given(st.lists(st.integers(0, INT64_MAX), max_size=50), st.sampled_from([np.int64, np.uint64]))
def test_id_array_accepts_every_int64_id(ids, dtype):
    got = check_id_array(np.array(ids, dtype=dtype), "keys")
    assert got.dtype == np.int64 and got.flags.c_contiguous and got.tolist() == ids


@given(st.lists(st.integers(0, 99), min_size=1, max_size=50), st.sampled_from(NUMPY_INTS))
def test_id_array_dtypes_and_int32_kept_when_asked(ids, dtype):
    a = np.array(ids, dtype=dtype)
    kept = check_id_array(a, "index", upper=100, keep_int32=True)
    assert kept.dtype == (np.int32 if dtype == np.int32 else np.int64)
    assert check_id_array(a, "index", upper=100).dtype == np.int64
    assert kept.tolist() == ids


def test_id_array_no_copy_when_already_int64():
    a = np.arange(5, dtype=np.int64)
    assert check_id_array(a, "ids") is a
    assert check_id_array(a[::2], "ids").flags.c_contiguous


@pytest.mark.parametrize("empty", [[], (), np.array([]), np.empty(0, np.int32), np.empty(0, np.uint64)])
def test_empty_id_arrays(empty):
    got = check_id_array(empty, "ids", upper=3)
    assert got.shape == (0,) and got.dtype in (np.int64, np.int32)


def test_empty_float_arrays_other_than_a_plain_empty_list_are_refused():
    with pytest.raises(InvalidArgumentError, match="integer dtype, got float32"):
        check_id_array(np.empty(0, np.float32), "ids")


@pytest.mark.parametrize("ids, words", [
    ([1.0], ["integer dtype", "float64"]), ([np.nan], ["integer dtype", "float64"]),
    ([True], ["integer dtype", "bool"]), (["1"], ["integer dtype", "<U1"]),
    (np.array([1], object), ["integer dtype", "object"]), ([[1]], ["1-D", "(1, 1)"]),
    (3, ["1-D", "()"]), (None, ["1-D", "()"]), ([[1], [1, 2]], ["ragged", "list"]),
])
def test_id_array_shape_and_dtype_errors(ids, words):
    with pytest.raises(InvalidArgumentError) as err:
        check_id_array(ids, "index", upper=10)
    assert type(err.value) is InvalidArgumentError
    assert all(w in str(err.value) for w in words), str(err.value)


@pytest.mark.parametrize("ids, err, words", [
    ([-1], IdOutOfRangeError, ["index -1 is negative", "[0, 10)"]),
    ([0, 10], IdOutOfRangeError, ["index 10 is out of range", "table of 10 rows", "[0, 10)"]),
    (np.array([2**64 - 1], np.uint64), IdOutOfRangeError, [str(2**64 - 1), "table of 10 rows"]),
    (np.array([2**63], np.uint64), IdOutOfRangeError, [str(2**63), "[0, 10)"]),
])
def test_id_array_range_errors_name_the_id_and_the_range(ids, err, words):
    with pytest.raises(err) as info:
        check_id_array(ids, "index", upper=10)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_uint64_beyond_int64_without_a_table():
    with pytest.raises(InvalidArgumentError) as err:
        check_id_array(np.array([5, 2**64 - 1], np.uint64), "keys")
    assert str(2**64 - 1) in str(err.value) and str(INT64_MAX) in str(err.value)
    assert check_id_array(np.array([INT64_MAX], np.uint64), "keys").tolist() == [INT64_MAX]


def test_negative_ids_without_a_table():
    with pytest.raises(InvalidArgumentError, match=r"keys -5 is negative \(valid: >= 0\)"):
        check_id_array([3, -5], "keys")


def test_range_error_class_and_domain_are_the_callers():
    with pytest.raises(InvalidArgumentError) as err:
        check_id_array([4], "slot", upper=4, domain="a cache of 4 slots", range_error=InvalidArgumentError)
    assert type(err.value) is InvalidArgumentError
    assert str(err.value) == "slot 4 is out of range for a cache of 4 slots (valid: [0, 4))"


@given(st.lists(st.integers(-(2**63), INT64_MAX), max_size=50))
def test_int_array_takes_any_sign(values):
    got = as_int_array(np.array(values, dtype=np.int64), "ids")
    assert got.tolist() == values


def test_int_array_refuses_uint64_beyond_int64():
    with pytest.raises(InvalidArgumentError, match="does not fit int64"):
        as_int_array(np.array([2**64 - 1], np.uint64), "ids")


# -- check_permutation -----------------------------------------------------------------------------

@given(st.permutations(list(range(12))), st.sampled_from([np.int64, np.int32, np.uint16]))
def test_permutations_pass(perm, dtype):
    got = check_permutation(np.array(perm, dtype=dtype), 12, "order")
    assert got.dtype == np.int64 and got.tolist() == perm


@pytest.mark.parametrize("order, words", [
    (np.arange(10), ["(12,)", "shape (10,)"]),
    (np.arange(12.0), ["integer permutation", "float64"]),
    (np.arange(12) == 3, ["integer permutation", "bool"]),
    (np.r_[np.arange(11), 12], ["holds row 12", "outside [0, 12)"]),
    (np.r_[-1, np.arange(1, 12)], ["holds row -1", "outside [0, 12)"]),
    (np.r_[np.arange(11), 3], ["not a permutation of range(12)", "row 11 is missing"]),
])
def test_non_permutations_are_refused(order, words):
    with pytest.raises(ConfigError) as err:
        check_permutation(order, 12, "row order of table 't'", error=ConfigError)
    msg = str(err.value)
    assert msg.startswith("row order of table 't' ") and all(w in msg for w in words), msg


def test_empty_permutation():
    assert check_permutation([], 0, "order").shape == (0,)
