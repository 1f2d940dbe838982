"""ccselect.hours.Window: a job's time range (issue 63), from hour keys, the CLI's `--hours`, a
scheduled run's last hours, or a start and a number of periods."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from ccselect.hours import HOUR_MS, Window, hour_start_ms, hours_between, parse_hours, window_before


def test_hour_keys_both_included():
    w = Window.hours("2026-11-01T22", "2026-11-02T01")
    assert (w.lo, w.hi, w.name) == ("2026-11-01T22", "2026-11-02T01", "2026-11-01T22..2026-11-02T01")
    assert list(w) == hours_between("2026-11-01T22", "2026-11-02T01") == [
        "2026-11-01T22", "2026-11-01T23", "2026-11-02T00", "2026-11-02T01"]
    assert (w.start_ms, w.end_ms) == (hour_start_ms("2026-11-01T22"), hour_start_ms("2026-11-02T02"))
    assert Window.hours("2026-11-01T05") == Window.hours("2026-11-01T05", "2026-11-01T05")
    assert Window.hours("2026-11-01T05").end_ms - Window.hours("2026-11-01T05").start_ms == HOUR_MS


@pytest.mark.parametrize("spec", ["2026-11-01T05", "2026-11-01T00..2026-11-01T05"])
def test_the_cli_spec_means_what_parse_hours_meant(spec):
    w = Window.parse(spec)
    assert (w.lo, w.hi) == parse_hours(spec)
    assert Window.parse(None) is None and Window.parse("") is None


@pytest.mark.parametrize("bad", ["2026-11-01T05..2026-11-01T04", "2026-11-01", "2026-11-01T05..x"])
def test_a_bad_range_is_refused(bad):
    with pytest.raises(ValueError):
        Window.parse(bad)
    with pytest.raises(ValueError):
        Window(5, 5)


def test_before_a_scheduled_time():
    ts = datetime(2026, 11, 2, 0, 0, tzinfo=timezone.utc)
    w = Window.before(ts, 24)
    assert (w.lo, w.hi) == window_before(ts, 24) == ("2026-11-01T00", "2026-11-01T23")


def test_periods_from_a_start_move_back_to_the_period_start():
    h = hour_start_ms("2026-11-01T10")
    w = Window.from_periods(h + 17 * 60_000, 3, 30)          # 10:17 lies in the 10:00 period
    assert (w.start_ms, w.end_ms) == (h, h + 90 * 60_000)
    assert w.periods(30) == [h, h + 30 * 60_000, h + 60 * 60_000]
    assert (w.lo, w.hi) == ("2026-11-01T10", "2026-11-01T11")
    assert len(Window.hours("2026-11-01T00", "2026-11-01T05").periods(30)) == 12
    with pytest.raises(ValueError, match="whole 30-minute periods"):
        Window(h + 60_000, h + 31 * 60_000).periods(30)


def test_a_window_is_a_value():
    w = Window.hours("2026-11-01T00", "2026-11-01T05")
    assert w == Window.parse("2026-11-01T00..2026-11-01T05") and len({w, Window.hours("2026-11-01T00", "2026-11-01T05")}) == 1
    with pytest.raises(AttributeError):
        w.start_ms = 0
