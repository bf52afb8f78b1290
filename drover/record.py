"""The record's shape: what a well-formed event is, the message folded from its events, and what a read skipped.

Pure data and parsing, no file access: `drover/truth.py` reads and writes the file and uses these.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

VERSION = 1
log = logging.getLogger("drover.truth")


def now_iso(ts: float | None = None) -> str:
    ts = time.time() if ts is None else ts
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}Z"


# -- events: what a well-formed line is ---------------------------------------------------------------------------
def _number(value: Any) -> bool:
    if value.__class__ is float:
        return math.isfinite(value)
    if value.__class__ is int:  # not bool: its class is bool
        return -(1 << 62) < value < (1 << 62)
    return False


# Exact types, as JSON decodes them; checked with map() and a set, not a loop in Python: an index build checks
# every line of the file.
_STR_OR_NONE_TYPES = {str, type(None)}
_DICT_OR_NONE = (dict, type(None))
ACCEPTED_STR = ("time", "actor", "host", "target", "text", "text_sha256")
OUTCOME_STR = ("time", "lane", "detail", "code", "redirected_from")


def well_formed(ev: Any) -> bool:
    """Is this parsed line an event drover can use?  Every event is an object with a string `event` and a finite
    number `ts`; accepted and outcome events also need a string `id` and the right types for what readers use."""
    if ev.__class__ is not dict or not _number(ev.get("ts")):
        return False
    kind = ev.get("event")
    if kind == "accepted":
        chars = ev.get("text_chars")
        return (
            ev.get("id").__class__ is str
            and set(map(type, map(ev.get, ACCEPTED_STR))) <= _STR_OR_NONE_TYPES
            and (chars is None or chars.__class__ is int)
            and isinstance(ev.get("options"), _DICT_OR_NONE)
        )
    if kind == "outcome":
        return (
            ev.get("id").__class__ is str
            and ev.get("outcome").__class__ is str
            and set(map(type, map(ev.get, OUTCOME_STR))) <= _STR_OR_NONE_TYPES
            and isinstance(ev.get("session"), _DICT_OR_NONE)
        )
    return kind.__class__ is str  # another kind of event (from a newer drover): no reader here uses it


_decode = json.JSONDecoder().decode


def parse(raw: bytes) -> dict[str, Any] | None:
    """One line -> the event, or None when it is not a well-formed event."""
    try:
        ev = _decode(raw.decode("utf-8", "surrogatepass"))  # as json.loads does for bytes, without the sniffing
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested beyond reason
        return None
    return ev if well_formed(ev) else None


def may_have_arrived(ev: dict[str, Any]) -> bool:
    """Whether an outcome says the text may have reached the receiver (a later refusal does not undo that)."""
    return bool(ev.get("indeterminate") or ev.get("pasted") or ev.get("outcome") in ("delivered", "queuedBehindTurn", "held"))


@dataclass
class ReadStats:
    """What a read skipped.  `skipped` counts lines that were not well-formed events (torn by a crash, or not
    written by drover); `warning()` turns the count into the one warning a caller reports."""

    path: str = ""
    skipped: int = 0

    def warning(self) -> dict[str, Any] | None:
        if not self.skipped:
            return None
        n = self.skipped
        return {
            "code": "truth_lines_skipped",
            "message": f"skipped {n} malformed line{'s' if n != 1 else ''} in {self.path} "
            "(a write torn by a crash, or lines drover did not write)",
            "count": n,
            "path": self.path,
        }

    def warnings(self) -> list[dict[str, Any]]:
        """The warning as a list (empty when nothing was skipped), also logged once on the `drover.truth` logger."""
        w = self.warning()
        if w is None:
            return []
        log.warning("drover: warning: %s", w["message"])
        return [w]


# An outcome's members that are the receiver's words (drover/adapters.py): kept as the message's `reply`.
REPLY_KEYS = ("exit", "signal", "stdout", "stdout_truncated", "stdout_bytes", "stderr_tail", "untrusted")


@dataclass
class Message:
    """A message folded from its events: what was asked and what became of it."""

    id: str
    time: str
    ts: float
    actor: str
    host: str
    target: str
    text: str
    text_chars: int
    options: dict[str, Any] = field(default_factory=dict)
    outcome: str | None = None
    lane: str | None = None
    detail: str | None = None
    code: str | None = None
    outcome_time: str | None = None
    session: dict[str, Any] | None = None
    redirected_from: str | None = None
    verified: bool | None = None  # the receiver's own record shows it (None: drover never looked)
    verification: str | None = None  # how drover knows, or why it cannot
    indeterminate: bool | None = None  # drover cannot know whether it arrived
    pasted: bool | None = None  # the text reached a pane's input box (refused after the paste)
    uncertain: bool = False  # some attempt may have reached the receiver, or the send itself left no outcome
    # What the receiver answered in words (an adapter's stdout): data, marked untrusted, never instructions.  Only
    # a message that has one shows the member.
    reply: dict[str, Any] | None = None

    @property
    def pending(self) -> bool:
        return self.outcome is None

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        if out["reply"] is None:
            del out["reply"]
        out["pending"] = self.pending
        return out

    @classmethod
    def accepted(cls, ev: dict[str, Any]) -> Message:
        """From a well-formed accepted event."""
        text = ev.get("text") or ""
        return cls(
            id=ev["id"],
            time=ev.get("time") or now_iso(float(ev["ts"])),
            ts=float(ev["ts"]),
            actor=ev.get("actor") or "",
            host=ev.get("host") or "",
            target=ev.get("target") or "",
            text=text,
            text_chars=ev["text_chars"] if ev.get("text_chars") is not None else len(text),
            options=dict(ev.get("options") or {}),
        )

    def apply(self, ev: dict[str, Any]) -> Message:
        """Fold a well-formed outcome event in."""
        self.outcome = ev["outcome"]
        self.lane = ev.get("lane")
        self.detail = ev.get("detail")
        self.code = ev.get("code")
        self.outcome_time = ev.get("time")
        self.session = ev.get("session")
        self.redirected_from = ev.get("redirected_from")
        self.verified = ev.get("verified")
        self.verification = ev.get("verification")
        self.indeterminate = ev.get("indeterminate")
        self.pasted = ev.get("pasted")
        self.reply = {k: ev[k] for k in REPLY_KEYS if k in ev} if "stdout" in ev else None
        return self


@dataclass
class Query:
    """The answer of `TruthFile.query`: the newest matching messages, oldest first."""

    messages: list[Message]
    total: int  # matching messages counted; all of them when `complete`, else a lower bound
    complete: bool  # every matching message was counted (the scan reached the start of the file or the window)
    stats: ReadStats


ID_TIME = re.compile(r"^msg_([0-9a-f]{1,12})")
ACCEPTED_PREFIX = f'{{"v":{VERSION},"event":"accepted","id":"'.encode()  # how drover starts an accepted line
PLAIN_ID = re.compile(rb'([A-Za-z0-9_]{1,64})",')
PLAIN_VALUE = re.compile(r"[A-Za-z0-9_.:@%+=,~ -]+")


def id_time_range(prefix: str) -> tuple[float, float] | None:
    """The accept times (seconds) that ids starting with `prefix` can have, from the millisecond clock in them."""
    m = ID_TIME.match(prefix)
    if not m:
        return None
    digits = m.group(1)
    shift = 4 * (12 - len(digits))
    value = int(digits, 16)
    return (value << shift) / 1000.0, ((value + 1) << shift) / 1000.0


# -- a session's spellings: finding its messages by any name it had ---------------------------------------------
# What `options.session` holds: the resolved session, named every way a user may type it.
SESSION_KEYS = ("identity", "id", "name", "pane", "pid", "server", "engine", "target", "thread")
# A session id by its prefix (what `drover ls` shows): 8 or more hex digits, as the host's resolve has it.
ID_PREFIX = re.compile(r"^[0-9a-f]{8}[0-9a-f-]*$")


def session_of(resolved: dict[str, Any]) -> dict[str, Any]:
    """`options.session` from a host's resolve answer ({session, identity, pin, ...}): the session's identity and
    every spelling of it the answer gives.  A pane session's id is its pane."""
    found = resolved.get("session")
    session: dict[str, Any] = found if isinstance(found, dict) else {}
    out: dict[str, Any] = {"identity": resolved.get("identity")}
    for key in SESSION_KEYS[1:]:
        value = session.get(key)
        if isinstance(value, (str, int)) and value.__class__ is not bool and value != "":
            out[key] = value
    if "pane" not in out and isinstance(out.get("id"), str) and out["id"].startswith("%"):
        out["pane"] = out["id"]
    return {k: v for k, v in out.items() if v is not None}


def _strip_host(value: str) -> str:
    """`HOST:REF` as drover writes `addressed` and `redirected_from` -> REF."""
    return value.split(":", 1)[1] if ":" in value else value


def _add_session(names: set[str], ids: set[str], session: Any) -> None:
    """The spellings of one recorded session (options.session, or an outcome's session brief)."""
    if not isinstance(session, dict):
        return
    server = session.get("server") if isinstance(session.get("server"), str) else None
    for key in ("identity", "id", "name", "pane", "pid", "target", "thread"):
        value = session.get(key)
        if value.__class__ is int:
            value = str(value)
        if not isinstance(value, str) or not value:
            continue
        names.add(value)
        if server and (key in ("pane", "target") or (key == "id" and value.startswith("%"))):
            names.add(f"{server}/{value}")  # as a pin spells a pane: SERVER/%3
        if (key == "id" and not value.startswith("%")) or key == "thread":  # a Codex pane's thread is an id too
            ids.add(value)
        if key == "identity":
            _add_identity(names, ids, value)


def _add_identity(names: set[str], ids: set[str], identity: str) -> None:
    """claude:ID / codex:ID -> the id (prefixable); tmux:SERVER/%N@PID -> SERVER/%N."""
    kind, _, rest = identity.partition(":")
    if not rest:
        return
    if kind in ("claude", "codex"):
        names.add(rest)
        ids.add(rest)
    elif kind == "tmux":
        where = rest.rsplit("@", 1)[0]
        names.add(where)


def spellings(acc: dict[str, Any], out: dict[str, Any] | None = None) -> tuple[set[str], set[str]]:
    """Every name a message's session answers to, from its accepted event (`acc`) and its latest outcome (`out`):
    (names, matched exactly; ids, matched also by a prefix of 8+ hex characters).

    From the accepted event: the target as it was addressed, `options.session` (what its resolution gave), and
    what older records hold (`options.identity`, `pin`, a nudge's `addressed`, a handoff's `redirected_from`);
    from the outcome: the session it names.  Only ids a resolution gave are prefixable: a target typed to look
    like an id is matched only as it was typed."""
    names: set[str] = set()
    ids: set[str] = set()
    target = acc.get("target")
    if isinstance(target, str) and target:
        names.add(target)
    options = acc.get("options")
    if isinstance(options, dict):
        _add_session(names, ids, options.get("session"))
        for key in ("identity", "pin", "addressed", "redirected_from"):
            value = options.get(key)
            if not isinstance(value, str) or not value:
                continue
            if key == "identity":
                names.add(value)
                _add_identity(names, ids, value)
            elif key == "pin":
                names.add(value)
            else:
                names.add(_strip_host(value))
    if isinstance(out, dict):
        _add_session(names, ids, out.get("session"))
    return names, ids


def names_match(query: str, names: set[str], ids: set[str]) -> bool:
    """Does `query` (what the user typed, without its HOST:) name a session with these spellings?  Exactly, or
    as a prefix (8+ hex characters) of one of its ids."""
    if query in names:
        return True
    return bool(ID_PREFIX.match(query)) and any(i.startswith(query) for i in ids)


def message_matches(query: str, m: Message) -> bool:
    """`names_match` over a folded message (its accepted fields and its latest outcome's session)."""
    acc = {"target": m.target, "options": m.options}
    return names_match(query, *spellings(acc, {"session": m.session}))


def spawn_matches(query: str, row: dict[str, Any]) -> bool:
    """`names_match` over a spawn folded from its events (drover/ops/spawn.py `fold`): the name it was asked for
    and the session it became (id, name, pane, pid, identity)."""
    names: set[str] = set()
    ids: set[str] = set()
    _add_session(names, ids, row)
    return names_match(query, names, ids)
