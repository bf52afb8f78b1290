"""SIGTERM and SIGHUP as Ctrl-C: the running op is cancelled, its cleanup runs, and drover exits 130.

A `kill`, a closed terminal or a job scheduler's end would otherwise stop drover where it stands: a send with its
request out would record nothing, and an adapter it runs would go on alone.  A KeyboardInterrupt raised from a
signal handler lands in whatever code runs at that instant (a subprocess being spawned, a `finally` half done), so
while an op runs the handler cancels the op's task instead -- the way asyncio handles SIGINT -- and every
`except CancelledError` on the way out records what it must.  Only outside an op (parsing, rendering, a
listener's loop) is it a KeyboardInterrupt.  Why not through SIGINT: a script's background job has SIGINT ignored
(`cmd &`), and SIGTERM must still work there.

`install()` once per process (the CLI's main); `run(coro)` is asyncio.run with the op's task made cancellable.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# The third signal while the first cancellation is still under way ends drover at once, by the signal's default:
# an op whose cleanup hangs must not make drover unkillable but by SIGKILL.
GIVE_UP_AFTER = 3

_op: tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = None
_cancelled_by_signal = False
_count = 0
_registered = False


def install() -> None:
    """Take SIGTERM and SIGHUP, unless the caller ignores one (`nohup`: SIGHUP stays ignored) or this is not the main
    thread (a library user's worker thread: signals are not ours).  Never put back: a second signal arriving
    while drover exits must find the same handler, not the default."""
    global _count, _cancelled_by_signal, _registered
    _count, _cancelled_by_signal = 0, False
    if not _registered:
        # Run before the interpreter's shutdown puts every Python handler back to the default (after atexit).
        atexit.register(exiting)
        _registered = True
    for sig in SIGNALS:
        try:
            current = signal.getsignal(sig)
            if current is signal.SIG_DFL or current is _handle:
                signal.signal(sig, _handle)
        except ValueError:
            return


def exiting() -> None:
    """SIGTERM and SIGHUP ignored from here to the process's end (its answer is given; CPython's shutdown would
    put the default back, and a late signal would turn exit 130 into death by the signal)."""
    for sig in SIGNALS:
        try:
            if signal.getsignal(sig) is _handle:
                signal.signal(sig, signal.SIG_IGN)
        except ValueError:
            return


def _handle(signum: int, frame: Any) -> None:
    global _count, _cancelled_by_signal
    _count += 1
    if _count >= GIVE_UP_AFTER:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _count > 1:
        return  # the first is being handled (the op cancelled, or drover on its way out): it exits 130
    op = _op
    if op is not None and not op[1].done():
        _cancelled_by_signal = True
        loop, task = op
        loop.call_soon_threadsafe(task.cancel)
        return
    raise KeyboardInterrupt


def run(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(coro), whose task SIGTERM/SIGHUP cancel; a run they cancelled ends in KeyboardInterrupt (exit 130),
    as a Ctrl-C does.  Off the main thread (a daemon's request, a library user's worker) plain asyncio.run: signals
    are the main thread's."""
    global _op, _cancelled_by_signal
    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(coro)

    async def main() -> T:
        global _op
        task = asyncio.current_task()
        assert task is not None
        _op = (asyncio.get_running_loop(), task)
        try:
            return await coro
        finally:
            _op = None

    _cancelled_by_signal = False
    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if _cancelled_by_signal:
            raise KeyboardInterrupt from None
        raise
    finally:
        _op = None
