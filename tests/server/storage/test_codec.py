"""The point codec (#20): any float64 array and any int64 steps come back bit for bit, alone or
many rows decoded at once, and rows of the old packed layout still read."""

from __future__ import annotations

import time
from typing import cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from trainvitals.exceptions import StorageError
from trainvitals.server.storage import codec

#: Every float64 bit pattern is a value: NaNs with any payload, ±0, ±Inf, subnormals.
any_float_bits = hnp.arrays(np.uint64, st.integers(1, 300), elements=st.integers(0, 2**64 - 1))
floats = hnp.arrays(
    np.float64,
    st.integers(1, 300),
    elements=st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
)
steps = hnp.arrays(np.int64, st.integers(1, 300), elements=st.integers(-(2**63), 2**63 - 1))


def rows_of(*chunks: tuple[np.ndarray, np.ndarray, np.ndarray]) -> list[codec.Row]:
    return [(codec.DELTA_XOR, s.size, *codec.encode(s, t, v)) for s, t, v in chunks]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.tobytes() == b.tobytes()


@settings(max_examples=300, deadline=None)
@given(any_float_bits, st.data())
def test_any_float64_bits_and_int64_steps_round_trip(bits: np.ndarray, data: st.DataObject) -> None:
    values = bits.view(np.float64)
    times = data.draw(hnp.arrays(np.uint64, values.size)).view(np.float64)
    step = data.draw(hnp.arrays(np.int64, values.size))
    (row,) = rows_of((step, times, values))
    got = codec.decode([row])
    assert same_bits(got.steps, step) and same_bits(got.times, times)
    assert same_bits(got.values, values)
    assert same_bits(np.array([codec.last_value(row[0], row[4])]), values[-1:])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(steps, floats), min_size=1, max_size=6), st.data())
def test_many_rows_of_both_encodings_decode_at_once(
    parts: list[tuple[np.ndarray, np.ndarray]], data: st.DataObject
) -> None:
    rows: list[codec.Row] = []
    for step, values in parts:
        n = min(step.size, values.size)
        chunk = (step[:n], values[:n][::-1].copy(), values[:n])
        if data.draw(st.booleans()):
            rows.append(
                (data.draw(st.sampled_from([None, codec.RAW])), n, *codec.encode_raw(*chunk))
            )
        else:
            rows += rows_of(chunk)
    got = codec.decode(rows)
    assert same_bits(got.steps, np.concatenate([s[: min(s.size, v.size)] for s, v in parts]))
    assert same_bits(got.values, np.concatenate([v[: min(s.size, v.size)] for s, v in parts]))


def test_the_special_values_by_name() -> None:
    values = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 5e-324, -2.2e-308, 1.0])
    values_bits = values.view(np.uint64).copy()
    values_bits[1] = 0x7FF0000000000001  # a signalling NaN's payload
    values = values_bits.view(np.float64)
    step = np.array([0, 1, 2, 4, 8, -(2**63), 2**63 - 1, 3, 3], dtype=np.int64)
    got = codec.decode(rows_of((step, np.arange(9.0), values)))
    assert same_bits(got.values, values) and same_bits(got.steps, step)


def test_a_real_looking_series_is_small_and_a_million_points_decode_fast() -> None:
    rng = np.random.default_rng(0)
    n = 1_000_000
    step = np.arange(n, dtype=np.int64)
    times = 1.7e9 + np.cumsum(rng.uniform(0.008, 0.009, n))
    loss = (np.exp(-step / 3e5) + rng.normal(0, 0.01, n)).astype(np.float32).astype(np.float64)
    chunks = [(step[i : i + 65_536], times[i : i + 65_536], loss[i : i + 65_536])
              for i in range(0, n, 65_536)]  # fmt: skip
    rows = rows_of(*chunks)
    size = sum(len(cast(bytes, part)) for row in rows for part in row[2:])
    assert size / n < 6  # 24 packed
    started = time.perf_counter()
    got = codec.decode(rows)
    assert time.perf_counter() - started < 0.5
    assert same_bits(got.values, loss) and same_bits(got.times, times)


def test_an_unknown_encoding_says_to_upgrade() -> None:
    (row,) = rows_of((np.arange(3), np.arange(3.0), np.arange(3.0)))
    with pytest.raises(StorageError, match="encoding 9, which this version does not know"):
        codec.decode([(9, *row[1:])])
