"""Reading a captured screen: idle, busy, dialog or unknown, with the line that decided it."""

import re
from typing import Any, Dict, List, Optional


def lines_of(screen: str) -> List[str]:
    return [line.rstrip() for line in screen.replace("\r\n", "\n").split("\n")]


def _search(patterns: List[str], lines: List[str], ignore: str = "") -> Optional[str]:
    """The first line that matches any pattern.

    With `ignore` (the text we just pasted), a match whose matched words occur in that text doesn't count: the
    program may be echoing our own text, wrapped and prefixed in its input box, and our text may quote a dialog.
    """
    for line in lines:
        for pattern in patterns:
            m = re.search(pattern, line)
            if m is None:
                continue
            if ignore and m.group(0).strip() and m.group(0).strip() in ignore:
                continue
            return line
    return None


def classify(screen: str, profile: Dict[str, Any], ignore_text: str = "") -> Dict[str, str]:
    """Read a captured screen: idle, busy, dialog or unknown, with the line that decided it."""
    lines = lines_of(screen)
    nonempty = [line for line in lines if line.strip()]
    if profile.get("dialog_scope") == "last_line":
        scope = nonempty[-1:]
    else:
        scope = lines
    hit = _search(profile.get("dialog", []), scope, ignore_text)
    if hit is not None:
        return {"state": "dialog", "reason": "dialog on screen: %r" % hit.strip()[:120]}
    hit = _search(profile.get("busy", []), lines)
    if hit is not None:
        return {"state": "busy", "reason": "busy: %r" % hit.strip()[:120]}
    hit = _search(profile.get("idle", []), lines)
    if hit is not None:
        return {"state": "idle", "reason": "idle: input prompt %r" % hit.strip()[:120]}
    default = profile.get("default_state", "unknown")
    if default == "idle":
        return {"state": "idle", "reason": "no prompt asking for input"}
    return {"state": default, "reason": "screen not recognised: no idle prompt, no busy or dialog marker"}


def paste_allowed(seen: Dict[str, str], profile: Dict[str, Any]) -> bool:
    """Would the guard let a paste go to a pane classified as `seen`?  (The one rule, for the lane and guard check.)"""
    return seen["state"] == "idle" or (seen["state"] == "busy" and bool(profile.get("queues_when_busy")))


def last_line(screen: str) -> str:
    """The last line that says something (rules and box drawing skipped)."""
    for line in reversed(lines_of(screen)):
        text = line.strip()
        if text and not re.match(r"^[\u2500-\u259f\s]+$", text):
            return text[:200]
    return ""
