"""The permission class a Codex session runs in, for --as-owner: the owner's own words declare it, so they are
read as what the owner would type there, not as a message from a prompting stranger.

Codex's own words for running without asking: `--dangerously-bypass-approvals-and-sandbox` (`--yolo`) writes
approval_policy "never" with the danger-full-access sandbox into each turn's context in the rollout.
"""

import json
import os
from typing import Any, Dict, Optional, Tuple

from . import procs
from .codex import Session, records

BYPASS_FLAGS = ("--dangerously-bypass-approvals-and-sandbox", "--yolo")
TAIL_BYTES = 1 << 20


def _latest_turn_context(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if b'"turn_context"' not in line:
            continue
        try:
            row = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("type") == "turn_context" and isinstance(row.get("payload"), dict):
            return row["payload"]
    return None


def permission_class(session: Session) -> Tuple[str, Optional[str], Optional[str]]:
    """('bypass' | 'prompting', the policy seen, where it was seen) for a Codex session, for --as-owner.

    The rollout's latest turn context is authoritative (it follows /approvals); before the first turn, the TUI's
    command line.  Anything short of "never ask, no sandbox" is prompting."""
    found = records(session) if session.get("thread") else []
    context = _latest_turn_context(found[-1]) if found else None
    if context is not None:
        sandbox = context.get("sandbox_policy")
        kind = sandbox.get("type") if isinstance(sandbox, dict) else sandbox
        seen = "approval_policy=%s sandbox=%s" % (context.get("approval_policy"), kind)
        bypass = context.get("approval_policy") == "never" and kind == "danger-full-access"
        return ("bypass" if bypass else "prompting"), seen, "rollout"
    argv = procs.argv_of(int(session.get("engine_pid") or 0)) or []
    flags = [a for a in argv if a in BYPASS_FLAGS]
    if flags:
        return "bypass", flags[0], "command line"
    return "prompting", None, None
