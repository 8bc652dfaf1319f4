"""Numbers as people read them in an alert."""

from __future__ import annotations

import math


def size(n: float) -> str:
    """Bytes: ``size(3.2 * 2**30) == '3.2 GiB'``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def duration(seconds: float) -> str:
    """``duration(400) == 'about 7 min'``; short spans in seconds."""
    if not math.isfinite(seconds):
        return "never"
    if seconds < 90:
        return f"{max(0.0, seconds):.0f} s"
    if seconds < 90 * 60:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds / 3600:.1f} h"


def number(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else ("NaN" if math.isnan(x) else "Inf")


def ratio(x: float) -> str:
    """How many times: ``ratio(4.23) == '4.2x'``, ``ratio(37.4) == '37x'``; far from 1 in
    scientific notation, ``ratio(1.5438e17) == '1.5e17x'``, not eighteen digits."""
    if not math.isfinite(x):
        return f"{number(x)}x"
    if x == 0 or 0.01 <= abs(x) < 10_000:
        return f"{x:.1f}x" if abs(x) < 10 else f"{x:.0f}x"
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{int(exponent)}x"


def listing(items: list[str]) -> str:
    """``listing(['a', 'b', 'c']) == 'a, b and c'``."""
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]
