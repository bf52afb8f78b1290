"""Command adapters: `adapter:NAME`, a local program that takes a message for a gateway or tool drover does not
speak natively (a `[adapters.NAME]` of the fleet, drover/fleet_adapters.py).

One attempt runs the command on this machine -- an argv list, never a string through a shell -- in a process group
of its own, with the text on stdin (UTF-8) and the message in its environment: DROVER_MESSAGE_ID (the same id on
every retry, so an idempotent adapter can tell a repeat), DROVER_ACTOR, DROVER_TARGET (`adapter:NAME`) and
DROVER_ATTEMPT (1, then 2, ... for each retry).  Its exit status is the outcome:

    0                delivered (verified: the adapter's own word)
    3                held (for its human), as drover's own exit code for held
    4                refused, as drover's own exit code for refused
    anything else    failed, and `drover retry ID` runs it again
    a signal         failed, the signal named; it may have acted first (indeterminate)
    its timeout      its whole process group killed; failed, indeterminate

Its stdout is kept in the record (the first STDOUT_MAX bytes, marked truncated beyond) as the receiver's reply:
data, marked `untrusted`, never parsed.  Its stderr's last line goes in the detail.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import signal
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from drover import adapter_runs
from drover.bots.untrusted import visible
from drover.fleet_adapters import AdapterConfig
from drover.ops.core import Context
from drover.ops.outcome import DecidedThenCancelled, Outcome
from drover.remote import protocol as P
from drover.remote.text import neutralise

LANE = "adapter"
EXIT_HELD = 3
EXIT_REFUSED = 4
STDOUT_MAX = 64 << 10  # what the record keeps of a reply: a reply is a line or a page, not a stream
STDERR_TAIL = 8 << 10  # enough of stderr's end to hold its last line
DETAIL_MAX = 300  # stderr's last line as the detail shows it
# After the adapter exited, how long its pipes may stay open (a process it started holding them) before drover
# stops reading: the outcome is the exit status, not whatever a straggler still writes.
PIPE_GRACE_S = 2.0
CHUNK = 64 << 10
KILL_WAIT_S = 5.0  # how long a SIGKILLed adapter may take to be reaped
PR_SET_PDEATHSIG = 1  # linux/prctl.h
EXIT_POLL_S = 0.02  # how often its exit is looked for (the child watcher has no awaitable for the exit alone)


async def deliver(ctx: Context, name: str, *, msg_id: str, text: str, actor: str, attempt: int) -> Outcome:
    """One run of the adapter; every failure of the adapter's is an outcome, never an exception."""
    cfg: AdapterConfig = ctx.fleet.adapters[name]
    home = ctx.truth.home
    attempt = adapter_runs.next_attempt(home, msg_id, attempt)
    env = {
        **os.environ,
        **cfg.env,
        "DROVER_MESSAGE_ID": msg_id,
        "DROVER_ACTOR": actor,
        "DROVER_TARGET": f"adapter:{name}",
        "DROVER_ATTEMPT": str(attempt),
    }
    missing = _missing(name, cfg, env)
    if missing:
        return _outcome(P.FAILED, P.ADAPTER_MISSING, missing)
    cwd = str(Path(cfg.cwd).expanduser()) if cfg.cwd else None
    # Counted before it starts: a drover killed while it runs leaves no outcome, and the next run must not be "1".
    adapter_runs.write(home, msg_id, {"attempt": attempt, "name": name})
    making = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            _program(cfg, env),
            *cfg.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,  # its own session and process group: a timeout kills all it started
            preexec_fn=_die_with_parent(os.getpid()),
        )
    )
    try:
        # Never cancelled half-made: asyncio's own clean-up of a process cancelled while it sets up its pipes kills
        # the process alone and then waits for those pipes to close (Python 3.11), which what the adapter started
        # holds open: drover hung there for ever.  A cancel waits for it to be made, then kills its whole group.
        proc = await asyncio.shield(making)
    except asyncio.CancelledError:
        with contextlib.suppress(OSError):
            await _end(await making, [])
        raise
    except OSError as exc:  # not executable, a bad interpreter line, ...: it never ran
        why = f"adapter {name!r} could not be started: {cfg.command}: {exc.strerror or exc}"
        return _outcome(P.FAILED, P.ADAPTER_MISSING, f"{why} (fix [adapters.{name}] in fleet.toml)")
    adapter_runs.write(home, msg_id, {"attempt": attempt, "name": name, "pid": proc.pid, "start": adapter_runs.started(proc.pid)})
    # `--timeout` given to this command stands for the entry's own, as it does for a host's request_timeout.
    return await _run(proc, name, ctx.timeout_s or cfg.timeout, _encode(text))


def busy(ctx: Context, msg_id: str) -> str | None:
    """Why a retry must not start the adapter now: an earlier run of it (by a drover since killed) still lives."""
    state = adapter_runs.running(ctx.truth.home, msg_id)
    if state is None:
        return None
    return (
        f"attempt {state.get('attempt')} of adapter {state.get('name')!r} is still running (pid {state['pid']}) and "
        "may still be delivering it; it is killed at its timeout only if the drover that started it lives: retry "
        "when it has exited"
    )


def _die_with_parent(parent: int) -> Any:
    """On Linux, the adapter gets SIGKILL when drover dies (prctl PR_SET_PDEATHSIG): a drover killed -9 leaves no
    adapter running past its timeout.  Only the adapter itself: what it started lives on (the limit of the call)."""
    if not sys.platform.startswith("linux"):
        return None

    def arm() -> None:
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # drover died before the call took hold
            os._exit(1)

    return arm


def _program(cfg: AdapterConfig, env: dict[str, str]) -> str:
    if "/" in cfg.command:
        return str(Path(cfg.command).expanduser())
    return shutil.which(cfg.command, path=env.get("PATH")) or cfg.command


def _missing(name: str, cfg: AdapterConfig, env: dict[str, str]) -> str | None:
    """Why the adapter cannot run at all (no such command, no such directory), said before anything starts."""
    fix = f"fix [adapters.{name}] in fleet.toml"
    if cfg.cwd and not Path(cfg.cwd).expanduser().is_dir():
        return f"adapter {name!r}: its cwd {cfg.cwd!r} is not a directory ({fix})"
    program = _program(cfg, env)
    if "/" not in program:
        return f"adapter {name!r}: command {cfg.command!r} is not on PATH ({fix}: a path, or a name on PATH)"
    if not Path(program).is_file():
        return f"adapter {name!r}: command {cfg.command!r} does not exist ({fix})"
    if not os.access(program, os.X_OK):
        return f"adapter {name!r}: command {cfg.command!r} is not executable (chmod +x it, or {fix})"
    return None


def _encode(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: the bytes they stood for (argv), else a replacement character
        try:
            return text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return text.encode("utf-8", "replace")


async def _run(proc: asyncio.subprocess.Process, name: str, timeout: float, data: bytes) -> Outcome:
    stdout = _Kept(STDOUT_MAX, head=True)
    stderr = _Kept(STDERR_TAIL, head=False)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    # Written beside the reading: an adapter that answers before it has read everything never deadlocks drover.
    pipes = [
        asyncio.ensure_future(_feed(proc.stdin, data)),
        asyncio.ensure_future(stdout.read(proc.stdout)),
        asyncio.ensure_future(stderr.read(proc.stderr)),
    ]
    timed_out = False
    try:
        if not await _exited(proc, timeout):
            timed_out = True
            _kill_group(proc)
            await _exited(proc, KILL_WAIT_S)
    except BaseException:  # Ctrl-C, SIGTERM or a cancelled send: nothing of the adapter's is left running
        await _end(proc, pipes)
        raise
    # It has exited (or was killed at its timeout): the outcome is decided, and the last of its pipes only adds
    # to the reply.  Stopped now, drover records that outcome, not `interrupted` (a retry would run it again).
    try:
        _done, pending = await asyncio.wait(pipes, timeout=PIPE_GRACE_S)
    except asyncio.CancelledError:
        _kill_group(proc)  # what it left in its group goes with drover, as on any cancel
        _stop_reading(proc, pipes)
        raise DecidedThenCancelled(_decided(proc, name, timeout, timed_out, stdout, stderr)) from None
    if pending:
        _stop_reading(proc, pending)
    return _decided(proc, name, timeout, timed_out, stdout, stderr)


async def _end(proc: asyncio.subprocess.Process, pipes: Sequence[asyncio.Future[Any]]) -> None:
    """Its whole group killed, and it reaped and its pipes at their end before drover goes on (a loop closed over
    them warns, and leaks)."""
    _kill_group(proc)
    with contextlib.suppress(BaseException):
        await _exited(proc, KILL_WAIT_S)
        if pipes:
            await asyncio.wait(pipes, timeout=PIPE_GRACE_S)
    _stop_reading(proc, pipes)


def _stop_reading(proc: asyncio.subprocess.Process, pipes: Iterable[asyncio.Future[Any]]) -> None:
    _close(proc)
    for task in pipes:
        task.cancel()


def _decided(
    proc: asyncio.subprocess.Process, name: str, timeout: float, timed_out: bool, stdout: _Kept, stderr: _Kept
) -> Outcome:
    """The outcome of an adapter that has exited: its exit status, its stdout as the reply."""
    code = proc.returncode
    if code is None:  # not even SIGKILL ended it in KILL_WAIT_S (a process stuck in the kernel): said as a timeout
        code = -signal.SIGKILL
    reply: dict[str, Any] = {"exit": code} if code >= 0 else {"signal": _signal_name(-code)}
    reply.update(stdout=stdout.text(), untrusted=True)
    if stdout.truncated:
        reply.update(stdout_truncated=True, stdout_bytes=stdout.total)
    tail = stderr.last_line()
    # The adapter's words, not drover's: quoted and marked in the detail, and kept apart in `stderr_tail` (under
    # the reply's `untrusted`), so that no reader takes a line the adapter wrote for drover's account of it.
    said = f"; stderr (the adapter's, untrusted): {json.dumps(tail, ensure_ascii=False)}" if tail else ""
    if tail:
        reply["stderr_tail"] = tail
    if timed_out:
        why = f"adapter {name!r} ran past its timeout of {timeout:g}s and was killed with its process group"
        return _outcome(P.FAILED, P.ADAPTER_TIMEOUT, why + said + _may_have(), reply, indeterminate=True)
    if code < 0:
        why = f"adapter {name!r} was killed by {_signal_name(-code)}"
        return _outcome(P.FAILED, P.ADAPTER_CRASHED, why + said + _may_have(), reply, indeterminate=True)
    if code == 0:
        took = f"adapter {name!r} took it (exit 0){said}"
        reply = {"verification": "the adapter's own word: it exited 0", **reply}
        return _outcome(P.DELIVERED, None, took, reply, verified=True)
    if code == EXIT_HELD:
        return _outcome(P.HELD, P.HELD, f"adapter {name!r} holds it for its human (exit 3){said}", reply)
    if code == EXIT_REFUSED:
        return _outcome(P.REFUSED, P.ADAPTER_REFUSED, f"adapter {name!r} refused it (exit 4){said}", reply)
    why = f"adapter {name!r} failed (exit {code}){said}; `drover retry ID` runs it again with the same message id"
    return _outcome(P.FAILED, P.ADAPTER_FAILED, why, reply)


def _may_have() -> str:
    return "; it may have acted on the message first: `drover retry ID` runs it again under the same id"


def _outcome(outcome: str, code: str | None, detail: str, extra: dict[str, Any] | None = None, **flags: bool) -> Outcome:
    members: dict[str, Any] = {"outcome": outcome, "lane": LANE}
    if code:
        members["code"] = code
    members["detail"] = detail
    members.update(flags)
    members.update(extra or {})
    return Outcome.of(members)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


async def _exited(proc: asyncio.subprocess.Process, seconds: float) -> bool:
    """Whether the adapter itself exited within `seconds`.  Not `proc.wait()`: that also waits for its pipes to
    close, which a process it started outside its group (`setsid`) can hold open for as long as it lives."""
    deadline = asyncio.get_running_loop().time() + seconds
    while proc.returncode is None:
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(EXIT_POLL_S)
    return True


def _close(proc: asyncio.subprocess.Process) -> None:
    # A process it left behind still holds a pipe: closed here, in the loop, so nothing is left for the loop's end
    # to complain about (a traceback at exit).  asyncio's Process has no public handle on its transport.
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # Its own group (start_new_session): its pid is the group's id, and what it started is in the group too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _feed(pipe: asyncio.StreamWriter, data: bytes) -> None:
    try:
        pipe.write(data)
        await pipe.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # it exited (or closed stdin) without reading it all: its exit status says what it did
    finally:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            pipe.close()


class _Kept:
    """One pipe read to its end, keeping its first (head) or last bytes up to a bound: the rest is only counted."""

    def __init__(self, limit: int, head: bool) -> None:
        self.limit, self.head = limit, head
        self.kept = bytearray()
        self.total = 0

    async def read(self, pipe: asyncio.StreamReader) -> None:
        while chunk := await pipe.read(CHUNK):
            self.total += len(chunk)
            if self.head:
                room = self.limit - len(self.kept)
                if room > 0:
                    self.kept += chunk[:room]
            else:
                self.kept = (self.kept + chunk)[-self.limit :]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.kept)

    def text(self) -> str:
        return bytes(self.kept).decode("utf-8", "replace")

    def last_line(self) -> str:
        lines = [line.strip() for line in self.text().splitlines() if line.strip()]
        if not lines:
            return ""
        line = visible(neutralise(lines[-1]))  # bidi and zero-width characters shown, as in a bot's reply
        return line if len(line) <= DETAIL_MAX else line[: DETAIL_MAX - 1] + "…"
