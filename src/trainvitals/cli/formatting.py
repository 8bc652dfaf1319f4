"""How the commands print: local times and plain-text tables."""

from __future__ import annotations

import time
from collections.abc import Sequence


def when(seconds: float | None) -> str:
    """A Unix time as the commands show it, local, to the second; ``-`` for none."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) if seconds else "-"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns left-aligned to their widest cell, two spaces apart; the last one unpadded."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    )
