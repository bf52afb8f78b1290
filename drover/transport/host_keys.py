"""Host keys: which known_hosts files drover trusts, and the verdict on a key asyncssh could not find in them.

An unknown key is an error that prints the fingerprint and how to trust it; a changed key is a loud error;
`accept_new = true` trusts on first use and records the key in drover's own known_hosts (or the host's own file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncssh

from drover import paths
from drover.errors import TransportError
from drover.fleet import HostConfig
from drover.remote import protocol as P


def drover_known_hosts() -> Path:
    return Path(paths.known_hosts())


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
            return TransportError("the host key could not be verified", host=self.name, code=P.HOST_KEY)
        host, port, key = self.seen
        where = host if port == 22 else f"[{host}]:{port}"
        fingerprint = key.get_fingerprint("sha256")
        if self.verdict == "changed":
            return TransportError(
                f"HOST KEY CHANGED for {where}: it now presents {fingerprint}, which is not the key in known_hosts. "
                "This may be an attack; drover will not connect",
                host=self.name,
                code=P.HOST_KEY_CHANGED,
                hint=f"if the host was reinstalled, remove the old key with `ssh-keygen -R '{where}'` and check the new one",
                details={"fingerprint": fingerprint},
            )
        scan = f"ssh-keyscan -p {port} {host}" if port != 22 else f"ssh-keyscan {host}"
        return TransportError(
            f"unknown host key for {where}: {key.get_algorithm()} {fingerprint}",
            host=self.name,
            code=P.UNKNOWN_HOST_KEY,
            hint=f"if that is the host's fingerprint, trust it with `{scan} >> ~/.ssh/known_hosts`, "
            f"or set accept_new = true under [hosts.{self.name}] in fleet.toml",
            details={"fingerprint": fingerprint},
        )


def known_hosts_data(cfg: HostConfig) -> bytes:
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
