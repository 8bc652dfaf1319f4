"""A series' summary as the runs list shows and sorts it: the value at its highest step, and its
least and greatest finite values, kept in its ``series`` row as frames are stored (see
:mod:`~trainvitals.server.storage.schema`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from typing_extensions import TypedDict


class SummaryColumns(TypedDict):
    """A ``series`` row's summary columns (see :meth:`Summary.columns`)."""

    last_step: int
    last_value: float | None
    #: ``nan``, ``inf`` or ``-inf`` when the last value is not finite (then ``last_value``
    #: is NULL); else NULL.
    last_nonfinite: str | None
    min_value: float | None
    max_value: float | None


@dataclass(frozen=True)
class Summary:
    """``last``: the value at ``last_step``, the highest step (of points at one step, the last
    sent), NaN and ±Inf as they are; ``low`` and ``high``: the least and greatest finite values,
    None when there is none."""

    last_step: int
    last: float
    low: float | None
    high: float | None

    def then(self, later: Summary) -> Summary:
        """This summary and that of points sent after it, as one."""
        newer = later if later.last_step >= self.last_step else self
        return Summary(
            newer.last_step,
            newer.last,
            _pick(min, self.low, later.low),
            _pick(max, self.high, later.high),
        )

    def columns(self) -> SummaryColumns:
        """The ``series`` row's summary columns."""
        finite = math.isfinite(self.last)
        return SummaryColumns(
            last_step=self.last_step,
            last_value=self.last if finite else None,
            last_nonfinite=None if finite else repr(self.last),
            min_value=self.low,
            max_value=self.high,
        )


def summarize(steps: np.ndarray, values: np.ndarray) -> Summary | None:
    """The summary of points (``steps`` int64, ``values`` float64, as sent); None when empty."""
    if steps.size == 0:
        return None
    return summary_at(values, *last_point(steps))


def last_point(steps: np.ndarray) -> tuple[int, int]:
    """The highest of (non-empty) ``steps``, and the index of its last point: series that share
    their steps share these."""
    top = int(steps.max())
    # Steps come in order: most often the very last.
    return top, steps.size - 1 if steps[-1] == top else int(np.flatnonzero(steps == top)[-1])


def summary_at(values: np.ndarray, top: int, at: int) -> Summary:
    """The summary of (non-empty) ``values`` whose last point, at step ``top``, is ``at``."""
    low, high = values.min(), values.max()  # two passes, and no copy unless one is not finite
    if not (math.isfinite(low) and math.isfinite(high)):
        finite = values[np.isfinite(values)]
        low, high = (finite.min(), finite.max()) if finite.size else (None, None)
    return Summary(
        top,
        float(values[at]),
        None if low is None else float(low),
        None if high is None else float(high),
    )


def _pick(choose: Any, a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else choose(a, b)
