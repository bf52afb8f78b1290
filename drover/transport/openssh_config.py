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

import contextlib
import ctypes
import functools
import os
import pwd
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from drover.errors import TransportError
from drover.fleet import HostConfig
from drover.remote import protocol as P
from drover.transport.host_keys import drover_known_hosts

SSH = "ssh"
# sockaddr_un's path is 104 bytes on macOS and the BSDs (108 on Linux); ssh first binds the master's socket at
# the path plus a 17-byte random suffix (".XXXXXXXXXXXXXXXX") and renames it: the path itself must leave room.
SOCKET_LIMIT = 104
SSH_SUFFIX = 17
CONFIG_TIMEOUT = 10.0  # `ssh -G` outside any call's bound (drover connect, a test)
PERSIST = "8h"  # how long a master `drover connect` opens stays up with nothing riding it

# ssh's own failures, from its stderr (exit 255), each as the step that failed -- before the remote command ran.
_FAILURES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED|Host key for .* has changed"), P.HOST_KEY_CHANGED),
    (re.compile(r"Host key verification failed|No \S+ host key is known"), P.UNKNOWN_HOST_KEY),
    # ssh's own: "root@host: Permission denied (publickey,keyboard-interactive)." -- the methods always follow.
    (re.compile(r"Permission denied \([\w,@.-]*\)|Too many authentication failures"), P.AUTH_FAILED),
    (re.compile(r"Could not resolve hostname"), P.DNS),
    (re.compile(r"Connection refused"), P.CONNECTION_REFUSED),
    (re.compile(r"timed out|Connection timed out"), P.CONNECT_TIMEOUT),
    (re.compile(r"No route to host|Network is unreachable"), P.UNREACHABLE),
]


def ssh_env() -> dict[str, str]:
    """The environment of every ssh drover starts unattended: never a prompt, including from the ssh a ProxyJump
    starts (which gets none of drover's -o options, BatchMode included, but inherits this).  With no terminal,
    ssh would otherwise run $SSH_ASKPASS on $DISPLAY for a password or a host-key question."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "SSH_ASKPASS")}
    env["SSH_ASKPASS_REQUIRE"] = "never"
    return env


def _libc_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # looked up now: a forked child must not load libraries
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()
_PR_SET_PDEATHSIG = 1


def die_with_drover() -> None:
    """preexec_fn of every ssh drover starts: killed when drover dies (SIGTERM, SIGHUP, SIGKILL -- no handler of
    drover's runs then).  In its own session it gets no terminal's signal, and an ssh riding a master that stopped
    answering would otherwise wait there for ever."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def option(name: str, value: str) -> list[str]:
    """`-o name=value`, the value quoted as ssh's own parser needs when it holds a space (a HOME with one)."""
    return ["-o", f'{name}="{value}"' if " " in value else f"{name}={value}"]


# A line of ssh's own (not the remote command's stderr, which ssh passes through): its fatal() and error() forms.
_SSH_OWN = re.compile(
    r"^(ssh: |ssh_\w+: |kex_exchange_identification: |client_loop: |mux_client_\w+: |muxclient: |channel \d+: "
    r"|Control socket |Connection to \S+ closed|Connection closed by |Received disconnect |Disconnected from "
    r"|Timeout, server |stdio forwarding failed|Host key verification failed|\S+: Permission denied \("
    r"|Too many authentication failures|Unable to negotiate |Bad owner or permissions |command-line line \d+: "
    r"|\S+ line \d+: |Load key |@@@@|No \S+ host key is known|Cannot execute command-line |ProxyCommand |"
    r"Write failed: |packet_write_wait: |Bad packet length|Corrupted MAC|Could not resolve hostname)",
    re.MULTILINE,
)


def ssh_failed_itself(stderr: str) -> bool:
    """Whether an exit status 255 is ssh's own failure: ssh said so in its own words (or said nothing).  A remote
    command can exit 255 too, with its own message -- the remote command's failure, as asyncssh tells it."""
    return not stderr.strip() or bool(_SSH_OWN.search(stderr))


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


def ssh_path(path: str) -> str:
    """A path drover built, as ssh reads it in a ControlPath, a UserKnownHostsFile or an -i: ssh expands `%`
    tokens there, so a `%` of the path itself (a HOME named `p%d`) is written `%%`."""
    return path.replace("%", "%%")


def drover_control_path() -> str:
    """drover's ControlPath for hosts whose user config names none (or one too long for a socket): short enough
    for the socket limit, private to the user."""
    ssh_dir = str(Path(os.path.expanduser("~")) / ".ssh")
    if socket_fits(f"{ssh_dir}/drover-{'c' * 40}"):
        return f"{ssh_path(ssh_dir)}/drover-%C"
    short = Path(f"/tmp/drover-ssh-{os.getuid()}")  # 0700 and owned by the user: checked below
    short.mkdir(mode=0o700, exist_ok=True)
    st = short.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise TransportError(f"{short} is not a private directory of this user: drover will not put ssh sockets there")
    return str(short / "%C")


@functools.cache
def ssh_knows_8_7_options() -> bool:
    """Whether this ssh knows StdinNull and ForkAfterAuthentication (OpenSSH 8.7 and later): an older one refuses
    an option it does not know, so drover passes them only to one that knows them (asked once, with no config)."""
    try:
        done = subprocess.run(
            [SSH, "-F", "/dev/null", "-o", "StdinNull=no", "-o", "ForkAfterAuthentication=no", "-G", "drover-probe"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=ssh_env(),
            timeout=CONFIG_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


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
            argv += ["-i", ssh_path(str(Path(cfg.identity).expanduser()))]
        if cfg.proxy_jump:
            argv += ["-J", cfg.proxy_jump]
        if ssh_knows_8_7_options():
            # `ForkAfterAuthentication yes` (ssh -f) in the user's config: ssh -G refuses to run, and a call would
            # fork away from drover's pipes; `StdinNull yes` (ssh -n) would feed the helper /dev/null, not drover's
            # request.  Every ssh drover runs reads and answers through its own pipes.
            argv += ["-o", "ForkAfterAuthentication=no", "-o", "StdinNull=no"]
        return argv

    def resolved(self, seconds: float = CONFIG_TIMEOUT) -> dict[str, str]:
        """`ssh -G`: the user's config as it applies to this host (the first word of each line, lowercased), within
        `seconds` (a `Match exec` runs a program of the user's)."""
        if self._resolved is None:
            self._resolved = self._ssh_g([], seconds)
            user = self.user_control_path()
            if user and socket_fits(user):
                self._control = self._socket = user
            else:
                self._control = drover_control_path()
        return self._resolved

    def _ssh_g(self, options: list[str], seconds: float = CONFIG_TIMEOUT) -> dict[str, str]:
        # Its output goes to files, not pipes, and its whole group is killed: a `Match exec` that leaves a child in
        # the background would hold a pipe open long after ssh -G answered, and a slow one must not outlast the call.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(
                    [*self.base(), *options, "-G", self.target],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    env=ssh_env(),
                    start_new_session=True,
                    preexec_fn=die_with_drover,
                )
            except FileNotFoundError:
                raise TransportError(
                    "the openssh transport needs the `ssh` program, which is not installed here",
                    host=self.host,
                    code=P.SSH_ERROR,
                    hint=f'install OpenSSH\'s client, or drop transport = "openssh" under [hosts.{self.host}]',
                ) from None
            try:
                status = proc.wait(max(seconds, 0.1))
            except subprocess.TimeoutExpired:
                status = None
            finally:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            out.seek(0)
            err.seek(0)
            stdout = out.read().decode("utf-8", "replace")
            stderr = err.read(1 << 16).decode("utf-8", "replace").strip()
        if status is None:
            raise TransportError(
                f"`ssh -G {self.target}` (reading your ssh configuration) did not finish within {seconds:g}s",
                host=self.host,
                code=P.SSH_ERROR,
                hint="a `Match exec` in your ssh config that is slow or hangs? `ssh -G` with the same host shows it",
            )
        if status != 0:
            raise TransportError(
                f"ssh cannot read its configuration for {self.target}: {stderr[-300:]}",
                host=self.host,
                code=P.SSH_ERROR,
            )
        resolved: dict[str, str] = {}
        for line in stdout.splitlines():
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

    def control_socket(self, seconds: float = CONFIG_TIMEOUT) -> str:
        """That ControlPath as ssh expands it: the socket's file (asked of ssh within `seconds`)."""
        self.resolved(seconds)
        control = self.control_path()
        if self._socket is None:
            # ssh expands %C (a hash of the endpoints) itself: asked, it says which socket that is.
            self._socket = self._ssh_g(option("ControlPath", control), seconds).get("controlpath", control)
        return self._socket

    def _control_option(self) -> list[str]:
        user = self.user_control_path()
        return [] if user and socket_fits(user) else option("ControlPath", self.control_path())

    def _known_hosts(self) -> list[str]:
        files = self.resolved().get("userknownhostsfile", "").split()
        for extra in (Path("~/.ssh/known_hosts").expanduser(), drover_known_hosts(), self.cfg.known_hosts):
            if extra is not None:
                path = ssh_path(str(Path(extra).expanduser()))  # the user's own files keep their tokens
                if path not in files:
                    files.append(path)
        if self.cfg.accept_new:
            # ssh records a key it accepts in the first file: the one the asyncssh transport records into.
            record = ssh_path(str(self.ready_to_record()))
            files = [record, *(f for f in files if f != record)]
        quoted = " ".join(f'"{f}"' if " " in f else f for f in files)
        return ["-o", f"UserKnownHostsFile={quoted}"]

    def _record_file(self) -> Path:
        return Path(self.cfg.known_hosts).expanduser() if self.cfg.known_hosts else drover_known_hosts()

    def ready_to_record(self) -> Path:
        """accept_new's known_hosts file, its directory made (0700) if missing: ssh cannot record into a missing
        directory, says "Failed to add the host" and carries on -- then every later call accepts any key."""
        path = self._record_file()
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            writable = os.access(path if path.exists() else path.parent, os.W_OK)
        except OSError:
            writable = False
        if not writable:
            raise TransportError(
                f"accept_new is set for {self.host}, but its key cannot be recorded in {path}: drover will not "
                "accept a key it cannot pin",
                host=self.host,
                code=P.HOST_KEY,
                hint=f"make {path} (and its directory) writable, or set known_hosts under [hosts.{self.host}]",
            )
        return path

    def unrecorded(self, stderr: str) -> TransportError | None:
        """ssh accepted a new key and could not record it (it says so and goes on): a failure, never silence."""
        if "Failed to add the host" not in stderr:
            return None
        said = next(line for line in stderr.splitlines() if "Failed to add the host" in line)
        return TransportError(
            f"ssh accepted {self.host}'s new host key but could not record it ({said.strip()}); the request ran, "
            "but no later call would verify this host",
            host=self.host,
            code=P.HOST_KEY,
            hint=f"make {self._record_file()} writable, then run the command again",
        )

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
            *self._own_command(),
            self.target,
            remote_command,
        ]  # fmt: skip

    def _own_command(self) -> list[str]:
        """drover's command wins over a RemoteCommand (or a SessionType) in the user's config, with which ssh
        refuses any command-line one.  SessionType only when this ssh knows it (8.7 and later)."""
        words = ["-o", "RemoteCommand=none"]
        session = self.resolved().get("sessiontype")
        if session is not None and session != "default":
            words += ["-o", "SessionType=default"]
        return words

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
            *self._strict(), *self._own_command(), self.target, "true",
        ]  # fmt: skip

    def connect_line(self) -> str:
        """The connect command exactly as `drover connect` runs it (BatchMode=no, drover's known_hosts and the
        StrictHostKeyChecking raise included): the printed line must open the master when pasted."""
        return shlex.join(self.connect())


def classify(stderr: str) -> str | None:
    """The step ssh itself failed at (exit 255 with nothing from the remote side), or None when its message is not
    one of a connection that never carried the command (a master that died mid-request, say)."""
    for pattern, code in _FAILURES:
        if pattern.search(stderr):
            return code
    return None


def host_key_error(name: str, code: str, stderr: str, resolved: dict[str, str]) -> TransportError:
    """ssh's host-key failure said as over asyncssh: where, the fingerprint when ssh printed one (a changed key's
    warning does; BatchMode's "No ... host key is known" does not), and how to trust or replace the key."""
    found = re.search(r"host key is known for (\S+)|Host key for (\S+) has changed", stderr)
    # BatchMode with StrictHostKeyChecking ask says only "Host key verification failed.": ssh -G says where to.
    host, port = resolved.get("hostname", name), resolved.get("port", "22")
    where = (found.group(1) or found.group(2)) if found else host if port == "22" else f"[{host}]:{port}"
    printed = re.search(r"SHA256:[A-Za-z0-9+/=]+", stderr)
    fingerprint = printed.group(0) if printed else None
    details = {"fingerprint": fingerprint} if fingerprint else None
    if code == P.HOST_KEY_CHANGED:
        return TransportError(
            f"HOST KEY CHANGED for {where}: it now presents {fingerprint or 'another key'}, which is not the key in "
            "known_hosts. This may be an attack; drover will not connect",
            host=name,
            code=code,
            hint=f"if the host was reinstalled, remove the old key with `ssh-keygen -R '{where}'` and check the new one",
            details=details,
        )
    bracketed = re.fullmatch(r"\[([^\]]+)\]:(\d+)", where)
    scan = f"ssh-keyscan -p {bracketed.group(2)} {bracketed.group(1)}" if bracketed else f"ssh-keyscan {where}"
    return TransportError(
        f"unknown host key for {where}" + (f": {fingerprint}" if fingerprint else ""),
        host=name,
        code=code,
        hint=f"check its fingerprint (`{scan} | ssh-keygen -lf -`) and if it is the host's, trust it with "
        f"`{scan} >> ~/.ssh/known_hosts`, or set accept_new = true under [hosts.{name}] in fleet.toml",
        details=details,
    )
