"""A helper on an SSH channel: the answer's framing, a long-lived helper process, and waits that really end.

Split from ssh.py (the connection and its requests): these pieces know nothing of hosts or the fleet.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncssh

from drover.remote import protocol as P
from drover.transport import bundle

T = TypeVar("T")


async def bounded(work: Awaitable[T], seconds: float, on_timeout: Callable[[], None] | None = None) -> T:
    """`work`, or TimeoutError after `seconds` -- and then really after: unlike asyncio.wait_for, this does not wait
    for the cancelled work to finish cleaning up (closing a channel to a host that stopped answering never does).
    `on_timeout` (aborting the connection) runs first, so the abandoned work ends soon on its own."""
    task = asyncio.ensure_future(work)
    try:
        done, _pending = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:  # the caller is gone (Ctrl-C): so is the work, and nobody reads its failure
        task.cancel()
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        raise
    if task in done:
        return task.result()
    if on_timeout is not None:
        on_timeout()
    task.cancel()
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # never "exception was never retrieved"
    await asyncio.wait({task}, timeout=0.5)
    raise TimeoutError


def read_answer(stdout: bytes) -> tuple[dict[str, Any] | None, bytes]:
    """(the framed answer, the noise before it): login-shell output can precede the answer but not corrupt it.

    The helper's answer is the last complete frame that is a helper answer; anything an rc file printed that
    merely looks like a frame comes before it and is noise."""
    at = len(stdout)
    while True:
        at = stdout.rfind(P.ANSWER_MARK, 0, at)
        if at < 0:
            return None, stdout
        head, _, rest = stdout[at + len(P.ANSWER_MARK) :].partition(b"\n")
        try:
            length = int(head)
            answer = json.loads(rest[:length]) if len(rest) >= length else None
        except ValueError:
            answer = None
        if isinstance(answer, dict) and "helper" in answer and "ok" in answer:
            return answer, stdout[:at]


def take_answer(buffer: bytes) -> tuple[dict[str, Any] | None, bytes, bytes]:
    """(the framed answer, the noise before it, what follows it) from a long-lived helper's output so far.

    As read_answer, the last complete frame that is a helper answer wins: only one request is out per helper, so
    anything before it (an rc file's output, a fake frame) is noise."""
    answer, noise = read_answer(buffer)
    if answer is None:
        return None, buffer, b""
    at = len(noise)
    head, _, rest = buffer[at + len(P.ANSWER_MARK) :].partition(b"\n")
    rest = rest[int(head) :]
    return answer, noise, rest[1:] if rest.startswith(b"\n") else rest


class HelperGone(Exception):
    """A long-lived helper's output ended before its answer: the process exited (or the channel closed)."""


class Helper:
    """One helper process kept running on a host (persistent mode): the bundle is sent once, then one request line
    at a time, each answered with one frame.  A helper serves one request at a time."""

    def __init__(self, process: asyncssh.SSHClientProcess[bytes]) -> None:
        self.process = process
        self.buffer = b""
        self.answered = 0

    @classmethod
    async def start(cls, conn: asyncssh.SSHClientConnection, command: str) -> Helper:
        process = await conn.create_process(command, encoding=None, x11_forwarding=False)
        process.stdin.write(bundle.preamble())
        return cls(process)

    async def ask(self, request: bytes) -> tuple[dict[str, Any], bytes]:
        """The answer to one request line, and the noise before it (a login shell's, on the first answer)."""
        try:
            self.process.stdin.write(request)
        except (BrokenPipeError, ConnectionResetError, asyncssh.Error):
            pass  # gone already: reading says so
        while True:
            answer, noise, rest = take_answer(self.buffer)
            if answer is not None:
                self.buffer = rest
                self.answered += 1
                return answer, noise
            chunk = await self.process.stdout.read(1 << 16)
            if not chunk:
                raise HelperGone
            self.buffer += chunk

    async def ended(self) -> Ran:
        """How a helper that stopped answering ended (bounded: a channel that never closes is 'still running')."""
        try:
            done = await bounded(self.process.wait(check=False), 2)
        except TimeoutError:
            return Ran(self.buffer, b"", None, False)
        err = done.stderr if isinstance(done.stderr, bytes) else b""
        return Ran(self.buffer, err, done.exit_status, done.exit_signal is not None)

    def close(self) -> None:
        self.process.close()

    async def shut(self) -> None:
        """Close it and wait (briefly) until its channel has closed: the process on the host has ended or is ending."""
        self.process.close()
        try:
            await bounded(self.process.wait_closed(), 2)
        except (TimeoutError, asyncssh.Error, OSError):
            pass  # a host that stopped answering: the connection's own timeout deals with it


@dataclass
class Ran:
    """What came back from the remote command."""

    stdout: bytes
    stderr: bytes
    status: int | None
    signalled: bool
