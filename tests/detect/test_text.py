"""How alert messages write numbers, sizes, durations and lists."""

from __future__ import annotations

import math

import pytest

from trainvitals.detect.text import duration, listing, number, ratio, size


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (3.2 * 2**30, "3.2 GiB"),
        (5 * 2**40, "5 TiB"),
        (512 * 2**20, "512 MiB"),
        (1536, "1.5 KiB"),
        (100, "100 B"),
    ],
)
def test_sizes_in_binary_units(n: float, text: str) -> None:
    assert size(n) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-3, "0 s"),
        (42, "42 s"),
        (400, "about 7 min"),
        (3 * 3600, "about 3.0 h"),
        (math.inf, "never"),
    ],
)
def test_durations_round_to_what_a_person_reads(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_numbers_and_non_finite_values() -> None:
    assert [number(x) for x in (0.000123456, 1234567.0, math.nan, -math.inf)] == [
        "0.000123",
        "1.23e+06",
        "NaN",
        "Inf",
    ]


def test_listing() -> None:
    assert [listing([]), listing(["a"]), listing(["a", "b", "c"])] == ["", "a", "a, b and c"]


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (4.23, "4.2x"),
        (37.4, "37x"),
        (9999.0, "9999x"),
        (154382015388604832.0, "1.5e17x"),  # was "154382015388604832.0x"
        (3e4, "3e4x"),
        (1.2e-5, "1.2e-5x"),
        (0.5, "0.5x"),
        (math.inf, "Infx"),
    ],
)
def test_ratios_far_from_one_in_scientific_notation(x: float, text: str) -> None:
    assert ratio(x) == text
