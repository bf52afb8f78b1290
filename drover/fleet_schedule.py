"""How the fleet file writes time: durations ("90s", "15m", "1h30m") and quiet hours ("22:00-07:00"), for the
[[nudge]] schedules and every bounded number of seconds (drover.fleet validates with these)."""

from __future__ import annotations

import re

# The longest duration any key of the fleet may hold: a year and a day.  Longer ones overflow the clock arithmetic
# of whatever uses them (a `[[nudge]] every = "999999999999d"` made every `drover nudge run` crash).
MAX_DURATION_S = 366 * 86400.0

DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms])")
DURATION_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
QUIET_HOURS = re.compile(r"^\s*([01]?\d|2[0-3]):([0-5]\d)\s*-\s*([01]?\d|2[0-3]):([0-5]\d)\s*\Z")


def duration_s(value: str) -> float:
    """Seconds in a duration such as "90s", "15m", "1h", "1d" or "1h30m" (ValueError otherwise)."""
    text = value.strip().lower()
    parts = DURATION_PART.findall(text)
    if not parts or DURATION_PART.sub("", text).strip():
        raise ValueError(f"{value!r} is not a duration: write it like 30s, 15m, 1h, 1d or 1h30m")
    seconds = sum(float(n) * DURATION_UNITS[unit] for n, unit in parts)
    if seconds <= 0:
        raise ValueError(f"{value!r} is no time at all: give a duration above zero")
    if not seconds <= MAX_DURATION_S:  # also inf, from a number too long for a float
        raise ValueError(f"{value!r} is longer than drover takes: at most 366d")
    return seconds


def quiet_minutes(value: str) -> tuple[int, int]:
    """ "22:00-07:00" as minutes after midnight (start, end); the span may cross midnight."""
    m = QUIET_HOURS.match(value)
    if not m:
        raise ValueError(f"{value!r} is not a span of hours: write it like 22:00-07:00 (24-hour clock, local time)")
    start, end = int(m[1]) * 60 + int(m[2]), int(m[3]) * 60 + int(m[4])
    if start == end:
        raise ValueError(f"{value!r} starts where it ends: is that never, or all day? Leave quiet_hours out for never")
    return start, end
