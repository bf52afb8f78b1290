"""SSH hosts: asyncssh, one connection per host per invocation, the helper shipped over the channel.

- The user's OpenSSH setup is honoured: asyncssh reads ~/.ssh/config (Host aliases, HostName, Port, User,
  IdentityFile, ProxyJump, HostKeyAlias) and uses the ssh-agent; the fleet's per-host settings go on top.
- Every step has a timeout: asyncssh has no connect timeout by default, so a blackholed host would hang.
- Host keys are verified against ~/.ssh/known_hosts, the host's `known_hosts` file and drover's own
  (~/.config/drover/known_hosts). An unknown key is an error that prints the fingerprint and how to trust it;
  a changed key is a loud error; `accept_new = true` trusts on first use and records the key.
- The helper is sent on stdin after a length line and run by `python3 -I -c BOOTSTRAP`: nothing is left on the
  remote host, and -I keeps the user's PYTHONPATH and site-packages out. The remote login shell still starts
  (sshd runs every command through it), so a slow ~/.bashrc slows every call: keep rc files quiet for
  non-interactive shells.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import socket
import time
from pathlib import Path
from typing import Any

import asyncssh

from drover.errors import DroverError, TransportError, from_helper
from drover.fleet import Defaults, HostConfig
from drover.remote import helper

HELPER_SOURCE = Path(helper.__file__).read_bytes()
# Exit 97: the interpreter is too old for the helper. The helper's own main() answers everything else in JSON.
BOOTSTRAP = (
    "import sys\n"
    "if sys.version_info < (3, 8): sys.exit(97)\n"
    "s = sys.stdin.buffer; n = int(s.readline()); g = {'__name__': 'drover_helper'}\n"
    "exec(compile(s.read(n), 'drover-helper', 'exec'), g); sys.exit(g['main']())"
)
EXIT_NOT_FOUND = 127
EXIT_TOO_OLD = 97


def drover_known_hosts() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "drover" / "known_hosts"


class HostKeyJudge:
    """Decides on a host key asyncssh could not find in known_hosts, and remembers why, for the error."""

    def __init__(self, name: str, cfg: HostConfig, known: bytes) -> None:
        self.name = name
        self.cfg = cfg
        self.known = known
        self.verdict: str | None = None
        self.seen: tuple[str, int, Any] | None = None

    def judge(self, host: str, addr: str, port: int, key: Any) -> bool:
        self.seen = (host, port, key)
        trusted = asyncssh.match_known_hosts(self.known, host, addr, port if port != 22 else None)[0] if self.known else []
        if trusted:
            self.verdict = "changed"
            return False
        if self.cfg.accept_new:
            self._record(host, port, key)
            self.verdict = "accepted"
            return True
        self.verdict = "unknown"
        return False

    def _record(self, host: str, port: int, key: Any) -> None:
        path = Path(self.cfg.known_hosts).expanduser() if self.cfg.known_hosts else drover_known_hosts()
        path.parent.mkdir(parents=True, exist_ok=True)
        pattern = host if port == 22 else f"[{host}]:{port}"
        algo, data = key.export_public_key("openssh").decode().split()[:2]
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{pattern} {algo} {data}\n")

    def error(self) -> TransportError:
        if self.seen is None:
            return TransportError("the host key could not be verified", host=self.name, code="host_key")
        host, port, key = self.seen
        where = host if port == 22 else f"[{host}]:{port}"
        fingerprint = key.get_fingerprint("sha256")
        if self.verdict == "changed":
            return TransportError(
                f"HOST KEY CHANGED for {where}: it now presents {fingerprint}, which is not the key in known_hosts. "
                "This may be an attack; drover will not connect",
                host=self.name,
                code="host_key_changed",
                hint=f"if the host was reinstalled, remove the old key with `ssh-keygen -R '{where}'` and check the new one",
                details={"fingerprint": fingerprint},
            )
        scan = f"ssh-keyscan -p {port} {host}" if port != 22 else f"ssh-keyscan {host}"
        return TransportError(
            f"unknown host key for {where}: {key.get_algorithm()} {fingerprint}",
            host=self.name,
            code="unknown_host_key",
            hint=f"if that is the host's fingerprint, trust it with `{scan} >> ~/.ssh/known_hosts`, "
            f"or set accept_new = true under [hosts.{self.name}] in fleet.toml",
            details={"fingerprint": fingerprint},
        )


class _Client(asyncssh.SSHClient):
    def __init__(self, judge: HostKeyJudge) -> None:
        self._judge = judge

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        return self._judge.judge(host, addr, port, key)


def _known_hosts_data(cfg: HostConfig) -> bytes:
    files = [Path("~/.ssh/known_hosts").expanduser(), drover_known_hosts()]
    if cfg.known_hosts:
        files.append(Path(cfg.known_hosts).expanduser())
    chunks = []
    for path in files:
        try:
            chunks.append(path.read_bytes())
        except OSError:
            continue
    return b"\n".join(chunks)


class SSHTransport:
    def __init__(self, host: str, cfg: HostConfig, defaults: Defaults, profiles: dict[str, Any] | None = None) -> None:
        self.host = host
        self.cfg = cfg
        self.profiles = profiles or {}
        self.connect_timeout = cfg.connect_timeout or defaults.connect_timeout
        self._conn: asyncssh.SSHClientConnection | None = None
        self._lock = asyncio.Lock()
        self.connect_seconds: float | None = None

    # -- connection ------------------------------------------------------------------------------------------
    async def _connection(self) -> asyncssh.SSHClientConnection:
        async with self._lock:
            if self._conn is None:
                started = time.monotonic()
                self._conn = await self._connect()
                self.connect_seconds = time.monotonic() - started
            return self._conn

    async def _connect(self) -> asyncssh.SSHClientConnection:
        cfg = self.cfg
        target = cfg.ssh or self.host
        known = _known_hosts_data(cfg)
        judge = HostKeyJudge(self.host, cfg, known)
        options: dict[str, Any] = {
            "known_hosts": known if known else b"",
            "client_factory": lambda: _Client(judge),
            "connect_timeout": self.connect_timeout,
            "login_timeout": self.connect_timeout,
        }
        if cfg.port:
            options["port"] = cfg.port
        if cfg.user:
            options["username"] = cfg.user
        if cfg.identity:
            options["client_keys"] = [str(Path(cfg.identity).expanduser())]
        if cfg.proxy_jump:
            options["tunnel"] = cfg.proxy_jump
        where = f"{target}" + (f":{cfg.port}" if cfg.port else "")
        try:
            # The outer wait_for also bounds DNS and the tunnel, which connect_timeout may not cover.
            return await asyncio.wait_for(asyncssh.connect(target, **options), self.connect_timeout + 1)
        except asyncssh.HostKeyNotVerifiable:
            raise judge.error() from None
        except asyncssh.PermissionDenied as exc:
            raise TransportError(
                f"authentication refused by {where}: {exc.reason}",
                host=self.host,
                code="auth_failed",
                hint="check the host's `identity` and `user` in fleet.toml, ~/.ssh/config, or your ssh-agent",
            ) from None
        except (TimeoutError, asyncssh.misc.ConnectionLost) as exc:
            if isinstance(exc, asyncssh.misc.ConnectionLost):
                raise TransportError(
                    f"{where} closed the connection during the SSH handshake", host=self.host, code="connection_lost"
                ) from None
            raise TransportError(
                f"no SSH answer from {where} within {self.connect_timeout:g}s",
                host=self.host,
                code="connect_timeout",
                hint="is the host up, the port right, and sshd (not something else) listening there?",
            ) from None
        except ConnectionRefusedError:
            raise TransportError(
                f"connection refused by {where}", host=self.host, code="connection_refused", hint="is sshd running, on that port?"
            ) from None
        except socket.gaierror as exc:
            raise TransportError(f"cannot resolve {target}: {exc.strerror}", host=self.host, code="dns") from None
        except asyncssh.DisconnectError as exc:
            raise TransportError(f"{where} refused the SSH session: {exc.reason}", host=self.host, code="ssh_error") from None
        except OSError as exc:
            raise TransportError(f"cannot reach {where}: {exc.strerror or exc}", host=self.host, code="unreachable") from None
        except asyncssh.Error as exc:  # e.g. a jump host that will not open the tunnel
            via = f" via {cfg.proxy_jump}" if cfg.proxy_jump else ""
            raise TransportError(f"SSH to {where}{via} failed: {exc.reason}", host=self.host, code="ssh_error") from None

    # -- requests --------------------------------------------------------------------------------------------
    async def call(self, op: str, args: dict[str, Any], *, timeout: float) -> Any:
        conn = await self._connection()
        request = json.dumps({"helper": helper.PROTOCOL, "op": op, "args": args, "profiles": self.profiles}).encode()
        stdin = str(len(HELPER_SOURCE)).encode() + b"\n" + HELPER_SOURCE + request
        python = shlex.quote(self.cfg.python)
        command = f"exec {python} -I -c {shlex.quote(BOOTSTRAP)}"
        try:
            result = await asyncio.wait_for(self._run(conn, command, stdin), timeout)
        except TimeoutError:
            raise TransportError(
                f"no answer to {op} within {timeout:g}s (the request may still complete there)", host=self.host, code="timeout"
            ) from None
        except (asyncssh.Error, OSError) as exc:
            self._conn = None
            raise TransportError(
                f"the SSH connection was lost during {op}: {exc}", host=self.host, code="connection_lost"
            ) from None
        stdout = result.stdout if isinstance(result.stdout, bytes) else b""
        stderr = result.stderr.decode("utf-8", "replace").strip() if isinstance(result.stderr, bytes) else ""
        if result.exit_status == EXIT_NOT_FOUND:
            raise TransportError(
                f"{self.cfg.python!r} was not found on the host",
                host=self.host,
                code="python_missing",
                hint=f"install python3 (3.8+) there, or set python = '/path/to/python3' under [hosts.{self.host}]",
            )
        if result.exit_status == EXIT_TOO_OLD:
            raise TransportError(f"{self.cfg.python} on the host is older than 3.8", host=self.host, code="python_too_old")
        if result.exit_status is None or result.exit_signal or (result.exit_status and not stdout):
            self._conn = None if result.exit_status is None else self._conn
            detail = stderr.splitlines()[-1] if stderr else f"exit status {result.exit_status}, signal {result.exit_signal}"
            raise TransportError(f"the helper died during {op}: {detail}", host=self.host, code="connection_lost")
        try:
            answer = json.loads(stdout)
        except ValueError:
            raise TransportError(
                f"the helper's answer to {op} is not JSON: {stdout[:200]!r} {stderr[-200:]}", host=self.host, code="helper_error"
            ) from None
        if answer.get("helper") != helper.PROTOCOL:
            raise TransportError(
                f"the helper speaks protocol {answer.get('helper')!r}, drover needs {helper.PROTOCOL}",
                host=self.host,
                code="protocol",
            )
        if not answer.get("ok"):
            raise from_helper(answer.get("error") or {}, self.host)
        return answer.get("data")

    @staticmethod
    async def _run(conn: asyncssh.SSHClientConnection, command: str, stdin: bytes) -> asyncssh.SSHCompletedProcess:
        """Run the command with stdin; a remote that exits before reading it all (no python there) still has a say."""
        async with conn.create_process(command, encoding=None) as process:
            try:
                process.stdin.write(stdin)
                process.stdin.write_eof()
            except (BrokenPipeError, ConnectionResetError, asyncssh.Error):
                pass  # the process is gone already: its exit status tells why
            return await process.wait(check=False)

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            try:
                await asyncio.wait_for(self._conn.wait_closed(), 2)
            except (TimeoutError, DroverError, OSError, asyncssh.Error):
                pass
            self._conn = None
