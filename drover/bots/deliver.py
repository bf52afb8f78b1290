"""A message to `bot:NAME`: one Standard Webhooks signed POST (drover/ops/endpoints.py imports this as the seam).

The body is JSON {type, id, actor, text, timestamp, callback}; `webhook-id` is drover's message id, so a retry
(`drover retry`, or the bot's own `retries` here) is the same webhook to the receiver, which dedupes on it.  The
signature comes from the `standardwebhooks` package, never a hand-rolled HMAC.  What the response means:

- 2xx: delivered, verified by the receiver's own answer;
- 410: refused (`bot_disabled`) -- and every later send to that bot is refused without a request
  (`bot_disabled_unsent`: nothing left, so no reply can answer it) until its [bots.NAME] url or
  secret changes (remembered in `bots-disabled.json` beside the record);
- a redirect: refused (`bot_redirect`), naming the Location, never followed (an address nobody configured);
- other 4xx: refused (`bot_refused`);
- 5xx, a timeout, a connection error: failed and retryable; `indeterminate` when the request may have arrived.

Never raises for the receiver's failures: they are outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import socket
import ssl
import threading
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

from standardwebhooks.webhooks import Webhook

from drover.bots.config import BotConfig
from drover.ops.core import Context
from drover.ops.outcome import Outcome
from drover.record import now_iso
from drover.remote import protocol as P
from drover.remote.text import neutralise

LANE = "bot"
DISABLED_FILE = "bots-disabled.json"
EXCERPT = 200  # what of a response body an outcome keeps
BACKOFF_S = (0.5, 2.0, 8.0)  # between the bot's own retries of one send (the last repeats)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect is an answer (refused), never a second request to an address nobody configured


def payload(msg_id: str, actor: str, text: str, callback: str) -> dict[str, Any]:
    return {"type": "message", "id": msg_id, "actor": actor, "text": text, "timestamp": now_iso(), "callback": callback}


def _excerpt(raw: bytes) -> str:
    return neutralise(raw[: EXCERPT * 4].decode("utf-8", "replace"))[:EXCERPT].strip()


WHOLE_GRACE_S = 0.5


def post(url: str, secret: str, msg_id: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One signed POST (blocking); its outcome's members.  The same msg_id is the same webhook-id."""
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    now = datetime.now(tz=UTC)
    headers = {
        "content-type": "application/json",
        "user-agent": "drover-webhook",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, now, data),
    }
    req = urllib.request.Request(url, data=data.encode("utf-8"), headers=headers, method="POST")
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=timeout) as resp:
            status = resp.status
            why = f"the bot's own answer, HTTP {status}"
            return {"outcome": P.DELIVERED, "status": status, "detail": f"HTTP {status}", "verified": True, "verification": why}
    except urllib.error.HTTPError as exc:
        status = exc.code
        said = _excerpt(exc.read() if exc.fp is not None else b"")
        exc.close()
        tail = f": {said}" if said else ""
        if 300 <= status < 400:
            where = neutralise(str(exc.headers.get("Location", "?")))[:EXCERPT]
            why = f"HTTP {status} redirect to {where} not followed; point [bots] url at the final address"
            return {"outcome": P.REFUSED, "code": P.BOT_REDIRECT, "status": status, "detail": why, "location": where}
        if status == 410:
            why = (
                f"HTTP 410: the bot says this endpoint is disabled{tail}; sends to it are refused until its url or secret changes"
            )
            return {"outcome": P.REFUSED, "code": P.BOT_DISABLED, "status": status, "detail": why}
        if status < 500:
            return {"outcome": P.REFUSED, "code": P.BOT_REFUSED, "status": status, "detail": f"HTTP {status}{tail}"}
        return {"outcome": P.FAILED, "code": P.BOT_FAILED, "status": status, "detail": f"HTTP {status}{tail}"}
    except urllib.error.URLError as exc:
        # Raised while connecting or writing the request: refused and unresolvable addresses provably got nothing.
        reason = exc.reason
        sure = isinstance(reason, ConnectionRefusedError | socket.gaierror | ssl.SSLCertVerificationError)
        code = P.BOT_TIMEOUT if isinstance(reason, TimeoutError) else P.BOT_UNREACHABLE
        out: dict[str, Any] = {"outcome": P.FAILED, "code": code, "detail": f"{url}: {neutralise(str(reason))[:EXCERPT]}"}
        if not sure:
            out["indeterminate"] = True
        return out
    except (TimeoutError, http.client.HTTPException, OSError) as exc:
        # After the request was written: it may have arrived (a retry sends the same webhook-id, which dedupes).
        code = P.BOT_TIMEOUT if isinstance(exc, TimeoutError) else P.BOT_UNREACHABLE
        what = f"no answer in {timeout:g}s" if isinstance(exc, TimeoutError) else neutralise(str(exc) or type(exc).__name__)
        return {"outcome": P.FAILED, "code": code, "indeterminate": True, "detail": f"{url}: {what[:EXCERPT]}"}


async def _post_within(url: str, secret: str, msg_id: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    """`post` with `timeout` for the whole of it, in a thread drover does not wait for when it is cancelled.

    urllib's timeout bounds each read, so a bot that drips its answer a byte at a time would hold the send for as
    long as it likes; and `asyncio.to_thread`'s pool is joined when the loop ends, so a Ctrl-C or SIGTERM during a
    POST would wait out that POST.  A daemon thread is neither: abandoned, it ends with the process."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[dict[str, Any]] = loop.create_future()

    def settle(result: dict[str, Any] | None, exc: BaseException | None) -> None:
        if done.done():
            return
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(result or {})

    def work() -> None:
        try:
            result, exc = post(url, secret, msg_id, body, timeout), None
        except BaseException as error:  # noqa: BLE001 - handed to the awaiting side, which raises it
            result, exc = None, error
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits for this answer any more
            loop.call_soon_threadsafe(settle, result, exc)

    threading.Thread(target=work, name="drover-bot-post", daemon=True).start()
    try:
        # A little past the socket's own timeout, so that a bot that says nothing is that timeout's "no answer".
        return await asyncio.wait_for(done, timeout + WHOLE_GRACE_S)
    except TimeoutError:
        why = f"{url}: no whole answer in {timeout:g}s (it sent some, slowly)"
        return {"outcome": P.FAILED, "code": P.BOT_TIMEOUT, "indeterminate": True, "detail": why}


# -- a 410 remembered ----------------------------------------------------------------------------------------------
def _disabled_path(ctx: Context) -> str:
    return os.path.join(os.path.dirname(str(ctx.truth.path)), DISABLED_FILE)


def disabled(ctx: Context) -> dict[str, Any]:
    try:
        with open(_disabled_path(ctx), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _remember_disabled(ctx: Context, name: str, bot: BotConfig, msg_id: str) -> None:
    """Atomic replace; a lost write only means the next send asks the bot again (and gets its 410 again)."""
    data = disabled(ctx)
    data[name] = {"fingerprint": bot.fingerprint(), "since": now_iso(), "id": msg_id}
    target = _disabled_path(ctx)
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, target)
    except OSError:
        pass


async def deliver(ctx: Context, name: str, *, msg_id: str, text: str, actor: str, attempt: int) -> Outcome:
    from drover.ops import endpoints  # the seam's module imports this one lazily; the check is its own

    endpoints.check(ctx.fleet, "bot", name)  # a retry after the bot left the fleet: unknown_endpoint, recorded
    bot = ctx.fleet.bots[name]
    base: dict[str, Any] = {"lane": LANE, "bot": name, "webhook_id": msg_id}
    try:
        secret = bot.resolved_secret()
    except ValueError as exc:
        return Outcome.of({"outcome": P.FAILED, **base, "code": P.BOT_SECRET, "detail": f"bot {name}: {exc}; nothing was sent"})
    gone = disabled(ctx).get(name)
    if isinstance(gone, dict) and gone.get("fingerprint") == bot.fingerprint():
        why = (
            f"bot {name} answered 410 (disabled) at {gone.get('since')} to {gone.get('id')}: nothing was sent; "
            f"change its [bots.{name}] url or secret once it is enabled again"
        )
        return Outcome.of({"outcome": P.REFUSED, **base, "code": P.BOT_DISABLED_UNSENT, "detail": why})
    body = payload(msg_id, actor, text, ctx.fleet.webhook.callback(name))
    tries = 0
    while True:
        tries += 1
        # `--timeout` given to this command stands for the entry's own, as it does for a host's request_timeout.
        got = await _post_within(bot.url, secret, msg_id, body, ctx.timeout_s or bot.timeout)
        if got["outcome"] != P.FAILED or tries > bot.retries:
            break
        await asyncio.sleep(BACKOFF_S[min(tries - 1, len(BACKOFF_S) - 1)])
    if got.get("code") == P.BOT_DISABLED:
        _remember_disabled(ctx, name, bot, msg_id)
    outcome = {"outcome": got.pop("outcome"), **base, **got, "tries": tries, "attempt_no": attempt}
    outcome["detail"] = f"bot {name}: {outcome.get('detail', '')}" + (f" (after {tries} tries)" if tries > 1 else "")
    return Outcome.of(outcome)
