"""A bot's reply, later: `POST /drover/reply?bot=NAME` signed with that bot's secret per Standard Webhooks.

`receive` decides one callback from its raw bytes and headers, and records it either way:

- accepted: a `chat` event {bot, in_reply_to, text, untrusted: true, webhook_id} -- the reply is data, never a
  command, and everything that shows it says so;
- refused (answered 4xx): a `callback_refused` event with the reason and a bounded excerpt of the body.

In order: a bot the fleet has (`unknown_bot`), the three headers (`missing_headers`; a webhook-id of plain
characters, `bad_webhook_id`), the signature over the raw
bytes (`bad_signature`: computed by the `standardwebhooks` package, compared in constant time), the timestamp
within `[webhook] tolerance` (`stale_timestamp`, either way), a JSON object with `in_reply_to` and `text`
(`bad_body`), `in_reply_to` naming a message drover sent (or may have sent) to that bot -- not one its
limits refused, nor one that never left (`unknown_message`), and a webhook-id not
already accepted (`replayed`).  The replay check reads the record's last `tolerance` seconds under the record's
lock (drover/lifecycle.py record_once), so it survives a restart and two listeners at once: an older replay fails
the timestamp, and the signature covers the timestamp, so it cannot be refreshed.

`serve` runs the listener in the foreground (stdlib http.server, a thread per request), one bounded log line per
request on the stream it is given.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import http.server
import json
import re
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import IO, Any

from standardwebhooks.webhooks import Webhook

from drover import lifecycle
from drover.fleet import Fleet
from drover.record import VERSION, now_iso
from drover.remote import protocol as P
from drover.remote.text import neutralise
from drover.truth import TruthFile

PATH = "/drover/reply"
MAX_BODY = 1 << 20  # a reply is text for a person or a session, not a file transfer
EXCERPT = 200  # what a refused callback keeps of its body
SLACK_S = 60.0  # the replay window reaches this much past the tolerance (clocks, the record's order)
MESSAGE_ID = re.compile(r"^msg_[0-9a-f]{12,}\Z")
WEBHOOK_ID = re.compile(r"^[A-Za-z0-9_.:+/=-]{1,200}\Z")


def new_chat_id() -> str:
    return f"chat_{int(time.time() * 1000):012x}{secrets.token_hex(5)}"


def _short(value: Any, n: int = EXCERPT) -> str:
    return neutralise(str(value))[:n]


def _signed(secret: str, msg_id: str, stamp: int, body: str, given: str) -> bool:
    """Does any `v1,...` of the webhook-signature header match?  The expected one is the package's own `sign`."""
    expected = base64.b64decode(Webhook(secret).sign(msg_id, datetime.fromtimestamp(stamp, tz=UTC), body).split(",", 1)[1])
    for part in given.split():
        version, _, sig = part.partition(",")
        if version != "v1":
            continue
        try:
            if hmac.compare_digest(expected, base64.b64decode(sig, validate=True)):
                return True
        except (binascii.Error, ValueError):
            continue
    return False


class Refused(Exception):
    def __init__(self, status: int, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.reason, self.detail = status, reason, detail


def _verify(fleet: Fleet, bot: str | None, headers: dict[str, str], raw: bytes, now: float) -> tuple[str, dict[str, Any]]:
    """(webhook-id, the reply's JSON object) of a callback that is what it says, else Refused."""
    if not bot or bot not in fleet.bots:
        raise Refused(404, "unknown_bot", f"no bot {_short(bot, 64)!r} in the fleet (the callback URL names it: ?bot=NAME)")
    wid, stamp, sig = (headers.get(h, "") for h in ("webhook-id", "webhook-timestamp", "webhook-signature"))
    if not (wid and stamp and sig):
        raise Refused(400, "missing_headers", "webhook-id, webhook-timestamp and webhook-signature are all required")
    if not WEBHOOK_ID.match(wid):
        # Written as it is in the record, so the replay check finds it by its bytes (no JSON escapes).
        raise Refused(400, "bad_webhook_id", f"webhook-id {_short(wid, 64)!r} must be 1-200 of A-Z a-z 0-9 _ . : + / = -")
    if not stamp.isdigit() or len(stamp) > 12:
        raise Refused(400, "bad_signature", f"webhook-timestamp {_short(stamp, 32)!r} is not whole seconds")
    try:
        secret = fleet.bots[bot].resolved_secret()
    except ValueError as exc:
        raise Refused(503, "no_secret", str(exc)) from None
    try:
        body = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused(400, "bad_body", "the body is not UTF-8") from None
    if not _signed(secret, wid, int(stamp), body, sig):
        raise Refused(401, "bad_signature", f"no webhook-signature matches the body with bot {bot}'s secret")
    tolerance = fleet.webhook.tolerance
    if abs(now - int(stamp)) > tolerance:
        ahead = int(stamp) - now  # negative: in the past
        when = f"{-ahead:.0f}s in the past" if ahead < 0 else f"{ahead:.0f}s in the future"
        raise Refused(400, "stale_timestamp", f"webhook-timestamp is {when} (tolerance {tolerance:g}s)")
    try:
        reply = json.loads(body)
    except ValueError:
        raise Refused(400, "bad_body", "the body is not JSON") from None
    if not isinstance(reply, dict) or not isinstance(reply.get("in_reply_to"), str) or not isinstance(reply.get("text"), str):
        raise Refused(400, "bad_body", 'the body must be a JSON object with "in_reply_to" (a message id) and "text"')
    return wid, reply


# Outcomes that say no request left drover: a reply "to" such a message answers something the bot never got.
NEVER_SENT = frozenset({P.DUPLICATE, P.RATE_LIMITED, P.TOO_LARGE, P.BOT_SECRET, P.UNKNOWN_ENDPOINT, P.BOT_DISABLED_UNSENT})


def _sent_to(truth: TruthFile, msg_id: str, bot: str) -> bool:
    """Did drover send (or may it have sent) this message to this bot?  A message still without an outcome counts:
    a quick bot answers from inside the request, before drover has written what its answer meant."""
    if not MESSAGE_ID.match(msg_id):
        return False
    hits, _count, _stats = truth.find(msg_id)
    if not hits or hits[0].id != msg_id or hits[0].host != "bot" or hits[0].target != bot:
        return False
    m = hits[0]
    unsent = m.outcome is not None and (m.code in NEVER_SENT or (m.code == P.BOT_UNREACHABLE and not m.indeterminate))
    return not unsent or m.uncertain


class RefusalBudget:
    """At most `limit` refusals of one reason recorded per `window` seconds; the rest of that window are counted
    and recorded as one summary (a `callback_refused` with `suppressed`: the count) when the reason's next window
    opens, or the listener stops.  Anyone can send refusals: without this the record grows as fast as they send."""

    def __init__(self, limit: int = 20, window: float = 60.0, clock: Callable[[], float] = time.time) -> None:
        self.limit, self.window, self.clock = limit, window, clock
        self._lock = threading.Lock()
        self._open: dict[str, tuple[float, int, int]] = {}  # reason -> (window start, recorded, suppressed)

    def _summary(self, reason: str, start: float, suppressed: int) -> dict[str, Any]:
        return {
            **_refusal_head(self.clock(), reason),
            "suppressed": suppressed,
            "detail": f"{suppressed} more {reason} refusals from {now_iso(start)} not recorded one by one "
            f"(at most {self.limit} per {self.window:g}s are)",
        }

    def admit(self, reason: str) -> tuple[bool, list[dict[str, Any]]]:
        """(record this refusal?, summaries now due)"""
        now = self.clock()
        with self._lock:
            start, recorded, suppressed = self._open.get(reason, (now, 0, 0))
            due = []
            if now - start >= self.window:
                if suppressed:
                    due.append(self._summary(reason, start, suppressed))
                start, recorded, suppressed = now, 0, 0
            keep = recorded < self.limit
            self._open[reason] = (start, recorded + keep, suppressed + (not keep))
            return keep, due

    def flush(self) -> list[dict[str, Any]]:
        with self._lock:
            due = [self._summary(r, start, n) for r, (start, _rec, n) in self._open.items() if n]
            self._open.clear()
            return due


DEFAULT_BUDGET = RefusalBudget()


def _refusal_head(ts: float, reason: str) -> dict[str, Any]:
    # One shape for a refusal and for a budget's summary of those it did not record one by one.
    return {"v": VERSION, "event": "callback_refused", "time": now_iso(ts), "ts": ts, "reason": reason}


def record_refusal(truth: TruthFile, budget: RefusalBudget, event: dict[str, Any]) -> None:
    keep, due = budget.admit(str(event["reason"]))
    for ev in [*due, *([event] if keep else [])]:
        try:
            truth.append(ev)
        except Exception:  # noqa: BLE001 - the answer stays a refusal whatever the record could take
            pass


def _refused_event(
    bot: str | None, headers: dict[str, str], raw: bytes, exc: Refused, remote: str, size: int | None = None
) -> dict[str, Any]:
    return {
        **_refusal_head(time.time(), exc.reason),
        "bot": _short(bot, 64) if bot else None,
        "detail": exc.detail,
        "webhook_id": _short(headers.get("webhook-id", ""), 100) or None,
        "remote": remote,
        "body_chars": len(raw) if size is None else size,
        "excerpt": _short(raw[: EXCERPT * 4].decode("utf-8", "replace")),
    }


def receive(
    fleet: Fleet,
    truth: TruthFile,
    bot: str | None,
    headers: dict[str, str],
    raw: bytes,
    remote: str = "",
    budget: RefusalBudget = DEFAULT_BUDGET,
) -> tuple[int, dict[str, Any]]:
    """Decide and record one callback: (HTTP status, the JSON answer).  Never raises for what the caller sent."""
    headers = {k.lower(): v for k, v in headers.items()}
    now = time.time()
    try:
        wid, reply = _verify(fleet, bot, headers, raw, now)
        assert bot is not None
        in_reply_to = reply["in_reply_to"]
        if not _sent_to(truth, in_reply_to, bot):
            raise Refused(422, "unknown_message", f"drover sent no message {_short(in_reply_to, 64)!r} to bot {bot}")
        chat = {
            "v": VERSION,
            "event": "chat",
            "id": new_chat_id(),
            "time": now_iso(now),
            "ts": now,
            "bot": bot,
            "in_reply_to": in_reply_to,
            "text": reply["text"],
            "untrusted": True,
            "webhook_id": wid,
        }
        # Under the record's lock: of two deliveries of one webhook-id (a replay, a listener beside another), one
        # is written and the other finds it.
        since = now - fleet.webhook.tolerance - SLACK_S
        stands, written = lifecycle.record_once(truth, chat, f"chat:{bot}:{wid}", since_ts=since)
        if not written:
            raise Refused(409, "replayed", f"webhook-id {_short(wid, 100)!r} was accepted already, as {stands.get('id')}")
        return 200, {"ok": True, "id": chat["id"]}
    except Refused as exc:
        record_refusal(truth, budget, _refused_event(bot, headers, raw, exc, remote))
        return exc.status, {"ok": False, "reason": exc.reason, "detail": exc.detail}


def make_server(
    fleet: Fleet, truth: TruthFile, addr: str, port: int, log: Callable[[str], None], budget: RefusalBudget | None = None
) -> http.server.ThreadingHTTPServer:
    refusals = budget or RefusalBudget()

    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "drover-webhook"
        sys_version = ""
        timeout = 30  # a client that stops sending mid-request gives its thread back

        def _answer(self, status: int, doc: dict[str, Any]) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            log(f"{self.client_address[0]} {self.command} {_short(self.path, 120)} {status} {doc.get('reason') or doc.get('id')}")

        def do_POST(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            if url.path != PATH:
                self._answer(404, {"ok": False, "reason": "not_found", "detail": f"POST replies to {PATH}?bot=NAME"})
                return
            try:
                size = int(self.headers.get("content-length") or "-1")
            except ValueError:
                size = -1
            names = urllib.parse.parse_qs(url.query).get("bot") or []
            bot = names[0] if len(names) == 1 else None
            headers = {k.lower(): v for k, v in self.headers.items()}
            if not 0 <= size <= MAX_BODY:
                exc = Refused(413, "too_large", f"a content-length up to {MAX_BODY} is required")
                # Recorded as any refusal, bounded: the body is not read, so the excerpt is empty.
                record_refusal(truth, refusals, _refused_event(bot, headers, b"", exc, self.client_address[0], size))
                self._answer(exc.status, {"ok": False, "reason": exc.reason, "detail": exc.detail})
                return
            raw = self.rfile.read(size)
            status, doc = receive(fleet, truth, bot, headers, raw, self.client_address[0], refusals)
            self._answer(status, doc)

        def do_GET(self) -> None:
            self._answer(405, {"ok": False, "reason": "method", "detail": f"POST replies to {PATH}?bot=NAME"})

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per request is written by _answer, bounded

    server = http.server.ThreadingHTTPServer((addr, port), Handler)
    server.daemon_threads = True
    server.refusals = refusals  # type: ignore[attr-defined]  # serve writes what it holds back when it stops
    return server


def serve(fleet: Fleet, truth: TruthFile, addr: str, port: int, stream: IO[str], ready: threading.Event | None = None) -> None:
    """Listen until interrupted (Ctrl-C, SIGTERM as the CLI maps it)."""
    lock = threading.Lock()

    def log(line: str) -> None:
        with lock:
            stream.write(f"{now_iso()} {line}\n")
            stream.flush()

    server = make_server(fleet, truth, addr, port, log)
    try:
        host, bound = str(server.server_address[0]), server.server_address[1]
        log(f"listening on {host}:{bound}{PATH} for {len(fleet.bots)} bot(s); replies are recorded as untrusted chat events")
        if ready is not None:
            ready.set()
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        for ev in server.refusals.flush():  # type: ignore[attr-defined]
            try:
                truth.append(ev)
            except Exception:  # noqa: BLE001 - stopping: what cannot be written is the count only
                pass
