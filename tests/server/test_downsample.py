from __future__ import annotations

import itertools

import numpy as np

from trainvitals.server.downsample import downsample_indices


def test_short_series_is_returned_whole() -> None:
    values = np.arange(10, dtype=np.float64)
    assert downsample_indices(values, 2000).tolist() == list(range(10))


def test_each_bucket_keeps_its_min_and_max() -> None:
    rng = np.random.default_rng(1)
    values = rng.normal(size=100_000)
    values[12_345] = 50.0  # a one-step spike
    values[77_777] = -40.0
    keep = downsample_indices(values, 1000)
    assert len(keep) <= 1000
    assert np.all(np.diff(keep) > 0), "indices are ascending and unique"
    assert 12_345 in keep and 77_777 in keep
    edges = np.linspace(0, values.size, 500 + 1).astype(int)
    for start, stop in itertools.pairwise(edges):
        bucket = values[start:stop]
        kept = values[keep[(keep >= start) & (keep < stop)]]
        assert kept.max() == bucket.max() and kept.min() == bucket.min()


def test_non_finite_values_are_kept_not_averaged_away() -> None:
    values = np.linspace(0.0, 1.0, 10_000)
    values[4_242] = np.nan
    values[9_000] = np.inf
    keep = downsample_indices(values, 100)
    assert len(keep) <= 100
    assert 4_242 in keep and 9_000 in keep
    finite_kept = values[keep][np.isfinite(values[keep])]
    assert finite_kept.max() == 1.0 and finite_kept.min() == 0.0


def test_all_nan_bucket() -> None:
    values = np.full(1000, np.nan)
    keep = downsample_indices(values, 10)
    assert keep.size == 3 and np.all(np.isnan(values[keep]))


def test_never_more_than_max_points_even_at_two_with_a_nan() -> None:
    """At max_points=2 (the least the route takes) a NaN made one bucket of three: min, max
    and the NaN. The NaN is kept, and the first extreme beside it."""
    values = np.linspace(1.0, 0.01, 100)
    values[40] = np.nan
    for max_points in (2, 3, 4, 5, 6):
        keep = downsample_indices(values, max_points)
        assert 0 < len(keep) <= max_points and 40 in keep, (max_points, keep)
        assert np.all(np.diff(keep) > 0)
    assert downsample_indices(values, 2).tolist() == [0, 40]
