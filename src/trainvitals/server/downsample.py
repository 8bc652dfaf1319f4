"""Reduce a long series to at most ``max_points`` points without hiding what matters.

Each of ``max_points // 2`` equal index buckets keeps its minimum and its maximum, in their
original order, so a one-step loss spike survives any zoom level. A bucket that holds a
NaN/Inf also keeps its first non-finite point: a NaN is an event, not noise to average away.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def downsample_indices(values: npt.NDArray[np.float64], max_points: int) -> npt.NDArray[np.intp]:
    """Indices of the points to keep, ascending. All of them when there are few enough."""
    n = values.size
    if n <= max_points:
        return np.arange(n)
    finite = np.isfinite(values)
    # Two points a bucket (min, max), three when non-finite values may add one more.
    buckets = max(max_points // (2 if finite.all() else 3), 1)
    edges = np.linspace(0, n, buckets + 1).astype(np.intp)
    # Non-finite values must not win min/max; they are kept separately below.
    low = np.where(finite, values, np.inf)
    high = np.where(finite, values, -np.inf)
    keep: list[npt.NDArray[np.intp]] = []
    starts = edges[:-1]
    # reduceat gives each bucket's min and max; the positions are found within the bucket.
    bucket_min = np.minimum.reduceat(low, starts)
    bucket_max = np.maximum.reduceat(high, starts)
    for b in range(buckets):
        start, stop = edges[b], edges[b + 1]
        if stop <= start:
            continue
        chosen = []
        if np.isfinite(bucket_min[b]):
            chosen.append(start + int(np.argmax(low[start:stop] == bucket_min[b])))
            chosen.append(start + int(np.argmax(high[start:stop] == bucket_max[b])))
        bad = np.flatnonzero(~finite[start:stop])
        if bad.size:
            chosen.append(start + int(bad[0]))
        keep.append(np.asarray(chosen, dtype=np.intp))
    kept = np.unique(np.concatenate(keep)) if keep else np.arange(0)
    if kept.size > max_points:
        # max_points 2 and a value not finite: one bucket of three. The first value not
        # finite is what matters most, then the first extreme.
        ranked = np.concatenate([kept[~finite[kept]], kept[finite[kept]]])
        kept = np.sort(ranked[:max_points])
    return kept
