"""Shell completion: hosts, host expressions, session targets, tags and op names -- never a connection to a host.

Session names come from the last `drover ls`: it leaves what each host answered in DROVER_HOME/completion.json
(0600, never through a symlink), and a completion offers the sessions seen there in the last TTL_S seconds.  A
completion runs on every Tab: it reads local files only, and any trouble with them is no candidates, never a
traceback in the user's shell.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import typer

CACHE_FILE = "completion.json"
TTL_S = 600.0  # sessions come and go: a name seen longer ago than this is not offered
MAX_BYTES = 4 << 20


def _path() -> Path:
    from drover.truth import default_home

    return default_home() / CACHE_FILE


def _read(path: Path) -> dict[str, Any]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                return {}
            data = json.loads(f.read(MAX_BYTES))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _target_id(session: dict[str, Any]) -> str | None:
    """How a session is named in a target, as `drover ls` shows it: its name, else its id."""
    name = session.get("name")
    if isinstance(name, str) and name:
        return name
    sid = session.get("id")
    if not isinstance(sid, str) or not sid:
        return None
    if session.get("engine") == "claude" and len(sid) > 12:
        return sid[:8]  # a unique prefix of the sessionId names it
    server = session.get("server")
    return sid if server in (None, "default") else f"{server}/{sid}"


def remember(data: Any, now: float | None = None) -> None:
    """Keep the sessions of the hosts that answered this `ls` (the others' stay as they were); best effort."""
    if not isinstance(data, dict):
        return
    now = time.time() if now is None else now
    answered = {
        h["host"] for h in data.get("hosts") or [] if isinstance(h, dict) and h.get("ok") and isinstance(h.get("host"), str)
    }
    if not answered:
        return
    path = _path()
    hosts = {k: v for k, v in _read(path).get("hosts", {}).items() if k not in answered and isinstance(v, dict)}
    for host in sorted(answered):
        hosts[host] = {"ts": now, "targets": []}
    for s in data.get("sessions") or []:
        if isinstance(s, dict) and s.get("host") in answered:
            target = _target_id(s)
            if target and target.isprintable() and not any(c.isspace() for c in target):
                hosts[s["host"]]["targets"].append(target)
    tmp = path.with_name(f".{CACHE_FILE}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"hosts": hosts}, f)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass


def session_targets(now: float | None = None) -> list[str]:
    """HOST:ID of every session the last `ls` of each host saw, if it was recent."""
    now = time.time() if now is None else now
    out: list[str] = []
    for host, entry in _read(_path()).get("hosts", {}).items():
        if not isinstance(entry, dict) or not isinstance(entry.get("ts"), (int, float)):
            continue
        if not 0 <= now - entry["ts"] <= TTL_S:
            continue
        out += [f"{host}:{t}" for t in entry.get("targets") or [] if isinstance(t, str)]
    return sorted(out)


def _fleet(ctx: Any) -> Any:
    """The fleet the command line names (--fleet before or after the command), else $DROVER_FLEET or the default."""
    from drover import fleet as fleet_mod

    path, at = None, ctx  # typer's Context, then click's for the parents
    while at is not None and path is None:
        path = at.params.get("fleet")
        at = at.parent
    return fleet_mod.load(path)[0]


def complete_target(ctx: typer.Context, incomplete: str) -> list[str]:
    """HOST:ID: the fleet's hosts, and the sessions the last `drover ls` saw (no host is asked)."""
    try:
        names = _fleet(ctx).host_names()
        known = set(names)
        candidates = [f"{name}:" for name in names]
        candidates += [t for t in session_targets() if t.split(":", 1)[0] in known]
    except Exception:  # noqa: BLE001 - completion must never print a traceback into the user's shell
        return []
    return [c for c in dict.fromkeys(candidates) if c.startswith(incomplete)]


def complete_hosts(ctx: typer.Context, incomplete: str) -> list[str]:
    """A host expression's last item: `h1,!h` offers `h1,!h2`, `h1,!h3`, ..."""
    head, comma, item = incomplete.rpartition(",")
    prefix = head + comma
    if item.startswith("!"):
        prefix, item = prefix + "!", item[1:]
    try:
        names = _fleet(ctx).host_names()
    except Exception:  # noqa: BLE001 - as above
        return []
    return [prefix + name for name in names if name.startswith(item)]


def complete_tags(ctx: typer.Context, incomplete: str) -> list[str]:
    try:
        hosts = _fleet(ctx).hosts.values()
    except Exception:  # noqa: BLE001 - as above
        return []
    tags = sorted({tag for host in hosts for tag in host.tags})
    return [tag for tag in tags if tag.startswith(incomplete)]


def complete_op(incomplete: str) -> list[str]:
    try:
        from drover.ops import REGISTRY
    except Exception:  # noqa: BLE001 - as above
        return []
    return [name for name in sorted(REGISTRY) if name.startswith(incomplete)]


def complete_engines(ctx: typer.Context, incomplete: str) -> list[str]:
    """The engines drover knows: built in, and the fleet's [engines.NAME] and [spawn.NAME] tables."""
    try:
        from drover.remote.profiles import BUILTIN_PROFILES

        names = set(BUILTIN_PROFILES) - {"unknown"}
        try:
            fleet = _fleet(ctx)
            names |= set(fleet.engines) | set(fleet.spawn)
        except Exception:  # noqa: BLE001 - a broken fleet still leaves the built-in engines to offer
            pass
    except Exception:  # noqa: BLE001 - as above
        return []
    return [name for name in sorted(names) if name.startswith(incomplete)]


def complete_nudge_target(ctx: typer.Context, incomplete: str) -> list[str]:
    """`drover nudge`'s first word: a HOST:ID, or `run`."""
    return (["run"] if "run".startswith(incomplete) else []) + complete_target(ctx, incomplete)
