"""The `local` host: the remote package runs in this process, on a daemon thread.

A daemon thread rather than the event loop's executor: if a tmux server hangs past the request timeout, drover
reports the timeout and exits instead of waiting for the stuck thread.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from drover.errors import TransportError, from_helper
from drover.remote import caller
from drover.remote import main as helper
from drover.remote import protocol as P


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class LocalTransport:
    def __init__(self, host: str = "local", profiles: dict[str, Any] | None = None) -> None:
        self.host = host
        self.profiles = profiles or {}
        self.warnings: list[str] = []

    async def call(self, op: str, args: dict[str, Any], *, timeout: float) -> Any:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        request = {"helper": P.PROTOCOL, "op": op, "args": args, "profiles": self.profiles}

        abandoned = threading.Event()

        def run() -> None:
            caller.abandon_with(abandoned)  # a wait on this thread ends when nobody awaits it any more
            try:
                result, error = helper.handle(request), None
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting coroutine
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, fut, result, error)
            except RuntimeError:
                pass  # the loop is gone: nobody is waiting any more

        threading.Thread(target=run, name=f"drover-helper-{op}", daemon=True).start()
        try:
            answer = await asyncio.wait_for(fut, timeout)
        except asyncio.CancelledError:
            abandoned.set()  # the caller went away (Ctrl-C, a daemon's client gone): a wait stops within a slice
            raise
        except TimeoutError:
            abandoned.set()
            raise TransportError(
                f"the helper did not answer {op} within {timeout:g}s", host=self.host, code=P.REQUEST_TIMEOUT
            ) from None
        if not answer.get("ok"):
            raise from_helper(answer.get("error") or {}, self.host)
        return answer.get("data")

    async def close(self) -> None:
        return None
