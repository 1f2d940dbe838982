"""The hour, the system's main key: every node-hour file, bronze and silver partition, hourly
run and table window is named by a UTC hour written `YYYY-MM-DDTHH` (`2026-11-01T05`)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Iterator

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


HOUR_MS = 3_600_000


@dataclass(frozen=True)
class Window:
    """A job's time range, [start_ms, end_ms) in epoch milliseconds, UTC.

    Every job takes one: the hourly ones read it as the hour keys `lo`..`hi` (both included,
    what `--hours 2026-11-01T00..2026-11-01T05` means), AutoPlex as its periods (`periods`).
    Build one with `Window.hours` (hour keys), `Window.parse` (the CLI's `--hours`),
    `Window.before` (a scheduled run's last whole hours) or `Window.from_periods` (a start and a
    number of periods, the start moved back to its period's start)."""

    start_ms: int
    end_ms: int

    def __post_init__(self) -> None:
        if self.end_ms <= self.start_ms:
            raise ValueError(f"empty window [{self.start_ms}, {self.end_ms})")

    # ---- constructors ---------------------------------------------------------------------------

    @classmethod
    def hours(cls, lo: str, hi: str | None = None) -> "Window":
        """The hours `lo` to `hi` (default `lo`), both included; raises ValueError on a malformed
        hour or `hi` before `lo`."""
        hi = lo if hi is None else hi
        start, last = hour_start_ms(lo), hour_start_ms(hi)
        if last < start:
            raise ValueError(f"empty hour range {lo}..{hi}")
        return cls(start, last + HOUR_MS)

    @classmethod
    def parse(cls, spec: str | None) -> "Window | None":
        """`2026-11-01T05` (one hour) or `2026-11-01T00..2026-11-01T05` (inclusive); None for none."""
        pair = parse_hours(spec)
        return None if pair is None else cls.hours(*pair)

    @classmethod
    def before(cls, ts: datetime, hours: int) -> "Window":
        """The `hours` whole hours that end at `ts` (exclusive), as `window_before`."""
        return cls.hours(*window_before(ts, hours))

    @classmethod
    def from_periods(cls, start_ms: int, periods: int, period_minutes: int) -> "Window":
        """`periods` periods of `period_minutes` from the period `start_ms` lies in."""
        t = period_minutes * 60_000
        start = start_ms - start_ms % t
        return cls(start, start + periods * t)

    # ---- views ----------------------------------------------------------------------------------

    @property
    def lo(self) -> str:
        """The first hour key."""
        return hour_of_ms(self.start_ms)

    @property
    def hi(self) -> str:
        """The last hour key (included)."""
        return hour_of_ms(self.end_ms - 1)

    @property
    def name(self) -> str:
        """`lo..hi`, the key a window-keyed gold write and a model's metadata use."""
        return f"{self.lo}..{self.hi}"

    def __iter__(self) -> Iterator[str]:
        """The hour keys from `lo` to `hi`."""
        return iter(hours_between(self.lo, self.hi))

    def periods(self, period_minutes: int) -> list[int]:
        """The start (ms) of each period of `period_minutes`; raises ValueError unless the window
        is whole periods."""
        t = period_minutes * 60_000
        if self.start_ms % t or (self.end_ms - self.start_ms) % t:
            raise ValueError(f"window [{self.start_ms}, {self.end_ms}) is not whole {period_minutes}-minute periods")
        return list(range(self.start_ms, self.end_ms, t))
