"""The host's own drover record, read for lifecycle events: a worker's `drover done` on this host is written here.

A worker on an SSH host runs `drover done` there, and drover on that host writes the `done` event into that
host's own truth file (its user's drover home).  A coordinator elsewhere sees that end only by asking the host:
`list` / `status` (with `lifecycle`), `wait_many` (a `done` settles a wait for it) and the `lifecycle` op read
it here, in the same request they already make.

Where the record is: found exactly as drover/paths.py finds the home on this host (DROVER_HOME, ~ expanded; else
$XDG_STATE_HOME/drover; else ~/.local/state/drover), then `truth.jsonl` in it -- and trusted as
drover/truth_home.py trusts it: opened read-only without following a link, a regular file of this user, not
writable by group or others, with no second hard link; the home a real directory of this user (or a link made by
this user), not writable by others.  Anything else is no record: a warning, never a crash, never a `done`.

Only the end of the file is read, backwards, in blocks, with a bound (MAX_BYTES, or the caller's smaller one,
and a since-time): `ls` asks this of every host it lists, and a record can be hundreds of megabytes.  Events
are about this host's own sessions, so their `host` is `local` (how `drover done` writes it) and they are matched
by identity only -- a name is reused by the next session, and another session's `done` must never be taken.
"""

import errno
import json
import os
import stat
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

NAME = "truth.jsonl"
KINDS = ("done", "failed", "exited")
BLOCK = 64 * 1024
MAX_BYTES = 8 * 1024 * 1024  # at most this much of the record's end is read for one request
SLACK_S = 2.0  # the record is in write order; a clock that stepped back a little must not end the look early
FIELDS = ("event", "id", "ts", "time", "host", "session", "spawn", "summary", "evidence", "actor", "report_to")


class Unusable(Exception):
    """The record is there but may not be trusted (or read): why, in one line."""


def home(given: Optional[Mapping[str, str]] = None) -> str:
    """The drover home as drover/paths.py home() finds it (mirrored: the host side imports nothing of drover's)."""
    env = os.environ if given is None else given  # type: Mapping[str, str]
    named = env.get("DROVER_HOME")
    if named:
        return os.path.expanduser(named)
    base = env.get("XDG_STATE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "drover")


def _check(st: os.stat_result, what: str, kind: str) -> None:
    me = os.geteuid()
    if st.st_uid != me:
        raise Unusable("%s belongs to uid %d, not to this user (uid %d): not trusted" % (what, st.st_uid, me))
    if st.st_mode & 0o022:
        raise Unusable("%s is writable by group or others (mode %04o): not trusted" % (what, stat.S_IMODE(st.st_mode)))
    if kind == "file":
        if not stat.S_ISREG(st.st_mode):
            raise Unusable("%s is not a regular file: not read" % what)
        if st.st_nlink > 1:
            raise Unusable("%s has %d hard links: not trusted" % (what, st.st_nlink))


def open_record(path_home: Optional[str] = None) -> Tuple[Optional[int], str]:
    """(a read-only fd on the record, its path); (None, path) when there is none yet.  Unusable when it may not be
    trusted or read."""
    where = path_home or home()
    path = os.path.join(where, NAME)
    try:
        lst = os.lstat(where)
    except FileNotFoundError:
        return None, path
    except OSError as exc:
        raise Unusable("cannot look at %s: %s" % (where, exc.strerror or exc)) from None
    flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
    if stat.S_ISLNK(lst.st_mode):
        if lst.st_uid != os.geteuid():
            raise Unusable("%s is a symlink made by uid %d, not by this user: not trusted" % (where, lst.st_uid))
    else:
        flags |= os.O_NOFOLLOW
    try:
        dfd = os.open(where, flags)
    except FileNotFoundError:
        return None, path
    except OSError as exc:
        raise Unusable("cannot open %s: %s" % (where, exc.strerror or exc)) from None
    try:
        _check(os.fstat(dfd), where, "directory")
        try:
            fd = os.open(NAME, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=dfd)
        except FileNotFoundError:
            return None, path
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Unusable("%s is a symlink: drover does not follow links to its record" % path) from None
            raise Unusable("cannot read %s: %s" % (path, exc.strerror or exc)) from None
    finally:
        os.close(dfd)
    try:
        _check(os.fstat(fd), path, "file")
    except BaseException:
        os.close(fd)
        raise
    return fd, path


def _lines_backward(fd: int, limit: int) -> Iterator[bytes]:
    """The whole lines of the file's last `limit` bytes, newest first (a line cut by the bound is left out, and so
    is a last line a writer has not finished)."""
    end = os.fstat(fd).st_size
    floor = max(0, end - limit)
    pos = end
    carry = b""
    pending = True  # still inside what follows the file's last newline: a line not finished yet
    while pos > floor:
        start = max(floor, pos - BLOCK)
        block = os.pread(fd, pos - start, start)
        if not block:
            return
        pos = start
        parts = (block + carry).split(b"\n")
        if pending:
            if len(parts) == 1:
                carry = b""
                continue
            parts, pending = parts[:-1], False
        carry = parts[0]
        for raw in reversed(parts[1:]):
            if raw.strip():
                yield raw
    if floor == 0 and not pending and carry.strip():
        yield carry  # the file's first line (a line begun before the bound is not whole: left out)


def _wanted(ev: Dict[str, Any], identities: Iterable[str]) -> Optional[str]:
    session = ev.get("session")
    if ev.get("host") != "local" or not isinstance(session, dict):
        return None  # an event this host's drover wrote about a session on another host: not this host's own
    ident = session.get("identity")
    return ident if isinstance(ident, str) and ident in identities else None


def events(
    identities: Iterable[str],
    kinds: Iterable[str] = KINDS,
    max_bytes: Optional[int] = None,
    since: Optional[float] = None,
    path_home: Optional[str] = None,
    newest_only: bool = False,
) -> Dict[str, Any]:
    """The lifecycle events of `kinds` about these identities in this host's record, newest first.

    {"record": PATH, "events": [...], "read_bytes": N, "complete": whether the whole record was looked at,
    "warnings": [...]}.  `newest_only`: one event per identity (the newest), and the look ends once each has one."""
    wanted = set(i for i in identities if isinstance(i, str) and i)
    kinds = tuple(k for k in kinds if k in KINDS)
    limit = MAX_BYTES if not max_bytes else max(1, min(int(max_bytes), MAX_BYTES))
    out = {"record": None, "events": [], "read_bytes": 0, "complete": True, "warnings": []}  # type: Dict[str, Any]
    try:
        fd, path = open_record(path_home)
    except Unusable as exc:
        out["warnings"].append("this host's drover record was not read: %s" % exc)
        return out
    out["record"] = path
    if fd is None or not wanted or not kinds:
        if fd is not None:
            os.close(fd)
        return out
    needles = tuple(('"event":"%s"' % k).encode() for k in kinds)
    found: List[Dict[str, Any]] = []
    seen = set()  # type: set
    try:
        size = os.fstat(fd).st_size
        out["read_bytes"] = min(size, limit)
        out["complete"] = size <= limit
        for raw in _lines_backward(fd, limit):
            if not any(n in raw for n in needles):
                continue  # most lines are messages: passed over unparsed
            try:
                ev = json.loads(raw.decode("utf-8", "replace"))
            except ValueError:
                continue
            if not isinstance(ev, dict) or ev.get("event") not in kinds:
                continue
            ts = ev.get("ts")
            if since is not None and isinstance(ts, (int, float)) and ts < since - SLACK_S:
                out["complete"] = True  # everything after the since-time was looked at
                break
            ident = _wanted(ev, wanted)
            if ident is None or (newest_only and ident in seen):
                continue
            seen.add(ident)
            found.append({k: ev[k] for k in FIELDS if k in ev})
            if newest_only and seen >= wanted:
                break
    except OSError as exc:
        out["warnings"].append("this host's drover record could not be read to its end: %s" % (exc.strerror or exc))
    finally:
        os.close(fd)
    for ev in found:
        ev["record"] = path
    out["events"] = found
    return out


def newest_by_identity(
    identities: Iterable[str], kinds: Iterable[str] = ("done", "failed")
) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """({identity: its newest event}, the look's facts and warnings): what list / status attach to sessions."""
    got = events(identities, kinds, newest_only=True)
    by = {}  # type: Dict[str, Any]
    for ev in got["events"]:
        by.setdefault(ev["session"]["identity"], ev)
    return by, got


def lifecycle(args: Dict[str, Any], profiles: Any) -> Dict[str, Any]:
    """The `lifecycle` op: this host's record's lifecycle events about `identities`, newest first."""
    from . import protocol as P
    from .protocol import HelperError

    identities = args.get("identities")
    if not isinstance(identities, list) or not all(isinstance(i, str) for i in identities):
        raise HelperError(P.BAD_REQUEST, "identities must be a list of session identities")
    kinds = args.get("kinds") or list(KINDS)
    if not isinstance(kinds, list) or any(k not in KINDS for k in kinds):
        raise HelperError(P.BAD_REQUEST, "kinds must be a list of %s" % ", ".join(KINDS))
    since = args.get("since")
    if since is not None and (isinstance(since, bool) or not isinstance(since, (int, float))):
        raise HelperError(P.BAD_REQUEST, "since must be a Unix time")
    max_bytes = args.get("max_bytes")
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0):
        raise HelperError(P.BAD_REQUEST, "max_bytes must be a positive number of bytes")
    return events(identities, kinds, max_bytes=max_bytes, since=since)
