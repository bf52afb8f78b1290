"""`transport = "openssh"` hosts: the helper over the system `ssh`, riding the user's own ControlMaster.

For hosts that ask for a second factor, Kerberos or a hardware key at every login: the person opens one master
(`drover connect HOST`, the code typed by them), and every drover call rides it with no prompt.  The helper is
shipped and spoken to exactly as over asyncssh (drover/transport/ssh.py, whose answer checks this reuses): the
same bundle on stdin, the same framed answers, the same bounds.

Each call is one `ssh` process in its own process group (the daemon keeps one per long-lived helper).  Every
wait is bounded, and at the bound the whole group is killed: a stale master that accepts and never answers
would otherwise hold the call for ever (ConnectTimeout does not cover the control socket).  stderr goes to an
unlinked file rather than a pipe, and the answer is read from stdout up to its frame, never until EOF: a process
that inherited a pipe (a ControlPersist master forked by ssh) could hold it open for hours.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import tempfile
import time
from typing import IO, Any

from drover.errors import DroverError, TransportError
from drover.fleet import Defaults, HostConfig
from drover.remote import protocol as P
from drover.transport import bundle
from drover.transport.helper_channel import HelperGone, bounded, take_answer
from drover.transport.openssh_config import (
    OpenSSHCommand,
    classify,
    die_with_drover,
    host_key_error,
    ssh_env,
    ssh_failed_itself,
)
from drover.transport.openssh_master import HUNG, UP, master_fix, master_state
from drover.transport.ssh import SSHTransport


class SSHProcess:
    """One `ssh` in its own process group: stdin and stdout pipes, stderr an unlinked temporary file."""

    def __init__(self, proc: asyncio.subprocess.Process, errfile: IO[bytes]) -> None:
        self.proc = proc
        self.errfile = errfile
        self.buffer = b""

    @classmethod
    async def start(cls, argv: list[str]) -> SSHProcess:
        errfile = tempfile.TemporaryFile()  # closed with the process
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=errfile,
                start_new_session=True,  # its own group: the bound kills it and whatever it started
                env=ssh_env(),
                preexec_fn=die_with_drover,
            )
        except BaseException:
            errfile.close()
            raise
        return cls(proc, errfile)

    def alive(self) -> bool:
        return self.proc.returncode is None

    async def send(self, data: bytes, *, eof: bool = False) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            stdin.write(data)
            if eof:
                stdin.close()
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # gone already: its exit status and stderr say why

    async def answer(self) -> tuple[dict[str, Any], bytes]:
        """The next framed answer and the noise before it; HelperGone when stdout ends first."""
        stdout = self.proc.stdout
        assert stdout is not None
        while True:
            answer, noise, rest = take_answer(self.buffer)
            if answer is not None:
                self.buffer = rest
                return answer, noise
            chunk = await stdout.read(1 << 16)
            if not chunk:
                raise HelperGone
            self.buffer += chunk

    async def status(self, seconds: float = 2.0) -> int | None:
        """Its exit status once it has exited (None if it has not within `seconds`).  Polled, not awaited:
        asyncio's wait() also waits for every pipe to close, which a grandchild holding one delays for ever."""
        deadline = time.monotonic() + seconds
        while self.proc.returncode is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return self.proc.returncode

    def stderr(self) -> str:
        try:
            self.errfile.seek(0)
            return self.errfile.read(1 << 16).decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""

    def kill(self) -> None:
        """The whole process group, at once (a process already reaped has no group of ours left to kill)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        with contextlib.suppress(OSError, ValueError):
            self.errfile.close()

    async def reap(self) -> None:
        """Kill it and its group -- also when ssh itself has exited: what it left in its group (a ProxyCommand, a
        background child) may hold its pipes -- and let the loop see it go (bounded)."""
        self.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError, DroverError):
            await bounded(self.proc.wait(), 2)
        if self.proc.stdin is not None:
            # Python before 3.11.5 (Debian bookworm's 3.11.2) leaves a broken pipe's BrokenPipeError in a future no
            # one reads, printed at exit as "Future exception was never retrieved": read it here.
            with contextlib.suppress(Exception):
                await bounded(self.proc.stdin.wait_closed(), 1)
        # A pipe something outside the group still holds keeps asyncio's subprocess transport open after the
        # process is gone; closed only when collected, after its loop, it complains on stderr ("Exception ignored
        # in BaseSubprocessTransport.__del__"). asyncio.subprocess.Process offers no close: its transport's is it.
        transport = getattr(self.proc, "_transport", None)
        if transport is not None:
            transport.close()


# The last seconds of a call's bound, in which the master is asked whether it answers (for the timeout's message).
MASTER_CHECK_S = 2.0


class OpenSSHTransport(SSHTransport):
    """The asyncssh transport's contract (and answer checks) over the system ssh.  `helpers` > 0 is persistent
    mode (the daemon's): up to that many ssh processes, each with a live helper, kept and reused."""

    def __init__(
        self,
        host: str,
        cfg: HostConfig,
        defaults: Defaults,
        profiles: dict[str, Any] | None = None,
        helpers: int = 0,
        slots: asyncio.Semaphore | None = None,
    ) -> None:
        super().__init__(host, cfg, defaults, profiles, helpers, slots)
        self.ssh = OpenSSHCommand(host, cfg, self.connect_timeout)
        self._procs: list[SSHProcess] = []  # persistent mode: idle helpers
        self._running: set[SSHProcess] = set()
        self._reaping: set[asyncio.Future[None]] = set()

    @property
    def connected(self) -> bool:
        return any(p.alive() for p in self._procs) or bool(self._running)

    @property
    def idle_helpers(self) -> int:
        return len(self._procs)

    async def _argv(self, seconds: float) -> tuple[list[str], float]:
        """The call's argv, and what is left of its `seconds` after reading the user's config for it."""
        command = self._command()
        # `ssh -G` runs once per transport, off the loop (the daemon's loop serves other hosts meanwhile), within
        # the call's own bound: a `Match exec` runs the user's program, however slow.
        started = time.monotonic()
        await asyncio.to_thread(self.ssh.resolved, seconds)
        return self.ssh.call(command), max(0.5, seconds - (time.monotonic() - started))

    def _request(self, op: str, args: dict[str, Any]) -> bytes:
        return json.dumps({"helper": P.PROTOCOL, "op": op, "args": args, "profiles": self.profiles}).encode() + b"\n"

    async def _start(self, argv: list[str]) -> SSHProcess:
        proc = await SSHProcess.start(argv)
        self._running.add(proc)
        self.connects += 1
        return proc

    def _finish(self, proc: SSHProcess) -> None:
        """Kill it now; its reaping is awaited by whoever closes the transport (or the call that started it)."""
        proc.kill()
        self._running.discard(proc)
        if proc.alive() or proc.proc.stdout is not None:
            reaping = asyncio.ensure_future(proc.reap())
            self._reaping.add(reaping)
            reaping.add_done_callback(self._reaping.discard)

    # -- requests --------------------------------------------------------------------------------------------
    async def call(self, op: str, args: dict[str, Any], *, timeout: float) -> Any:
        if self.helpers:
            return await self._ask_helper(op, args, timeout)
        argv, bound = await self._argv(self.connect_timeout + timeout)
        request = self._request(op, args)
        procs: list[SSHProcess] = []
        watch = self._watch_master(bound)

        async def work() -> tuple[dict[str, Any], bytes]:
            proc = await self._start(argv)
            procs.append(proc)
            await proc.send(bundle.preamble() + request, eof=True)
            return await proc.answer()

        try:
            # The connect happens inside the process: its bound is added to the request's.
            answer, noise = await bounded(work(), bound, on_timeout=lambda: self._kill_all(procs))
            unrecorded = self.ssh.unrecorded(procs[0].stderr())
            if unrecorded is not None:
                raise unrecorded
        except TimeoutError:
            raise await self._timed_out(op, self.connect_timeout + timeout, procs, watch) from None
        except HelperGone:
            raise await self._gone(op, procs[0]) from None
        finally:
            watch.cancel()
            for proc in procs:
                self._running.discard(proc)
                await proc.reap()
        return await self._data(answer, noise)

    def _kill_all(self, procs: list[SSHProcess]) -> None:
        for proc in procs:
            self._finish(proc)

    async def _ask_helper(self, op: str, args: dict[str, Any], timeout: float) -> Any:
        """Persistent mode, as SSHTransport's: one ssh process per helper, bounded, never a request sent twice."""
        assert self._slots is not None
        # As over asyncssh, a persistent request's bound includes its connecting (a helper started first connects
        # through the master: quick): the command's --timeout is the whole bound, as it is in direct mode's two
        # parts -- the daemon's transport, shared by every request, knows the fleet's connect_timeout only.
        full = timeout
        argv, bound = await self._argv(full)
        request = self._request(op, args)
        holder: list[SSHProcess] = []
        kept = False
        watch = self._watch_master(bound)

        async def ask() -> tuple[dict[str, Any], bytes]:
            nonlocal kept
            async with self._slots:  # type: ignore[union-attr]
                helper: SSHProcess | None = None
                while self._procs and helper is None:
                    idle = self._procs.pop()
                    if idle.alive():
                        helper = idle
                    else:
                        self._finish(idle)  # its master went away while it was idle
                if helper is None:
                    helper = await self._start(argv)
                    await helper.send(bundle.preamble())
                holder.append(helper)
                self.busy += 1
                try:
                    await helper.send(request)
                    answer = await helper.answer()
                finally:
                    self.busy -= 1
                unrecorded = self.ssh.unrecorded(helper.stderr())
                if unrecorded is not None:
                    raise unrecorded  # not kept: every later request on it would ride an unpinned key
                if not self.retiring:
                    self._procs.append(helper)
                    kept = True
                return answer

        task = asyncio.ensure_future(ask())
        try:
            answer, noise = await bounded(task, bound, on_timeout=lambda: self._kill_all(holder))
        except asyncio.CancelledError:
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            raise
        except TimeoutError:
            raise await self._timed_out(op, full, holder, watch) from None
        except HelperGone:
            raise await self._gone(op, holder[0]) from None
        finally:
            watch.cancel()
            if not kept:
                self._kill_all(holder)  # failed or cancelled mid-request: its next answer would belong to nobody
        return await self._data(answer, noise)

    # -- what went wrong ---------------------------------------------------------------------------------------
    async def _gone(self, op: str, proc: SSHProcess) -> DroverError:
        """stdout ended before the answer: ssh's own failure (255, and nothing reached the host), or the remote
        command's (the same reasons as over asyncssh)."""
        status = await proc.status()
        stderr = proc.stderr()
        if status == P.EXIT_SSH_FAILED and not proc.buffer and ssh_failed_itself(stderr):
            code = classify(stderr)
            last = stderr.splitlines()[-1] if stderr else "no message"
            if code == P.AUTH_FAILED:
                return self.no_master(last)
            if code in (P.UNKNOWN_HOST_KEY, P.HOST_KEY_CHANGED):
                return host_key_error(self.host, code, stderr, self.ssh.resolved())
            if code is not None:
                return TransportError(f"ssh to {self.ssh.target} failed: {last}", host=self.host, code=code)
            return TransportError(
                f"ssh to {self.ssh.target} failed during {op}: {last} (the request may or may not have arrived)",
                host=self.host,
                code=P.CONNECTION_LOST,
                hint=f"if the OpenSSH master went away, open it again with `drover connect {self.host}`",
            )
        return self._no_answer(op, status, status is not None and status < 0, proc.buffer, stderr)

    def no_master(self, said: str) -> TransportError:
        return TransportError(
            f"no OpenSSH master is up for {self.host}, and ssh cannot log in there without one ({said})",
            host=self.host,
            code=P.NO_MASTER,
            hint=f"open it (once, with your second factor): `drover connect {self.host}`",
        )

    def _watch_master(self, bound: float) -> asyncio.Future[str | None]:
        """The master's state, asked in the call's last seconds: a timeout's diagnosis fits inside its bound (asked
        after it, a stopped master added seconds to a `--timeout` a script relies on).  Cancelled when the call
        ends first."""

        async def late() -> str | None:
            check = min(MASTER_CHECK_S, bound / 2)
            if check < 1:  # too short for ssh -O check on a loaded machine: a healthy master would look hung
                return None
            await asyncio.sleep(bound - check)
            try:
                return await master_state(self.ssh, check * 0.9)
            except DroverError:  # ssh -G cannot say which socket: nothing to blame on a master
                return None

        watch = asyncio.ensure_future(late())
        watch.add_done_callback(lambda t: t.cancelled() or t.exception())
        return watch

    async def _timed_out(
        self, op: str, seconds: float, procs: list[SSHProcess], watch: asyncio.Future[str | None]
    ) -> TransportError:
        """The bound passed: blamed on the master only when it is the master that does not answer (as asked in the
        bound's last seconds); a helper that hung on the host, or a slow connect, is said as such; when the master
        could not be asked in time, neither is blamed."""
        for proc in procs:
            await proc.reap()
        said = f"no answer to {op} through ssh within {seconds:g}s (the request may still complete there)"
        state = watch.result() if watch.done() and not watch.cancelled() and watch.exception() is None else None
        watch.cancel()
        if state is None:
            return TransportError(
                f"{said}: the host or its master did not answer within {seconds:g}s",
                host=self.host,
                code=P.REQUEST_TIMEOUT,
                hint=f"`drover fleet check --host {self.host}` tells which; a larger --timeout for slow hosts",
            )
        if state == HUNG:
            return TransportError(
                f"{said}: the master at {self.ssh.control_socket()} accepts connections but does not answer "
                "(stopped or wedged), and holds every call",
                host=self.host,
                code=P.REQUEST_TIMEOUT,
                hint=master_fix(self.ssh),
            )
        how = "through the master" if state == UP else "with no master (a direct login)"
        return TransportError(
            f"{said}; ssh was connecting {how}: the host or its helper was too slow, or hung",
            host=self.host,
            code=P.REQUEST_TIMEOUT,
            hint=f"`drover fleet check --host {self.host}` shows what answers; a larger --timeout for slow hosts",
        )

    # -- closing -----------------------------------------------------------------------------------------------
    def abort(self) -> None:
        self._kill_all([*self._procs, *self._running])
        self._procs = []

    def close_idle(self) -> None:
        """As over asyncssh: each idle helper ends inside a slot of the shared bound (its stdin closed, then its
        ssh's exit awaited, so the process on the host has ended), and the replacement's requests, whose slots
        come after, never start helpers beside ones still exiting."""
        self.retiring = True
        idle, self._procs = self._procs, []
        if self._slots is None:
            self._kill_all(idle)
            return
        for proc in idle:
            ending = asyncio.ensure_future(self._end_in_slot(proc))
            self._reaping.add(ending)
            ending.add_done_callback(self._reaping.discard)

    async def _end_in_slot(self, proc: SSHProcess) -> None:
        async with self._slots:  # type: ignore[union-attr]
            try:
                await proc.send(b"", eof=True)  # a helper whose stdin ends exits
                await proc.status(2.0)
            finally:
                self._finish(proc)

    async def close(self) -> None:
        procs = [*self._procs, *self._running]
        self._procs = []
        for proc in procs:
            await proc.send(b"", eof=True)  # a helper whose stdin ends exits
        for proc in procs:
            await proc.status(1.0)
            self._finish(proc)
        if self._reaping:
            await asyncio.wait(set(self._reaping), timeout=3)


def transport_class(cfg: HostConfig) -> type[SSHTransport]:
    """The transport a host's fleet entry chooses (asyncssh unless `transport = "openssh"`)."""
    return OpenSSHTransport if cfg.transport == "openssh" else SSHTransport
