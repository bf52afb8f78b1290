"""Bots' replies in the record (`chat` events, every one marked untrusted): for `drover read bot:NAME`, for the
replies `drover log` shows under the messages they answer, and one by its id (to pass it on, wrapped).

Read backwards from the end; only lines that hold a chat event are parsed, and accepted lines for their time, so
a bound in time (or the count asked for) ends the read."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from drover.record import ACCEPTED_PREFIX
from drover.truth import TruthFile
from drover.truth_query import ORDER_SLACK_S

CHAT = b'"event":"chat"'
CHAT_ID = re.compile(r"^chat_[0-9a-f]{12,}\Z")


def _backward(truth: TruthFile, since_ts: float | None) -> Iterator[dict[str, Any]]:
    cutoff = None if since_ts is None else since_ts - ORDER_SLACK_S

    def skip(raw: bytes) -> bool:
        return CHAT not in raw and (cutoff is None or not raw.startswith(ACCEPTED_PREFIX))

    for ev in truth.backward(skip=skip):
        if ev["event"] == "chat":
            if since_ts is None or ev["ts"] >= since_ts:
                yield ev
        elif cutoff is not None and ev["event"] == "accepted" and ev["ts"] < cutoff:
            return


def shown(ev: dict[str, Any]) -> dict[str, Any]:
    """A chat event as documents show it: always marked untrusted, whatever the line said."""
    keep = ("id", "time", "ts", "bot", "in_reply_to", "text", "webhook_id")
    return {**{k: ev.get(k) for k in keep}, "untrusted": True}


def of_bot(
    truth: TruthFile, bot: str, last: int, since_ts: float | None = None, match: Callable[[str], bool] | None = None
) -> tuple[list[dict[str, Any]], bool]:
    """The bot's newest `last` replies, oldest first, and whether there were more."""
    found: list[dict[str, Any]] = []
    more = False
    for ev in _backward(truth, since_ts):
        if ev.get("bot") != bot or not isinstance(ev.get("text"), str):
            continue
        if match is not None and not match(ev["text"]):
            continue
        if len(found) == last:
            more = True
            break
        found.append(shown(ev))
    found.reverse()
    return found, more


def answering(truth: TruthFile, ids: set[str], since_ts: float) -> list[dict[str, Any]]:
    """The replies to any of these messages (a reply is never older than the message it answers: `since_ts`)."""
    if not ids:
        return []
    out = [shown(ev) for ev in _backward(truth, since_ts) if ev.get("in_reply_to") in ids and isinstance(ev.get("text"), str)]
    out.reverse()
    return out


def one(truth: TruthFile, chat_id: str) -> dict[str, Any] | None:
    if not CHAT_ID.match(chat_id):
        return None
    needle = chat_id.encode()
    for ev in truth.backward(skip=lambda raw: needle not in raw):
        if ev["event"] == "chat" and ev.get("id") == chat_id and isinstance(ev.get("text"), str):
            return shown(ev)
    return None
