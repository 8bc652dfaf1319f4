"""Series names: one Python module, mirrored by one JS module for the dashboard."""

from __future__ import annotations

import re
from pathlib import Path

from trainvitals import series
from trainvitals.series import gpu, is_system

SERIES_JS = Path(series.__file__).parent / "web" / "series.js"


def _python_names() -> dict[str, str]:
    return {k: v for k, v in vars(series).items() if k.isupper() and isinstance(v, str)}


def test_the_dashboard_knows_every_series_name_by_the_same_name() -> None:
    js = dict(re.findall(r'^export const ([A-Z0-9_]+) = "([^"]*)";$', SERIES_JS.read_text(), re.M))
    assert js == _python_names()


def test_gpu_names_and_system_series() -> None:
    assert gpu(1, series.GPU_MEM_USED) == "gpu1/mem_used"
    assert is_system("host/rss") and is_system(gpu(0, series.GPU_TEMP))
    assert not is_system("gpu_hours") and not is_system("loss")
