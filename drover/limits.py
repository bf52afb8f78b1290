"""Limits at the sender, counted from the truth file so that they hold across drover processes.

Each is a clear, recorded refusal: a message over the size cap, a burst beyond the per-target token bucket,
or the identical text to the same target within the duplicate window.  The numbers match what Claude Code's
own inbox enforces per sender, so drover refuses before the receiver would drop.

The events come from `TruthFile.recent`, which reads only the tail of the file inside `window_s` (backwards from
the end) and hands over well-formed events only; `check` still treats every field as untrusted.
"""

from __future__ import annotations

import math
from typing import Any

from drover.fleet import Limits
from drover.truth import text_digest

# Outcomes that mean the message never went anywhere: they spend no token and can't be duplicated.
NOT_SENT = {"refused", "failed"}
MAX_WINDOW_S = 3600.0


def window_s(limits: Limits) -> float:
    bucket_window = limits.bucket_size / limits.bucket_refill_per_s if limits.bucket_refill_per_s > 0 else MAX_WINDOW_S
    return min(MAX_WINDOW_S, max(limits.duplicate_window_s, bucket_window))


def _ts(event: dict[str, Any]) -> float | None:
    value = event.get("ts")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value) if math.isfinite(value) else None
    except OverflowError:
        return None


def _key(event: dict[str, Any]) -> Any:
    """What a past message was sent to: the session's identity when it was resolved (`%0`, its name, its pane
    target and an id prefix are one session), else the target as typed."""
    options = event.get("options")
    identity = options.get("identity") if isinstance(options, dict) else None
    return identity or event.get("target")


def check(limits: Limits, host: str, target: str, text: str, now: float, recent: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The refusal outcome for this message, or None if it may go.  `target` is the session's identity."""
    if len(text) > limits.max_chars:
        return {
            "outcome": "refused",
            "code": "too_large",
            "detail": f"the text has {len(text):,} characters, over the limit of {limits.max_chars:,}: split it or send a path",
        }
    # An outcome that may have reached the receiver (indeterminate, or pasted into its box) counts as sent.
    outcomes = {
        e.get("id"): ("sent?" if e.get("indeterminate") or e.get("pasted") else e.get("outcome"))
        for e in recent
        if e.get("event") == "outcome"
    }
    sent = [
        e
        for e in recent
        if e.get("event") == "accepted"
        and e.get("host") == host
        and _key(e) == target
        and _ts(e) is not None
        and outcomes.get(e.get("id")) not in NOT_SENT
    ]
    digest = text_digest(text)
    if limits.duplicate_window_s > 0:
        for e in sent:
            age = now - (_ts(e) or 0.0)
            if e.get("text_sha256") == digest and age < limits.duplicate_window_s:
                return {
                    "outcome": "refused",
                    "code": "duplicate",
                    "detail": f"the same text went to this session ({target}) {age:.0f}s ago as {host}:{e.get('target')} "
                    f"({e.get('id')}); "
                    f"identical texts are refused within {limits.duplicate_window_s:g}s",
                }
    tokens, last = float(limits.bucket_size), None
    for e in sent:
        ts = _ts(e) or 0.0
        if last is not None:
            tokens = min(limits.bucket_size, tokens + (ts - last) * limits.bucket_refill_per_s)
        tokens -= 1
        last = ts
    if last is not None:
        tokens = min(limits.bucket_size, tokens + (now - last) * limits.bucket_refill_per_s)
    if tokens < 1:
        return {
            "outcome": "refused",
            "code": "rate_limited",
            "detail": f"too many messages to {host}:{target}: at most {limits.bucket_size} in a burst, "
            f"then {limits.bucket_refill_per_s:g} a second; try again shortly",
        }
    return None
