"""A real OpenSSH test fleet on loopback: one sshd (per 16 hosts), one address per host, each with its own state.

Host N listens on 127.0.0.(10+N) at one free port; a `Match LocalAddress` block gives each host its own HOME
and TMUX_TMPDIR, so each has its own tmux servers (and Claude registry) and a test can tell which host
answered. The client side gets its own HOME with `.ssh/config` aliases, a key and a known_hosts file, exactly
as a user's machine would have them. Only the processes it starts are stopped.

By hand (a developer's fleet to poke at):

    python -m tests.support.sshfleet 3            # prints the environment and fleet file to use; Ctrl-C stops it
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"
# sshd (LogLevel VERBOSE) for each connection it accepts: "Connection from 127.0.0.1 port 5123 on 127.0.0.11 port 2222"
CONNECTION = re.compile(r"Connection from \S+ port \d+ on (\S+) port \d+")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path, comment: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip() if path.suffix else Path(f"{path}.pub").read_text().strip()


class SSHFleet:
    def __init__(
        self, count: int = 3, root: Path | None = None, sshd_options: list[str] | None = None, second_factor: bool = False
    ) -> None:
        self.count = count
        # Every login needs the key *and* a one-time code (keyboard-interactive through PAM): see _second_factor.
        self.second_factor = second_factor
        self.pam_service: Path | None = None
        # More sshd_config lines for every sshd (the benchmark's `KexAlgorithms curve25519-sha256`).
        self.sshd_options = list(sshd_options or [])
        # Short paths: tmux and sshd sockets live under here, and Unix socket paths are limited to 108 bytes.
        self.root = root or Path(tempfile.mkdtemp(prefix="drf-"))
        self.port = free_port()
        self.user = getpass.getuser()
        self.names = [f"h{i}" for i in range(1, count + 1)]
        # Addresses sshd also listens on but that no known_hosts file lists: for the host-key tests.
        # (On 127.0.1.x: hosts take 127.0.0.11 and up, and a fleet of more than 10 would otherwise share them.)
        self.spare = ["127.0.1.21", "127.0.1.22"]
        # A host with no tmux (nor anything else) on its PATH: for the remote-side error tests.
        self.bare = "127.0.1.23"
        self.procs: list[subprocess.Popen[bytes]] = []

    # -- layout ----------------------------------------------------------------------------------------------
    def addr(self, name: str) -> str:
        return f"127.0.0.{10 + self.names.index(name) + 1}"

    def host_home(self, name: str) -> Path:
        return self.root / name

    def host_env(self, name: str) -> dict[str, str]:
        home = self.host_home(name)
        return {"HOME": str(home), "TMUX_TMPDIR": str(home / "t"), "DROVER_TEST_HOST": name}

    @property
    def client_home(self) -> Path:
        return self.root / "client"

    @property
    def known_hosts(self) -> Path:
        return self.client_home / ".ssh" / "known_hosts"

    @property
    def host_key_line(self) -> str:
        return (self.root / "sshd" / "host_ed25519.pub").read_text().strip()

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> SSHFleet:
        sshd_dir = self.root / "sshd"
        ssh_dir = self.client_home / ".ssh"
        sshd_dir.mkdir(parents=True)
        ssh_dir.mkdir(parents=True, mode=0o700)
        keygen(sshd_dir / "host_ed25519", "drover-test-host")
        client_pub = keygen(ssh_dir / "id_ed25519", "drover-test-client")
        (sshd_dir / "authorized_keys").write_text(client_pub + "\n")
        # sshd reads authorized_keys as the user logging in: the test users with their own shells need a way in.
        for path, mode in ((self.root, 0o711), (sshd_dir, 0o711), (sshd_dir / "authorized_keys", 0o644)):
            path.chmod(mode)
        for name in [*self.names, "spare"]:
            (self.host_home(name) / "t").mkdir(parents=True)
        sshd = SSHD
        if self.second_factor:
            sshd, auth = self._second_factor(sshd_dir)
        else:
            auth = ["UsePAM no", "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password"]
        common = [
            f"HostKey {sshd_dir / 'host_ed25519'}",
            f"AuthorizedKeysFile {sshd_dir / 'authorized_keys'}",
            "StrictModes no",
            *auth,
            "PasswordAuthentication no",
            "PrintMotd no",
            "MaxStartups 500",
            "MaxSessions 100",
            # VERBOSE: sshd logs every TCP connection it accepts, with the address it came in on (connections()).
            "LogLevel VERBOSE",
            *self.sshd_options,
        ]
        # Real users with their own login shells (see shell_user): sshd applies the first SetEnv that matches, so
        # this block, first, keeps the per-address HOME below away from them.
        common += ["Match User drsh-*", "    SetEnv DROVER_TEST_HOST=shell-user"]
        for name in self.names:
            env = " ".join(f"{k}={v}" for k, v in self.host_env(name).items())
            common += [f"Match LocalAddress {self.addr(name)}", f"    SetEnv {env}"]
            if name == "h1":
                common.append("    AllowTcpForwarding no")  # h1 is no jump host: the ProxyJump test relies on it
        spare_home = self.host_home("spare")
        common += [f"Match LocalAddress {','.join(self.spare)}", f"    SetEnv HOME={spare_home} TMUX_TMPDIR={spare_home}/t"]
        common += [
            f"Match LocalAddress {self.bare}",
            f"    SetEnv HOME={spare_home} TMUX_TMPDIR={spare_home}/t PATH=/nonexistent",
        ]
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        # sshd listens on at most 16 sockets: one sshd per 16 addresses (the benchmark wants more hosts).
        addresses = [*self.spare, self.bare, *(self.addr(n) for n in self.names)]
        self.log = open(sshd_dir / "sshd.log", "wb")
        for i in range(0, len(addresses), 16):
            config = sshd_dir / f"sshd_config.{i // 16}"
            listen = [f"ListenAddress {a}:{self.port}" for a in addresses[i : i + 16]]
            config.write_text("\n".join([*listen, f"PidFile {sshd_dir / f'sshd.{i // 16}.pid'}", *common]) + "\n")
            check = subprocess.run([sshd, "-t", "-f", str(config)], capture_output=True, text=True)
            if check.returncode != 0:
                raise RuntimeError(f"sshd rejected its config: {check.stderr}")
            self.procs.append(subprocess.Popen([sshd, "-D", "-e", "-f", str(config)], stdout=self.log, stderr=subprocess.STDOUT))
        self._wait_listening()
        # sshd logs those probes from the children it forked for them, maybe later: what connections() counts
        # from a log_mark taken now must not include them.
        deadline = time.monotonic() + 30
        while min(self.connections().values()) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        host_key = self.host_key_line.split()
        self.known_hosts.write_text("".join(f"[{self.addr(n)}]:{self.port} {host_key[0]} {host_key[1]}\n" for n in self.names))
        self.known_hosts.chmod(0o600)
        (ssh_dir / "config").write_text(
            "".join(
                f"Host {n}\n    HostName {self.addr(n)}\n    Port {self.port}\n    User {self.user}\n"
                f"    IdentityFile {ssh_dir / 'id_ed25519'}\n    BatchMode yes\n"
                for n in self.names
            )
        )
        return self

    # -- the second factor ------------------------------------------------------------------------------------
    def _second_factor(self, sshd_dir: Path) -> tuple[str, list[str]]:
        """sshd wanting the key, then a one-time code (keyboard-interactive through PAM, pam_exec checking the code
        file): what an HPC login node with a second factor asks.  sshd names its PAM service after the name it runs
        under, so it runs through a symlink whose name is this fleet's own service (needs root to write
        /etc/pam.d; removed by stop())."""
        if os.geteuid() != 0:
            raise RuntimeError("the second-factor sshd needs root: it writes its PAM service into /etc/pam.d")
        if not Path("/lib/x86_64-linux-gnu/security/pam_exec.so").exists() and not any(
            Path(d, "pam_exec.so").exists() for d in ("/lib/security", "/usr/lib/security", "/usr/lib64/security")
        ):
            raise RuntimeError("pam_exec is missing (apt-get install libpam-modules)")
        check = sshd_dir / "otp-check"
        check.write_text(
            "#!/bin/sh\n"
            "# pam_exec hands the typed code on stdin (expose_authtok); each attempt is logged for the tests.\n"
            "code=$(tr -d '\\000\\n')\n"
            f'echo "$PAM_USER $code" >> {self.otp_log}\n'
            f'[ -n "$code" ] && [ "$code" = "$(cat {self.otp_file})" ]\n'
        )
        check.chmod(0o755)
        self.otp_file.write_text("424242\n")
        self.otp_log.touch()
        name = f"drover-otp-{self.root.name}"
        self.pam_service = Path("/etc/pam.d") / name
        self.pam_service.write_text(
            f"auth required pam_exec.so expose_authtok quiet {check}\nauth required pam_permit.so\n"
            "account required pam_permit.so\nsession required pam_permit.so\npassword required pam_deny.so\n"
        )
        link = sshd_dir / name
        link.symlink_to(SSHD)
        auth = [
            "UsePAM yes",
            "KbdInteractiveAuthentication yes",
            "AuthenticationMethods publickey,keyboard-interactive",
            "PermitRootLogin yes",  # prohibit-password would refuse root the keyboard-interactive step
        ]
        return str(link), auth

    @property
    def otp_file(self) -> Path:
        return self.root / "sshd" / "otp-code"

    @property
    def otp_log(self) -> Path:
        return self.root / "sshd" / "otp-attempts"

    def otp_attempts(self) -> list[str]:
        return self.otp_log.read_text().splitlines() if self.otp_log.exists() else []

    def _wait_listening(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        for addr in [*(self.addr(n) for n in self.names), *self.spare, self.bare]:
            while True:
                try:
                    socket.create_connection((addr, self.port), timeout=1).close()
                    break
                except OSError:
                    if any(p.poll() is not None for p in self.procs):
                        raise RuntimeError("sshd exited: " + (self.root / "sshd" / "sshd.log").read_text()) from None
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"sshd did not listen on {addr}:{self.port}") from None
                    time.sleep(0.05)

    def fleet_toml(self, extra: str = "") -> str:
        hosts = "".join(f'[hosts.{n}]\nssh = "{n}"\n' for n in self.names)
        return "[defaults]\nconnect_timeout = 5.0\nrequest_timeout = 20.0\n\n" + hosts + extra

    @staticmethod
    def shell_user(shell: str) -> str:
        """A real Unix user whose login shell is `shell` (bash, zsh, fish, tcsh), created on first use (needs root).

        It logs in with the fleet's client key (AuthorizedKeysFile is shared) to any host address; it has its own
        HOME, tmux servers and python3 (the system's), as a colleague's account on a shared machine would.
        """
        import pwd

        user = f"drsh-{shell}"
        path = shutil.which(shell)
        if path is None:
            raise RuntimeError(f"{shell} is not installed (the README's test command installs it)")
        try:
            entry = pwd.getpwnam(user)
            if entry.pw_shell != path:
                subprocess.run(["usermod", "-s", path, user], check=True, capture_output=True)
        except KeyError:
            subprocess.run(["useradd", "-m", "-s", path, user], check=True, capture_output=True)
        # useradd leaves the password "!" (locked), and sshd without PAM refuses a locked account even for key
        # auth; "*" means no password can match, without locking the account.
        subprocess.run(["usermod", "-p", "*", user], check=True, capture_output=True)
        return user

    def log_mark(self) -> int:
        """Where sshd's log ends now: connections() counts from here."""
        self.log.flush()
        return (self.root / "sshd" / "sshd.log").stat().st_size

    def connections(self, since: int = 0) -> dict[str, int]:
        """Per host, the TCP connections its sshd accepted since `since` (a log_mark): sshd's own count, whatever
        the client believes it opened."""
        text = (self.root / "sshd" / "sshd.log").read_bytes()[since:].decode("utf-8", "replace")
        by_addr = {self.addr(n): n for n in self.names}
        counts = {n: 0 for n in self.names}
        for m in CONNECTION.finditer(text):
            if m.group(1) in by_addr:
                counts[by_addr[m.group(1)]] += 1
        return counts

    @property
    def client_key(self) -> Path:
        return self.client_home / ".ssh" / "id_ed25519"

    def tmux(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        """Run tmux as the given host's user would there (same machine, that host's TMUX_TMPDIR)."""
        return subprocess.run(
            ["tmux", *args], env={**os.environ, **self.host_env(name)}, capture_output=True, text=True, timeout=10
        )

    def kill_tmux(self) -> None:
        for name in [*self.names, "spare"]:
            sockdir = self.host_home(name) / "t" / f"tmux-{os.getuid()}"
            if sockdir.exists():
                for sock in sockdir.iterdir():
                    subprocess.run(["tmux", "-S", str(sock), "kill-server"], capture_output=True, timeout=10)

    def stop(self) -> None:
        self.kill_tmux()
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        if self.pam_service is not None:
            self.pam_service.unlink(missing_ok=True)
        shutil.rmtree(self.root, ignore_errors=True)


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    fleet = SSHFleet(count).start()
    fleet_file = fleet.root / "fleet.toml"
    fleet_file.write_text(fleet.fleet_toml())
    print(f"sshd on port {fleet.port}, hosts: {', '.join(f'{n}={fleet.addr(n)}' for n in fleet.names)}")
    print("use it with:")
    print(f"  export HOME={fleet.client_home} DROVER_FLEET={fleet_file}")
    print("  drover fleet check; drover ls")
    print(f"start a pane on h1:  HOME={fleet.host_home('h1')} TMUX_TMPDIR={fleet.host_home('h1')}/t tmux new -d")
    print("Ctrl-C stops the fleet and removes it.")
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        fleet.stop()


if __name__ == "__main__":
    main()
