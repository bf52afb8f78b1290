"""The system `ssh` as drover runs it for a `transport = "openssh"` host: its command lines, the master's socket,
and what ssh's own failures (exit 255) mean.

The user's OpenSSH configuration decides everything it decides for the user (ControlPath, ProxyJump, GSSAPI,
PKCS#11 and FIDO keys, `Match` blocks); drover adds only what makes a call safe to run from a cron job:
- `BatchMode=yes`, `-T`, stdin a pipe: never a prompt.  A host that needs a second factor is reached through a
  master the person opened (`drover connect HOST`); without one, ssh fails at once instead of asking.
- `ControlMaster=no`: drover rides a master, it never becomes one.  A master forked by drover's own ssh (the user's
  `ControlMaster auto` + `ControlPersist`) would inherit drover's pipes and hold a call open until it expired.
- Host keys: OpenSSH's own checking, with drover's known_hosts files added to the user's, so both transports
  trust the same keys; `StrictHostKeyChecking=no` in the user's config is raised to `yes`.
- `KbdInteractiveAuthentication` is left as the user has it: forcing it off (as some tools do) breaks the key +
  one-time-code logins this transport exists for.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import subprocess
from pathlib import Path

from drover.errors import TransportError
from drover.fleet import HostConfig
from drover.remote import protocol as P
from drover.transport.host_keys import drover_known_hosts

SSH = "ssh"
# sockaddr_un's path is 104 bytes on macOS and the BSDs (108 on Linux); ssh first binds the master's socket at
# the path plus a 17-byte random suffix (".XXXXXXXXXXXXXXXX") and renames it: the path itself must leave room.
SOCKET_LIMIT = 104
SSH_SUFFIX = 17
PERSIST = "8h"  # how long a master `drover connect` opens stays up with nothing riding it

# ssh's own failures, from its stderr (exit 255), each as the step that failed -- before the remote command ran.
_FAILURES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED|Host key for .* has changed"), P.HOST_KEY_CHANGED),
    (re.compile(r"Host key verification failed|No \S+ host key is known"), P.UNKNOWN_HOST_KEY),
    (re.compile(r"Permission denied|Too many authentication failures"), P.AUTH_FAILED),
    (re.compile(r"Could not resolve hostname"), P.DNS),
    (re.compile(r"Connection refused"), P.CONNECTION_REFUSED),
    (re.compile(r"timed out|Connection timed out"), P.CONNECT_TIMEOUT),
    (re.compile(r"No route to host|Network is unreachable"), P.UNREACHABLE),
]


def socket_fits(path: str) -> bool:
    return len(path.encode()) + SSH_SUFFIX < SOCKET_LIMIT


def user_config() -> Path | None:
    """The ssh config file to name with -F, if any: OpenSSH reads ~/.ssh/config from the passwd entry's home, not
    $HOME; when $HOME points elsewhere (a service account, a test), drover's asyncssh transport reads $HOME's,
    and the openssh transport must read the same file for both to reach a host the same way."""
    home = os.path.expanduser("~")
    try:
        pw_home = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        pw_home = home
    config = Path(home) / ".ssh" / "config"
    if os.path.realpath(home) != os.path.realpath(pw_home) and config.is_file():
        return config
    return None


def drover_control_path() -> str:
    """drover's ControlPath for hosts whose user config names none (or one too long for a socket): short enough
    for the socket limit, private to the user."""
    path = str(Path(os.path.expanduser("~")) / ".ssh" / "drover-%C")
    if socket_fits(path.replace("%C", "c" * 40)):
        return path
    short = Path(f"/tmp/drover-ssh-{os.getuid()}")  # 0700 and owned by the user: checked below
    short.mkdir(mode=0o700, exist_ok=True)
    st = short.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise TransportError(f"{short} is not a private directory of this user: drover will not put ssh sockets there")
    return str(short / "%C")


class OpenSSHCommand:
    """The argv of every ssh drover runs for one host, from the fleet entry and the user's resolved config."""

    def __init__(self, host: str, cfg: HostConfig, connect_timeout: float) -> None:
        self.host = host
        self.cfg = cfg
        self.target = cfg.ssh or host
        self.connect_timeout = connect_timeout
        self._resolved: dict[str, str] | None = None
        self._control: str | None = None
        self._socket: str | None = None

    def base(self) -> list[str]:
        """What selects the host as the user reaches it: their config file and the fleet's per-host settings."""
        cfg = self.cfg
        argv = [SSH]
        config = user_config()
        if config is not None:
            argv += ["-F", str(config)]
        if cfg.port:
            argv += ["-p", str(cfg.port)]
        if cfg.user:
            argv += ["-l", cfg.user]
        if cfg.identity:
            argv += ["-i", str(Path(cfg.identity).expanduser())]
        if cfg.proxy_jump:
            argv += ["-J", cfg.proxy_jump]
        return argv

    def resolved(self) -> dict[str, str]:
        """`ssh -G`: the user's config as it applies to this host (the first word of each line, lowercased)."""
        if self._resolved is None:
            self._resolved = self._ssh_g([])
            user = self.user_control_path()
            if user and socket_fits(user):
                self._control = self._socket = user
            else:
                self._control = drover_control_path()
        return self._resolved

    def _ssh_g(self, options: list[str]) -> dict[str, str]:
        try:
            done = subprocess.run(
                [*self.base(), *options, "-G", self.target],
                capture_output=True,
                text=True,
                timeout=10,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError:
            raise TransportError(
                "the openssh transport needs the `ssh` program, which is not installed here",
                host=self.host,
                code=P.SSH_ERROR,
                hint=f'install OpenSSH\'s client, or drop transport = "openssh" under [hosts.{self.host}]',
            ) from None
        except subprocess.TimeoutExpired:
            done = subprocess.CompletedProcess([], 255, "", "ssh -G did not answer")
        if done.returncode != 0:
            raise TransportError(
                f"ssh cannot read its configuration for {self.target}: {done.stderr.strip()[-300:]}",
                host=self.host,
                code=P.SSH_ERROR,
            )
        resolved: dict[str, str] = {}
        for line in done.stdout.splitlines():
            key, _, value = line.partition(" ")
            resolved.setdefault(key.lower(), value)
        return resolved

    def user_control_path(self) -> str | None:
        path = self.resolved().get("controlpath")
        return None if not path or path == "none" else path

    def control_path(self) -> str:
        """The ControlPath drover rides: the user's, else (or when it is too long) drover's own (with %C)."""
        self.resolved()
        assert self._control is not None
        return self._control

    def control_socket(self) -> str:
        """That ControlPath as ssh expands it: the socket's file."""
        control = self.control_path()
        if self._socket is None:
            # ssh expands %C (a hash of the endpoints) itself: asked, it says which socket that is.
            self._socket = self._ssh_g(["-o", f"ControlPath={control}"]).get("controlpath", control)
        return self._socket

    def _control_option(self) -> list[str]:
        user = self.user_control_path()
        return [] if user and socket_fits(user) else ["-o", f"ControlPath={self.control_path()}"]

    def _known_hosts(self) -> list[str]:
        files = self.resolved().get("userknownhostsfile", "").split()
        for extra in (Path("~/.ssh/known_hosts").expanduser(), drover_known_hosts(), self.cfg.known_hosts):
            if extra is not None:
                path = str(Path(extra).expanduser())
                if path not in files:
                    files.append(path)
        if self.cfg.accept_new:
            # ssh records a key it accepts in the first file: the one the asyncssh transport records into.
            record = str(Path(self.cfg.known_hosts).expanduser()) if self.cfg.known_hosts else str(drover_known_hosts())
            files = [record, *(f for f in files if f != record)]
        quoted = " ".join(f'"{f}"' if " " in f else f for f in files)
        return ["-o", f"UserKnownHostsFile={quoted}"]

    def _strict(self) -> list[str]:
        if self.cfg.accept_new:
            return ["-o", "StrictHostKeyChecking=accept-new"]
        if self.resolved().get("stricthostkeychecking") in ("false", "no", "off"):
            return ["-o", "StrictHostKeyChecking=yes"]  # drover never talks to a host it cannot verify
        return []

    def call(self, remote_command: str) -> list[str]:
        """A call: non-interactive, riding the master if one is up, never starting one."""
        return [
            *self.base(),
            "-T",
            "-o", "BatchMode=yes",
            "-o", "ControlMaster=no",
            *self._control_option(),
            "-o", f"ConnectTimeout={max(1, round(self.connect_timeout))}",
            "-o", "ForwardAgent=no",
            "-o", "ForwardX11=no",
            "-o", "ClearAllForwardings=yes",
            "-o", "PermitLocalCommand=no",
            *self._known_hosts(),
            *self._strict(),
            "-e", "none",
            self.target,
            remote_command,
        ]  # fmt: skip

    def check(self) -> list[str]:
        """`ssh -O check`: whether a master answers on the control socket."""
        return [*self.base(), *self._control_option(), "-O", "check", self.target]

    def connect(self) -> list[str]:
        """What opens the master, on the user's terminal (the second factor typed by the person)."""
        persist = self.resolved().get("controlpersist")
        persist_option = [] if persist and persist not in ("no", "false", "0") else ["-o", f"ControlPersist={PERSIST}"]
        # BatchMode=no: this one is interactive by design, whatever the config says for drover's calls.
        interactive = ["-o", "BatchMode=no"]
        return [
            *self.base(), "-M", *persist_option, *interactive, *self._control_option(), *self._known_hosts(),
            *self._strict(), self.target, "true",
        ]  # fmt: skip

    def connect_line(self) -> str:
        """The connect command as a person would type it (drover's known_hosts additions left out: ssh's own
        files suffice for a person, who can answer a host-key question)."""
        persist = self.resolved().get("controlpersist")
        words = [*self.base(), "-M"]
        if not persist or persist in ("no", "false", "0"):
            words += ["-o", f"ControlPersist={PERSIST}"]
        return shlex.join([*words, *self._control_option(), self.target, "true"])


def classify(stderr: str) -> str | None:
    """The step ssh itself failed at (exit 255 with nothing from the remote side), or None when its message is not
    one of a connection that never carried the command (a master that died mid-request, say)."""
    for pattern, code in _FAILURES:
        if pattern.search(stderr):
            return code
    return None
