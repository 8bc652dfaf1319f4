"""Compact encoding of a chunk's points: steps, times and values, each a byte string.

Encoding 0 (``RAW``, every row written before this codec): packed little-endian ``int64`` steps
and ``float64`` times and values, 24 bytes a point.

Encoding 1 (``DELTA_XOR``), for what the columns are, as in the Gorilla paper (Pelkonen et al.,
VLDB 2015) and Prometheus' TSDB, but byte-aligned so that numpy does all of it at once:

- **steps** (``int64``, nearly consecutive): delta-of-delta, zigzag (small negatives small);
  a run of consecutive steps is all zeros.
- **times** (``float64``, nearly evenly spaced): the same delta-of-delta on the floats' bit
  patterns read as ``int64``. For positive floats the bit pattern grows with the value and is
  linear within a binade, so an even spacing is zeros and jitter costs its size in ULPs; the
  arithmetic wraps, so any bits come back exactly.
- **values** (``float64``): each value's bits XOR the previous value's. A smooth series, or one
  computed in float32 (most of TensorFlow's), leaves long runs of zero bits.

Each transformed column's 8-byte words are then transposed into 8 byte planes (all the
first bytes, then all the second bytes...), so the zero bytes line up, and deflated (zlib,
raw stream). Decoding is the inverse: inflate, untranspose, and a cumulative sum (steps and
times) or a cumulative XOR (values) — numpy, vectorised across every row read at once.

Encoding 2 (``NARROW``, what :func:`encode` writes now): steps as in ``DELTA_XOR``; times and
values each begin with a byte that says their form, chosen per block:

- times: ``0``, as in ``DELTA_XOR``; ``1``, when every time is a whole number of microseconds
  (the agent sends them so) and comes back exactly from it (any such time up to 2^32 s, the year
  2106, does): delta-of-delta of ``int64``
  microseconds, where the float's bits would spend about two more bits a point on its ULPs.
- values: ``0``, as in ``DELTA_XOR``; ``1``, when every value is exactly a float32 (what
  TensorFlow computes): the float32 bits XOR the previous ones, in 4 byte planes, where the
  float64's layout spreads the same bits over 5 bytes.

Every float64 comes back bit for bit: NaN payloads, -0.0, ±Inf and subnormals included (a
block whose times or values a narrow form would not give back exactly keeps the wide one).
Rows of every encoding read, mixed in any order.

The encoded steps and times of a block depend on nothing else, so series with the very same
steps at the very same times (a run's per-step series; its system series) encode them to the
very same bytes: storage keeps those once a run, in its ``clocks``
(:mod:`~trainvitals.server.storage.series`), and a block row then holds only its values. What
is left of a noisy float32 series is its values' noise: about 3.4 of their 4 bytes a point.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from trainvitals.exceptions import StorageError
from trainvitals.protocol import ArrayColumns, Columns

RAW = 0
DELTA_XOR = 1
NARROW = 2
#: What :func:`encode` writes.
CURRENT = NARROW

#: The form bytes of a ``NARROW`` row's times and values.
_WIDE, _SMALL = 0, 1
_MICROS = 1e6
_MAX_MICROS_TIME = 9e12  # seconds: beyond, microseconds overflow int64

_ZLIB_LEVEL = 6
_RAW_DEFLATE = -15  # wbits: a raw deflate stream, without zlib's 6 bytes of header and checksum
_I8 = np.dtype("<i8")
_U8 = np.dtype("<u8")
_F8 = np.dtype("<f8")
_U4 = np.dtype("<u4")
_F4 = np.dtype("<f4")

Encoded = tuple[bytes, bytes, bytes]
#: A stored row's columns: (encoding, steps, times, vals); encoding None reads as RAW.
Row = Sequence[object]


def encode(
    steps: ArrayLike, times: ArrayLike, values: ArrayLike, *, narrow: bool = True
) -> Encoded:
    """The ``NARROW`` encoding of one chunk's points (equal lengths); ``narrow=False``: the
    wide forms whatever the points are (what ``DELTA_XOR`` would take, for comparison)."""
    return (
        _deflate(_zigzag(_delta_of_delta(np.asarray(steps, dtype=_I8)))),
        _encode_times(np.asarray(times, dtype=_F8), narrow),
        _encode_values(np.asarray(values, dtype=_F8), narrow),
    )


def encode_raw(steps: ArrayLike, times: ArrayLike, values: ArrayLike) -> Encoded:
    """The ``RAW`` layout (what rows held before the codec)."""
    return (*encode_raw_clock(steps, times), encode_raw_values(values))


def encode_raw_clock(steps: ArrayLike, times: ArrayLike) -> tuple[bytes, bytes]:
    """The steps and times of :func:`encode_raw`: the same for every series that shares them."""
    return np.asarray(steps, dtype=_I8).tobytes(), np.asarray(times, dtype=_F8).tobytes()


def encode_raw_values(values: ArrayLike) -> bytes:
    """The values of :func:`encode_raw`."""
    return np.asarray(values, dtype=_F8).tobytes()


def decode(rows: Sequence[Row]) -> ArrayColumns:
    """The points of consecutive rows ``(encoding, n, steps, times, vals)``, in row order;
    rows of both encodings may be mixed."""
    if all(_encoding(row[0]) == RAW for row in rows):
        return _decode_raw(rows)
    return _concatenate([_decode_run(run) for run in _runs_by_encoding(rows)])


def last_value(encoding: object, vals: object) -> float:
    """The last value of one row's ``vals``."""
    kind = _encoding(encoding)
    if kind == RAW:
        return float(np.frombuffer(vals, dtype=_F8)[-1])  # type: ignore[call-overload]
    if kind == NARROW:
        form, body = _form(vals)
        if form == _SMALL:
            return float(np.bitwise_xor.reduce(_inflate(body, 4)).view(_F4))
        vals = body
    return float(np.bitwise_xor.reduce(_inflate(vals)).view(_F8))


# -- the transforms ---------------------------------------------------------------------------


def _delta_of_delta(x: np.ndarray) -> np.ndarray:
    """``[x0, x1 - x0, then each second difference]`` (int64, wrapping)."""
    out = np.empty_like(x)
    out[:2] = x[:2]
    if x.size > 1:
        out[1:2] = x[1:2] - x[:1]  # arrays: wrapping, where numpy scalars would warn
        out[2:] = np.diff(x, 2)
    return out


def _zigzag(x: np.ndarray) -> np.ndarray:
    return ((x << 1) ^ (x >> 63)).view(_U8)


def _unzigzag(u: np.ndarray) -> np.ndarray:
    return ((u >> np.uint64(1)) ^ (np.uint64(0) - (u & np.uint64(1)))).view(_I8)


def _xor_previous(u: np.ndarray) -> np.ndarray:
    out = u.copy()
    out[1:] ^= u[:-1]
    return out


def _deflate(words: np.ndarray) -> bytes:
    width = words.dtype.itemsize
    planes = words.view(np.uint8).reshape(-1, width).T  # byte plane p: byte p of every word
    return zlib.compress(planes.tobytes(), _ZLIB_LEVEL, _RAW_DEFLATE)


def _encode_times(times: np.ndarray, narrow: bool) -> bytes:
    micros = _exact_micros(times) if narrow else None
    if micros is None:
        return bytes([_WIDE]) + _deflate(_zigzag(_delta_of_delta(times.view(_I8))))
    return bytes([_SMALL]) + _deflate(_zigzag(_delta_of_delta(micros)))


def _exact_micros(times: np.ndarray) -> np.ndarray | None:
    """``times`` as whole microseconds (``int64``), if that is exactly what they are."""
    if not np.all(np.abs(times) < _MAX_MICROS_TIME):  # NaN and ±Inf too
        return None
    micros = np.round(times * _MICROS).astype(_I8)
    # The very division decoding does: -0.0, and any float a microsecond can't give, fail.
    if not np.array_equal((micros / _MICROS).view(_U8), times.view(_U8)):
        return None
    return micros


def _encode_values(values: np.ndarray, narrow: bool) -> bytes:
    with np.errstate(over="ignore", invalid="ignore"):  # refused below if not exact
        single = values.astype(_F4)
    if narrow and np.array_equal(single.astype(_F8).view(_U8), values.view(_U8)):
        return bytes([_SMALL]) + _deflate(_xor_previous(single.view(_U4)))
    return bytes([_WIDE]) + _deflate(_xor_previous(values.view(_U8)))


# -- decoding ---------------------------------------------------------------------------------


def _encoding(marker: object) -> int:
    return RAW if marker is None else int(marker)  # type: ignore[call-overload]


def _runs_by_encoding(rows: Sequence[Row]) -> list[list[Row]]:
    runs: list[list[Row]] = []
    for row in rows:
        if runs and _encoding(runs[-1][0][0]) == _encoding(row[0]):
            runs[-1].append(row)
        else:
            runs.append([row])
    return runs


def _decode_run(rows: Sequence[Row]) -> ArrayColumns:
    kind = _encoding(rows[0][0])
    if kind == RAW:
        return _decode_raw(rows)
    if kind == NARROW:
        return _concatenate([_decode_narrow(row) for row in rows])
    if kind != DELTA_XOR:
        raise StorageError(
            f"a stored chunk has encoding {kind}, which this version does not know: "
            "upgrade trainvitals"
        )
    sizes = np.array([int(row[1]) for row in rows], dtype=np.int64)  # type: ignore[call-overload]
    steps = _unzigzag(_planes(rows, 2, sizes)).view(_I8)
    times = _unzigzag(_planes(rows, 3, sizes))
    values = _planes(rows, 4, sizes)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    return Columns(
        _undo_delta_of_delta(steps, starts),
        _undo_delta_of_delta(times, starts).view(_F8),
        _undo_xor(values, starts).view(_F8),
    )


def _decode_narrow(row: Row) -> ArrayColumns:
    """One ``NARROW`` row (a compacted block: tens of thousands of points, so a row at a
    time costs little)."""
    n = int(row[1])  # type: ignore[call-overload]
    if row[2] is None or row[3] is None:
        raise StorageError("a stored block's steps and times (its clock) are missing")
    start = np.zeros(1, dtype=np.int64)
    steps = _undo_delta_of_delta(_unzigzag(_inflate(row[2])), start)
    form, body = _form(row[3])
    if form == _SMALL:
        times = _undo_delta_of_delta(_unzigzag(_inflate(body)), start) / _MICROS
    else:
        times = _undo_delta_of_delta(_unzigzag(_inflate(body)), start).view(_F8)
    form, body = _form(row[4])
    if form == _SMALL:
        values = np.bitwise_xor.accumulate(_inflate(body, 4)).view(_F4).astype(_F8)
    else:
        values = np.bitwise_xor.accumulate(_inflate(body)).view(_F8)
    if not steps.size == times.size == values.size == n:
        raise StorageError(
            f"a stored chunk holds {steps.size}, {times.size} and {values.size} steps, times "
            f"and values, not {n} of each"
        )
    return Columns(steps, times, values)


def _form(data: object) -> tuple[int, bytes]:
    """A ``NARROW`` column's form byte, and the rest."""
    column = bytes(data)  # type: ignore[call-overload]
    if not column or column[0] not in (_WIDE, _SMALL):
        raise StorageError(f"a stored chunk's column has form {column[:1]!r}, not 0 or 1")
    return column[0], column[1:]


def _concatenate(parts: Sequence[ArrayColumns]) -> ArrayColumns:
    if len(parts) == 1:
        return parts[0]
    return Columns(
        np.concatenate([p.steps for p in parts]),
        np.concatenate([p.times for p in parts]),
        np.concatenate([p.values for p in parts]),
    )


def _decode_raw(rows: Sequence[Row]) -> ArrayColumns:
    columns = Columns(
        np.frombuffer(b"".join(row[2] for row in rows), dtype=_I8),  # type: ignore[misc]
        np.frombuffer(b"".join(row[3] for row in rows), dtype=_F8),  # type: ignore[misc]
        np.frombuffer(b"".join(row[4] for row in rows), dtype=_F8),  # type: ignore[misc]
    )
    points = sum(int(row[1]) for row in rows)  # type: ignore[call-overload]
    if any(column.size != points for column in columns):  # a blob cut at a whole point
        sizes = "/".join(str(column.size) for column in columns)
        raise StorageError(f"stored chunks hold {sizes} steps/times/values, not {points}")
    return columns


def _inflate(data: object, width: int = 8) -> np.ndarray:
    """One row's words of one column (``width`` bytes each), inflated and put back from byte
    planes."""
    planes = np.frombuffer(zlib.decompress(data, _RAW_DEFLATE), dtype=np.uint8)  # type: ignore[arg-type]
    if planes.size % width:
        raise StorageError(f"a stored chunk holds {planes.size} bytes, not {width} a point")
    return planes.reshape(width, -1).T.copy().view(_U8 if width == 8 else _U4).ravel()


def _planes(rows: Sequence[Row], column: int, sizes: np.ndarray) -> np.ndarray:
    """Every row's words of one column, in one array."""
    if len(rows) == 1:
        words = _inflate(rows[0][column])
    else:
        words = np.concatenate([_inflate(row[column]) for row in rows])
    if words.size != sizes.sum():
        raise StorageError(f"stored chunks hold {words.size} points, not {sizes.sum()}")
    return words


def _undo_delta_of_delta(dod: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The inverse of :func:`_delta_of_delta`, for each segment beginning at ``starts``."""
    deltas = dod.copy()
    deltas[starts] = 0  # each segment's first word is its first value, not a delta
    deltas = _segmented_cumsum(deltas, starts)
    deltas[starts] = dod[starts]
    return _segmented_cumsum(deltas, starts)


def _segmented_cumsum(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The cumulative sum of ``x`` restarting at each of ``starts`` (int64, wrapping)."""
    total = np.cumsum(x)
    before = np.concatenate((np.zeros(1, _I8), total[starts[1:] - 1]))
    lengths = np.diff(np.concatenate((starts, [x.size])))
    out: np.ndarray = total - np.repeat(before, lengths)
    return out


def _undo_xor(u: np.ndarray, starts: np.ndarray) -> np.ndarray:
    total = np.bitwise_xor.accumulate(u)
    before = np.concatenate((np.zeros(1, _U8), total[starts[1:] - 1]))
    lengths = np.diff(np.concatenate((starts, [u.size])))
    out: np.ndarray = total ^ np.repeat(before, lengths)
    return out
