"""How the fleet file writes quiet hours ("22:00-07:00"), for the [[nudge]] schedules (drover.fleet validates with
it).  Durations ("90s", "15m", "1h30m") are drover's one grammar, in drover/paths.py."""

from __future__ import annotations

import re

QUIET_HOURS = re.compile(r"^\s*([01]?\d|2[0-3]):([0-5]\d)\s*-\s*([01]?\d|2[0-3]):([0-5]\d)\s*\Z")


def quiet_minutes(value: str) -> tuple[int, int]:
    """ "22:00-07:00" as minutes after midnight (start, end); the span may cross midnight."""
    m = QUIET_HOURS.match(value)
    if not m:
        raise ValueError(f"{value!r} is not a span of hours: write it like 22:00-07:00 (24-hour clock, local time)")
    start, end = int(m[1]) * 60 + int(m[2]), int(m[3]) * 60 + int(m[4])
    if start == end:
        raise ValueError(f"{value!r} starts where it ends: is that never, or all day? Leave quiet_hours out for never")
    return start, end
