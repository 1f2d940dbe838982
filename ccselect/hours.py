"""The hour, the system's main key: every node-hour file, bronze and silver partition, hourly
run and table window is named by a UTC hour written `YYYY-MM-DDTHH` (`2026-11-01T05`)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

HOUR_FMT = "%Y-%m-%dT%H"
#: the same format in Spark's datetime patterns
SPARK_HOUR_FMT = "yyyy-MM-dd'T'HH"


def parse_hour(hour: str) -> datetime:
    """The start of `hour` as an aware UTC datetime; raises ValueError on a malformed hour."""
    return datetime.strptime(hour, HOUR_FMT).replace(tzinfo=timezone.utc)


def hour_of(ts: datetime) -> str:
    return ts.astimezone(timezone.utc).strftime(HOUR_FMT)


def hour_of_ms(ms: int) -> str:
    """The UTC hour an epoch-milliseconds timestamp falls in."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime(HOUR_FMT)


def hour_start_ms(hour: str) -> int:
    return int(parse_hour(hour).timestamp() * 1000)


def hour_shift(hour: str, hours: int) -> str:
    """`hour` moved by `hours` (negative: earlier)."""
    return (parse_hour(hour) + timedelta(hours=hours)).strftime(HOUR_FMT)


def parse_hours(spec: str | None) -> tuple[str, str] | None:
    """`2026-11-01T05` (one hour) or `2026-11-01T00..2026-11-01T05` (inclusive range)."""
    if not spec:
        return None
    lo, _, hi = spec.partition("..")
    hi = hi or lo
    for h in (lo, hi):
        parse_hour(h)
    if hi < lo:
        raise ValueError(f"empty hour range {spec!r}")
    return lo, hi


def hours_between(lo: str, hi: str) -> list[str]:
    """Every hour from `lo` to `hi`, both included."""
    t, end = parse_hour(lo), parse_hour(hi)
    out = []
    while t <= end:
        out.append(t.strftime(HOUR_FMT))
        t += timedelta(hours=1)
    return out


def window_before(ts: datetime, hours: int) -> tuple[str, str]:
    """The `hours` whole hours that end at `ts` (exclusive): e.g. a daily run at 00:00 trains on
    the previous day."""
    end = ts.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
    return hour_of(end - timedelta(hours=hours)), hour_of(end - timedelta(hours=1))


def previous_hour(ts: datetime) -> str:
    """The whole hour that ends at (or before) `ts`: an hourly run at 06:00 works on 05:00–06:00."""
    end = ts.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
    return hour_of(end - timedelta(hours=1))
