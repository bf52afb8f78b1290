"""SSH hosts: asyncssh, one connection per host per invocation, the helper shipped over the channel.

- The user's OpenSSH setup is honoured: asyncssh reads ~/.ssh/config (Host aliases, HostName, Port, User,
  IdentityFile, ProxyJump, HostKeyAlias) and uses the ssh-agent; the fleet's per-host settings go on top.
- Every step has a timeout: asyncssh has no connect timeout by default, so a blackholed host would hang.
- Host keys are verified against ~/.ssh/known_hosts, the host's `known_hosts` file and drover's own
  (~/.config/drover/known_hosts). An unknown key is an error that prints the fingerprint and how to trust it;
  a changed key is a loud error; `accept_new = true` trusts on first use and records the key.
- The remote side travels as one compressed bundle on stdin (drover/transport/bundle.py), run by a one-line
  bootstrap that every login shell reads alike: nothing is left on the remote host, and the user's PYTHONPATH
  and site-packages stay out. The remote login shell still starts (sshd runs every command through it), so a
  slow ~/.bashrc slows every call; whatever it prints comes before the framed answer and becomes a warning.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncssh

from drover.errors import ConfigError, DroverError, TransportError, from_helper
from drover.fleet import Defaults, HostConfig
from drover.remote import protocol as P
from drover.transport import banner, bundle
from drover.transport.helper_channel import Helper, HelperGone, Ran, bounded, read_answer
from drover.transport.host_keys import HostKeyJudge, known_hosts_data


class _Client(asyncssh.SSHClient):
    def __init__(self, judge: HostKeyJudge, on_lost: Callable[[], None] | None = None) -> None:
        self._judge = judge
        self._on_lost = on_lost

    kbdint_offered = False

    def kbdint_auth_requested(self) -> str | None:
        # The host offers keyboard-interactive (a one-time code, a password): drover has nothing to type, but
        # "authentication refused" alone would hide that the host wants a second factor.
        self.kbdint_offered = True
        return NotImplemented  # asyncssh's default: a password if one was given

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        return self._judge.judge(host, addr, port, key)

    def connection_lost(self, exc: Exception | None) -> None:
        # A long-lived transport (the daemon's) forgets a dead connection at once, so the next request reconnects
        # (a host that restarted) instead of failing on the corpse.
        if self._on_lost is not None:
            self._on_lost()


class SSHTransport:
    def __init__(
        self,
        host: str,
        cfg: HostConfig,
        defaults: Defaults,
        profiles: dict[str, Any] | None = None,
        helpers: int = 0,
        slots: asyncio.Semaphore | None = None,
    ) -> None:
        """`helpers` > 0 is persistent mode (the daemon's): up to that many helper processes are kept running on the
        host and reused, one request at a time each; 0 starts a helper per request (one invocation's work).  `slots`:
        the bound shared with the transport this one replaces, while that one finishes its requests."""
        self.host = host
        self.cfg = cfg
        self.profiles = profiles or {}
        self.connect_timeout = cfg.connect_timeout or defaults.connect_timeout
        self._conn: asyncssh.SSHClientConnection | None = None
        self._lock = asyncio.Lock()
        self.connect_seconds: float | None = None
        self.warnings: list[str] = []
        self.helpers = helpers
        self._idle: list[tuple[asyncssh.SSHClientConnection, Helper]] = []
        self._shutting: set[asyncio.Future[None]] = set()  # idle helpers being closed, each in a slot (close_idle)
        self._slots = slots if slots is not None else (asyncio.Semaphore(helpers) if helpers else None)
        self.busy = 0
        self.connects = 0
        self.retiring = False
        # Why drover itself dropped the connection, if it did: a request on it then ends without an exit status,
        # and "the helper died" would blame the host for what drover did.
        self._dropped: tuple[Any, str] | None = None  # (that connection, why)

    @property
    def connected(self) -> bool:
        return self._conn is not None

    @property
    def idle_helpers(self) -> int:
        return len(self._idle)

    # -- connection ------------------------------------------------------------------------------------------
    async def _connection(self) -> asyncssh.SSHClientConnection:
        async with self._lock:
            if self._conn is None:
                started = time.monotonic()
                self._conn = await self._connect()
                self.connect_seconds = time.monotonic() - started
                self.connects += 1
            return self._conn

    def _lost(self, conn: Callable[[], asyncssh.SSHClientConnection | None]) -> Callable[[], None]:
        def forget() -> None:
            dead = conn()
            if dead is not None and self._conn is dead:
                self._conn = None
            self._idle = [(c, h) for c, h in self._idle if c is not dead]

        return forget

    async def _connect(self) -> asyncssh.SSHClientConnection:
        cfg = self.cfg
        target = cfg.ssh or self.host
        known = known_hosts_data(cfg)
        judge = HostKeyJudge(self.host, cfg, known)
        made: list[asyncssh.SSHClientConnection] = []
        on_lost = self._lost(lambda: made[0] if made else None) if self.helpers else None
        clients: list[_Client] = []

        def client() -> _Client:
            clients.append(_Client(judge, on_lost))
            return clients[-1]

        options: dict[str, Any] = {
            "known_hosts": known if known else b"",
            "client_factory": client,
            "connect_timeout": self.connect_timeout,
            "login_timeout": self.connect_timeout,
            # Whatever ~/.ssh/config says (ForwardAgent yes): a host drover talks to never gets the user's agent.
            "agent_forwarding": False,
        }
        if cfg.port:
            options["port"] = cfg.port
        if cfg.user:
            options["username"] = cfg.user
        if cfg.identity:
            key = Path(cfg.identity).expanduser()
            if not key.is_file():
                raise ConfigError(
                    f"the identity file {key} (identity under [hosts.{self.host}]) does not exist or is not a file",
                    host=self.host,
                    code=P.IDENTITY_MISSING,
                    hint="fix the path in fleet.toml, or drop identity to use ~/.ssh/config and the ssh-agent",
                )
            options["client_keys"] = [str(key)]
        if cfg.proxy_jump:
            options["tunnel"] = cfg.proxy_jump
        where = f"{target}" + (f":{cfg.port}" if cfg.port else "")
        try:
            # The outer bound also covers DNS and the tunnel, which connect_timeout may not.
            conn = await bounded(asyncssh.connect(target, **options), self.connect_timeout + 1)
            made.append(conn)
            return conn
        except asyncssh.HostKeyNotVerifiable:
            raise judge.error() from None
        except asyncssh.PermissionDenied as exc:
            if clients and clients[-1].kbdint_offered:
                raise TransportError(
                    f"{where} asks for a keyboard-interactive login (a one-time code or password, a second factor), "
                    "which drover cannot type",
                    host=self.host,
                    code=P.SECOND_FACTOR,
                    hint=f'reach it through your own OpenSSH master: set transport = "openssh" under [hosts.{self.host}] '
                    f"in fleet.toml, then open the master once with `drover connect {self.host}` (if your key alone "
                    "should let you in, check the host's `identity` and `user` instead)",
                ) from None
            raise TransportError(
                f"authentication refused by {where}: {exc.reason}",
                host=self.host,
                code=P.AUTH_FAILED,
                hint="check the host's `identity` and `user` in fleet.toml, ~/.ssh/config, or your ssh-agent",
            ) from None
        except (TimeoutError, asyncssh.misc.ConnectionLost) as exc:
            if isinstance(exc, asyncssh.misc.ConnectionLost):
                raise TransportError(
                    f"{where} closed the connection during the SSH handshake", host=self.host, code=P.CONNECTION_LOST
                ) from None
            raise TransportError(
                f"no SSH answer from {where} within {self.connect_timeout:g}s",
                host=self.host,
                code=P.CONNECT_TIMEOUT,
                hint="is the host up, the port right, and sshd (not something else) listening there?",
            ) from None
        except ConnectionRefusedError:
            raise TransportError(
                f"connection refused by {where}", host=self.host, code=P.CONNECTION_REFUSED, hint="is sshd running, on that port?"
            ) from None
        except socket.gaierror as exc:
            if cfg.proxy_jump:  # the target is resolved by the jump host: what failed here is the jump host
                raise TransportError(
                    f"cannot resolve the jump host {cfg.proxy_jump!r}: {exc.strerror}",
                    host=self.host,
                    code=P.PROXY_JUMP_FAILED,
                    hint=f"check proxy_jump under [hosts.{self.host}] in fleet.toml",
                ) from None
            raise TransportError(f"cannot resolve {target}: {exc.strerror}", host=self.host, code=P.DNS) from None
        except asyncssh.DisconnectError as exc:
            raise TransportError(f"{where} refused the SSH session: {exc.reason}", host=self.host, code=P.SSH_ERROR) from None
        except OSError as exc:
            raise TransportError(f"cannot reach {where}: {exc.strerror or exc}", host=self.host, code=P.UNREACHABLE) from None
        except asyncssh.Error as exc:  # e.g. a jump host that will not open the tunnel
            via = f" via {cfg.proxy_jump}" if cfg.proxy_jump else ""
            raise TransportError(f"SSH to {where}{via} failed: {exc.reason}", host=self.host, code=P.SSH_ERROR) from None

    # -- requests --------------------------------------------------------------------------------------------
    async def call(self, op: str, args: dict[str, Any], *, timeout: float) -> Any:
        if self.helpers:
            return await self._ask_helper(op, args, timeout)
        conn = await self._connection()
        request = json.dumps({"helper": P.PROTOCOL, "op": op, "args": args, "profiles": self.profiles}).encode() + b"\n"
        command = self._command()
        try:
            result = await bounded(self._run(conn, command, bundle.preamble() + request), timeout, on_timeout=self.abort)
        except TimeoutError:
            raise self._no_answer_in_time(op, timeout) from None
        except (asyncssh.Error, OSError) as exc:
            self._conn = None
            raise TransportError(
                f"the SSH connection was lost during {op}: {exc}", host=self.host, code=P.CONNECTION_LOST
            ) from None
        stdout, stderr = result.stdout, result.stderr.decode("utf-8", "replace").strip()
        answer, noise = read_answer(stdout)
        if answer is None:
            raise self._no_answer(op, result.status, result.signalled, stdout, stderr, conn)
        return await self._data(answer, noise)

    def _command(self) -> str:
        try:
            return bundle.command(self.cfg.python)
        except ValueError as exc:
            raise ConfigError(str(exc), host=self.host, hint=f"fix python under [hosts.{self.host}] in fleet.toml") from None

    async def _ask_helper(self, op: str, args: dict[str, Any], timeout: float) -> Any:
        """Persistent mode: the request goes to a helper already running on the host (one is started when none is
        idle, up to `helpers`; beyond that, requests wait their turn within their own timeout).  As with a helper
        per request, every request is bounded, a timeout drops the connection, and a request whose connection or
        helper dies on the way fails -- `indeterminate` for a send -- and is never sent again.  The next request
        finds the connection gone and opens a new one (a host that restarted)."""
        assert self._slots is not None
        request = json.dumps({"helper": P.PROTOCOL, "op": op, "args": args, "profiles": self.profiles}).encode() + b"\n"
        command = self._command()
        helper: Helper | None = None
        conn: asyncssh.SSHClientConnection | None = None
        kept = False

        async def ask() -> tuple[dict[str, Any], bytes]:
            nonlocal helper, conn, kept
            async with self._slots:  # type: ignore[union-attr]
                conn = await self._connection()
                while self._idle and helper is None:
                    c, h = self._idle.pop()
                    if c is conn and not h.process.is_closing() and not conn.is_closed():
                        helper = h
                    else:
                        await h.shut()  # in this slot, so the helper started next never runs beside it
                if helper is None:
                    helper = await Helper.start(conn, command)
                self.busy += 1
                try:
                    answer = await helper.ask(request)
                except BaseException:
                    # Cancelled or failed mid-request: its next answer would belong to nobody.  Shut *inside* the
                    # slot, so the next request's helper never starts beside one still exiting (a loaded machine
                    # saw 9 helper processes of 8).
                    await helper.shut()
                    raise
                finally:
                    self.busy -= 1
                # Back to the idle list -- or shut -- *before* the slot is released: after it, a request waiting
                # for the slot would find no idle helper and start one more than the bound (CI saw 9 helpers of 8).
                if self._conn is conn and not self.retiring:
                    self._idle.append((conn, helper))
                else:
                    await helper.shut()  # its connection was replaced, or this transport is being retired
                kept = True
                return answer

        task = asyncio.ensure_future(ask())
        try:
            answer, noise = await bounded(task, timeout, on_timeout=self.abort)
        except asyncio.CancelledError:
            task.cancel()  # the caller went away: so does the request (and the helper, closed below)
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            raise
        except TimeoutError:
            raise self._no_answer_in_time(op, timeout) from None
        except HelperGone:
            assert helper is not None
            ran = await helper.ended()
            stderr = ran.stderr.decode("utf-8", "replace").strip()
            raise self._no_answer(op, ran.status, ran.signalled, ran.stdout, stderr, conn) from None
        except (asyncssh.Error, OSError) as exc:
            if self._conn is conn:
                self._conn = None
            raise TransportError(
                f"the SSH connection was lost during {op}: {exc}", host=self.host, code=P.CONNECTION_LOST
            ) from None
        finally:
            if helper is not None and not kept:
                helper.close()  # cancelled or failed mid-request: its next answer would belong to nobody
        return await self._data(answer, noise)

    async def _data(self, answer: dict[str, Any], noise: bytes) -> Any:
        """The helper's data from its answer, checked; a noisy login shell becomes a warning (not a banner_ok one)."""
        if noise:
            accepted = await banner.judge(noise, self.cfg.banner_ok)
            if not accepted:
                self.warnings.append(banner.warning(self.host, noise, slow=accepted is None))
        if answer.get("helper") != P.PROTOCOL:
            raise TransportError(
                f"the helper speaks protocol {answer.get('helper')!r}, drover needs {P.PROTOCOL}",
                host=self.host,
                code=P.PROTOCOL_MISMATCH,
            )
        if answer.get("bundle") != bundle.bundle_hash():
            raise TransportError(
                f"the helper on the host runs bundle {answer.get('bundle')!r}, not the one drover sent "
                f"({bundle.bundle_hash()}): the code arrived damaged",
                host=self.host,
                code=P.BUNDLE_MISMATCH,
            )
        if not answer.get("ok"):
            raise from_helper(answer.get("error") or {}, self.host)
        return answer.get("data")

    def _no_answer(self, op: str, status: int | None, signal: bool, stdout: bytes, stderr: str, conn: Any = None) -> DroverError:
        """Why there is no answer: each step that can fail before the helper speaks, named."""
        python = self.cfg.python
        last = stderr.splitlines()[-1] if stderr else ""
        missing = status == P.EXIT_NOT_FOUND or (
            status != 0 and python.split("/")[-1] in stderr and ("not found" in stderr or "No such file" in stderr)
        )
        if missing:  # sh/bash/zsh/fish exit 127; tcsh says "python9: Command not found." and exits 1
            return TransportError(
                f"{python!r} was not found on the host",
                host=self.host,
                code=P.PYTHON_MISSING,
                hint=f"install python3 (3.6+) there, or set python = '/path/to/python3' under [hosts.{self.host}]",
            )
        if status == P.EXIT_TOO_OLD:
            need = ".".join(map(str, P.MIN_PYTHON))
            return TransportError(f"{python} on the host is older than {need}", host=self.host, code=P.PYTHON_TOO_OLD)
        if status is None and not signal and not last and conn is not None and self._dropped and self._dropped[0] is conn:
            return TransportError(
                f"drover closed the connection while {op} waited for its answer ({self._dropped[1]}): whether it ran "
                "on the host is not known",
                host=self.host,
                code=P.CONNECTION_LOST,
            )
        if status is None or signal:
            self._conn = None if status is None else self._conn
            detail = last or f"exit status {status}" + (", killed by a signal" if signal else "")
            return TransportError(f"the helper died during {op}: {detail}", host=self.host, code=P.CONNECTION_LOST)
        if "Traceback" in stderr and "invalid literal for int()" not in stderr:
            return TransportError(f"the helper crashed during {op}: {last}", host=self.host, code=P.HELPER_ERROR)
        if status != 0:
            # The connection and the login worked; the login shell did not run the helper (a failing rc file, a
            # shell that parses the command differently, an account with no shell).  That is not "unreachable".
            why = last or "no message"
            if "invalid literal for int()" in stderr:
                why = "its input was consumed before it started: does a login rc file read stdin?"
            return TransportError(
                f"the login shell on the host did not start the helper (exit {status}): {why}",
                host=self.host,
                code=P.SHELL_FAILED,
                hint="check the account's login shell and its rc files for non-interactive use (ssh HOST true)",
            )
        return TransportError(
            f"the helper's answer to {op} is missing or cut short (exit {status}): {stdout[-200:]!r} {last[-200:]}",
            host=self.host,
            code=P.HELPER_ERROR,
        )

    @staticmethod
    async def _run(conn: asyncssh.SSHClientConnection, command: str, stdin: bytes) -> Ran:
        """Run the command with stdin and read until the framed answer is complete -- not until the channel closes:
        a job an rc file left in the background can hold the channel open long after the helper answered.  A
        remote that exits before reading all its input (no python there) still has its say through the exit status."""
        # Nor an X11 display (ForwardX11 yes): the helper needs neither, and a forwarded one is a way back in.
        async with conn.create_process(command, encoding=None, x11_forwarding=False) as process:
            try:
                process.stdin.write(stdin)
                process.stdin.write_eof()
            except (BrokenPipeError, ConnectionResetError, asyncssh.Error):
                pass  # the process is gone already: its exit status tells why
            out = b""
            while True:
                chunk = await process.stdout.read(1 << 16)
                if not chunk:
                    break
                out += chunk
                if P.ANSWER_MARK in out and read_answer(out)[0] is not None:
                    process.close()
                    return Ran(out, b"", 0, False)
            done = await process.wait(check=False)
            err = done.stderr if isinstance(done.stderr, bytes) else b""
            return Ran(out, err, done.exit_status, done.exit_signal is not None)

    def _no_answer_in_time(self, op: str, timeout: float) -> TransportError:
        return TransportError(
            f"no answer to {op} within {timeout:g}s (the request may still complete there)",
            host=self.host,
            code=P.REQUEST_TIMEOUT,
        )

    def abort(self) -> None:
        """Drop the connection at once: a host that stopped answering would never finish a polite close."""
        if self._conn is not None:
            self._dropped = (self._conn, "another request to this host ran out of time")
            self._conn.abort()
            self._conn = None
        self._idle = []

    def close_idle(self) -> None:
        """Close the helpers no request is using (a transport being replaced: its busy ones finish first, and are
        closed as they do).  Each one holds a slot of the shared bound until its channel has closed -- on the
        host, until the process has ended: the replacement's first requests, which take their slots after these
        (asyncio runs tasks in the order they were made), would otherwise start helpers beside ones still exiting
        (a loaded machine saw 9 helpers of 8)."""
        self.retiring = True
        idle, self._idle = self._idle, []
        for _conn, helper in idle:
            if self._slots is None:
                helper.close()
                continue
            shutting = asyncio.ensure_future(self._shut_in_slot(helper))
            self._shutting.add(shutting)
            shutting.add_done_callback(self._shutting.discard)

    async def _shut_in_slot(self, helper: Helper) -> None:
        async with self._slots:  # type: ignore[union-attr]
            await helper.shut()

    async def close(self) -> None:
        for _conn, helper in self._idle:
            helper.close()
        self._idle = []
        if self._shutting:
            await asyncio.wait(set(self._shutting), timeout=3)
        if self._conn is not None:
            self._dropped = (self._conn, "the client was closed")
            self._conn.close()
            try:
                await bounded(self._conn.wait_closed(), 2)
            except (TimeoutError, DroverError, OSError, asyncssh.Error):
                self._conn.abort()
            self._conn = None
