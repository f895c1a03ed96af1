"""``format_duration`` writes what ``parse_duration_ms`` reads back, in the largest exact unit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from versiq.durations import format_duration, parse_duration_ms
from versiq.timestamps import human_instant


def test_durations_read_as_people_write_them():
    assert [format_duration(ms) for ms in (604_800_000, 129_600_000, 5_400_000, 15_000, 1500, 0)] == [
        "7d", "36h", "90m", "15s", "1500ms", "0ms"]


@given(st.integers(min_value=0, max_value=10**15))
def test_a_formatted_duration_parses_back(ms):
    assert parse_duration_ms(format_duration(ms)) == ms


def test_instants_for_people_keep_the_number():
    assert human_instant(1_700_000_000_000) == "2023-11-14T22:13:20.000Z (1700000000000)"
