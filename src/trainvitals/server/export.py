"""A run's series at full resolution, as CSV, JSON Lines or Parquet, made piece by piece.

One row a point, in long format: ``name, step, time, value``, series after series in the
order asked, each series' points in the order the agent sent them (several runs at once:
``run_id, run_name, name, step, time, value``, run after run). Nothing is lost:

- **CSV**: a header line, then each value as Python's ``repr`` writes it, the shortest text
  that reads back as the same float64; NaN and ±Inf as ``nan``, ``inf``, ``-inf`` (what
  ``float()``, pandas and numpy read). A name with a comma or a quote is quoted as RFC 4180 says.
  A name a spreadsheet would take for a formula (one that begins with ``=``, ``+``, ``-``,
  ``@``, a tab or a carriage return: a run named ``=HYPERLINK(...)`` by whoever holds an ingest
  token) is written after a ``'``, which spreadsheets show as text; JSON Lines and Parquet
  keep it as sent.
- **JSON Lines**: ``{"name": ..., "step": ..., "time": ..., "value": ...}`` a line; JSON has
  no NaN or Inf, so such a value is ``null`` and the line adds ``"nonfinite": "nan"``
  (or ``"inf"``, ``"-inf"``).
- **Parquet**: columns ``name`` (string), ``step`` (int64), ``time`` and ``value`` (float64,
  NaN and ±Inf as they are), one row group per :data:`PARQUET_ROW_GROUP` points or fewer.

Every function here takes the points as an iterable of ``(labels, Columns)`` batches, the
labels being the values of the file's label columns (:data:`SERIES` or :data:`RUN_SERIES`)
for those points, and yields ``bytes``, so a series of any length goes out without being
held whole.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from enum import StrEnum
from typing import Any

from trainvitals.protocol import ArrayColumns, Columns

#: Points buffered into one Parquet row group (about 2 MiB of columns before compression).
PARQUET_ROW_GROUP = 65_536
#: Points made into text at a time (about 0.5 MiB of CSV).
TEXT_PIECE = 8192
PARQUET_HINT = "Parquet export needs pyarrow on the server: pip install 'trainvitals[parquet]'"

#: The label columns of one run's export, and of several runs' export.
SERIES = ("name",)
RUN_SERIES = ("run_id", "run_name", "name")

Batches = Iterable[tuple[tuple[str, ...], ArrayColumns]]


class ExportFormat(StrEnum):
    CSV = "csv"
    JSONL = "jsonl"
    PARQUET = "parquet"


MEDIA_TYPES = {
    ExportFormat.CSV: "text/csv; charset=utf-8",
    ExportFormat.JSONL: "application/x-ndjson",
    ExportFormat.PARQUET: "application/vnd.apache.parquet",
}


def parquet_available() -> bool:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


def export(
    fmt: ExportFormat, batches: Batches, labels: tuple[str, ...] = SERIES
) -> Iterator[bytes]:
    """The file of ``batches`` in ``fmt``, piece by piece, with ``labels`` as the columns
    before ``step, time, value``."""
    if fmt is ExportFormat.CSV:
        return _csv(batches, labels)
    if fmt is ExportFormat.JSONL:
        return _jsonl(batches, labels)
    return _parquet(batches, labels)


def _pieces(batches: Batches) -> Iterator[tuple[tuple[str, ...], ArrayColumns]]:
    """``batches`` cut to at most :data:`TEXT_PIECE` points: a piece's text is made whole."""
    for keys, (steps, times, values) in batches:
        for start in range(0, steps.size, TEXT_PIECE):
            part = slice(start, start + TEXT_PIECE)
            yield keys, Columns(steps[part], times[part], values[part])


def _csv(batches: Batches, labels: tuple[str, ...]) -> Iterator[bytes]:
    yield (",".join(labels) + ",step,time,value\n").encode()
    for keys, (steps, times, values) in _pieces(batches):
        prefix = "".join(_csv_field(key) + "," for key in keys)
        yield "".join(
            f"{prefix}{step},{time!r},{value!r}\n"
            for step, time, value in zip(
                steps.tolist(), times.tolist(), values.tolist(), strict=True
            )
        ).encode()


def _csv_field(text: str) -> str:
    if text.startswith(_FORMULA_STARTS):
        text = "'" + text
    if any(c in text for c in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


#: What makes a spreadsheet read a cell as a formula (OWASP's list for CSV injection).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _jsonl(batches: Batches, labels: tuple[str, ...]) -> Iterator[bytes]:
    for keys, (steps, times, values) in _pieces(batches):
        pairs = zip(labels, keys, strict=True)
        prefix = "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in pairs)
        prefix += ', "step": '
        yield "".join(
            f'{prefix}{step}, "time": {time!r}, "value": {_json_value(value)}}}\n'
            for step, time, value in zip(
                steps.tolist(), times.tolist(), values.tolist(), strict=True
            )
        ).encode()


def _json_value(value: float) -> str:
    if math.isfinite(value):
        return repr(value)
    return f'null, "nonfinite": "{value!r}"'  # repr: nan, inf, -inf


class _Drain:
    """A write-only file for pyarrow's Parquet writer, emptied after each row group."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._position = 0
        self.closed = False

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._parts.append(chunk)
        self._position += len(chunk)
        return len(chunk)

    def tell(self) -> int:
        return self._position

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


def _parquet(batches: Batches, labels: tuple[str, ...]) -> Iterator[bytes]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([
        *((label, pa.string()) for label in labels),
        ("step", pa.int64()), ("time", pa.float64()), ("value", pa.float64()),
    ])  # fmt: skip
    sink = _Drain()
    writer = pq.ParquetWriter(sink, schema, compression="zstd")
    pending: list[tuple[tuple[str, ...], ArrayColumns]] = []
    size = 0

    def row_group() -> bytes:
        sizes = [columns.steps.size for _, columns in pending]
        label_columns = [
            pa.array(np.repeat(np.array([keys[i] for keys, _ in pending], dtype=object), sizes),
                     pa.string())
            for i in range(len(labels))
        ]  # fmt: skip
        table = pa.table(
            [
                *label_columns,
                pa.array(np.concatenate([c.steps for _, c in pending])),
                pa.array(np.concatenate([c.times for _, c in pending])),
                pa.array(np.concatenate([c.values for _, c in pending])),
            ],
            schema=schema,
        )
        writer.write_table(table)
        pending.clear()
        # Arrow's allocator keeps freed memory for reuse; an export is one-off.
        pa.default_memory_pool().release_unused()
        return sink.take()

    for keys, columns in batches:
        pending.append((keys, columns))
        size += columns.steps.size
        if size >= PARQUET_ROW_GROUP:
            yield row_group()
            size = 0
    if pending:
        yield row_group()
    writer.close()
    yield sink.take()
