"""Waiting for a file on this host: until it exists, or until it changes -- how a coordinator waits on its workers'
status files without a loop of requests over SSH.

On Linux the helper asks the kernel (inotify, through ctypes on libc) to report the file's *directory*, so a file
that does not exist yet can be waited for, and every way a status file is written is seen: created, written and
closed (IN_CLOSE_WRITE), renamed into place (IN_MOVED_TO, the atomic write), touched (IN_ATTRIB).  A write that
is still going on is reported once its writer closes the file, or once it has been quiet for SETTLE_S.  Elsewhere
(or where inotify cannot be had) it looks at the file with stat, every POLL_MIN_S rising to POLL_MAX_S.

What "changed" means is decided by stat alone -- another inode, size or mtime than the baseline -- never by the
events, which only say when to look: so a change made between the request and the watch being set is seen by
the look right after the watch is set, and a kernel event lost to an overflowing queue costs nothing.  The helper
also looks every POLL_MAX_S while it waits, so a file written by another machine (NFS, where inotify sees only
local writers) is still noticed.
"""

import ctypes
import os
import select
import stat
import struct
import sys
import time
from typing import Any, Dict, Optional, Tuple

from . import caller
from . import protocol as P
from .protocol import HelperError

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000

# Events on the file's name that mean "it is complete now" and those that mean "someone is writing it".
DONE = IN_CLOSE_WRITE | IN_MOVED_TO
WRITING = IN_CREATE | IN_MODIFY | IN_ATTRIB
WATCH = DONE | WRITING | IN_MOVED_FROM | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
DIR_GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED

SETTLE_S = 0.25  # a write seen but not closed: reported after this long without another
POLL_MIN_S = 0.1
POLL_MAX_S = 1.0
DIR_GRACE_S = 1.0  # the directory gone: how long a new one at its path is looked for before the wait fails
EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name, NUL-padded)

Sig = Tuple[int, int, int, int]  # (device, inode, size, mtime in ns): what "changed" compares


def resolve(path: Any) -> str:
    """The absolute path: `~` and `~user` expanded, a relative path taken from the home directory."""
    if not isinstance(path, str) or not path.strip():
        raise HelperError(P.BAD_REQUEST, "no path given: name the file to wait for (relative to the home directory)")
    if "\0" in path:
        raise HelperError(P.BAD_REQUEST, "the path holds a NUL character: no file can have that name")
    full = os.path.expanduser(path)
    if full.startswith("~"):
        raise HelperError(P.NO_SUCH_DIRECTORY, "cannot expand %r: there is no such user on this host" % path.split("/")[0])
    if not os.path.isabs(full):
        full = os.path.join(os.path.expanduser("~"), full)
    # Not normalised lexically: `link/../x` means what the OS makes of it (the parent of where link points), so the
    # directory part is resolved as the OS resolves it, and the file's own name is kept as given.
    trimmed = full.rstrip("/") or "/"
    directory, name = os.path.split(trimmed)
    if name in ("", ".", ".."):
        raise HelperError(P.BAD_REQUEST, "%s names a directory, not a file: name the file to wait for" % path)
    try:
        return os.path.join(os.path.realpath(directory), name)
    except OSError as exc:  # ELOOP, ENAMETOOLONG under Python 3.13's strict realpath, or a path too long
        raise _path_error(directory, exc) from None


def _path_error(where: str, exc: OSError) -> HelperError:
    """An OSError of a path that is no file system's business to answer: said in words, never as a raw errno."""
    import errno

    if exc.errno == errno.ELOOP:
        return HelperError(P.NO_SUCH_DIRECTORY, "%s: too many levels of symbolic links (a symlink loop)" % where)
    if exc.errno == errno.ENAMETOOLONG:
        return HelperError(P.BAD_REQUEST, "the path is too long for this host, or a name in it is (%d characters)" % len(where))
    return HelperError(P.NO_SUCH_DIRECTORY, "%s cannot be looked at: %s" % (where, exc.strerror or exc))


def check_directory(directory: str) -> None:
    """The directory the file is (to be) in must exist and be ours to look into; anything else is said plainly."""
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        raise HelperError(
            P.NO_SUCH_DIRECTORY,
            "the directory %s does not exist on this host: create it first (the file's directory must exist)" % directory,
        ) from None
    except NotADirectoryError:
        raise HelperError(P.NO_SUCH_DIRECTORY, "%s is not a directory (a part of the path is a file)" % directory) from None
    except PermissionError:
        raise HelperError(P.PERMISSION_DENIED, "permission denied: this user cannot look into %s" % directory) from None
    except OSError as exc:
        raise _path_error(directory, exc) from None
    if not stat.S_ISDIR(st.st_mode):
        raise HelperError(P.NO_SUCH_DIRECTORY, "%s is not a directory" % directory)
    if not os.access(directory, os.X_OK):
        raise HelperError(P.PERMISSION_DENIED, "permission denied: this user cannot look into %s" % directory)


def signature(path: str) -> Optional[Sig]:
    """The file's identity and content markers, or None when it does not exist."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:
        raise HelperError(P.PERMISSION_DENIED, "permission denied: this user cannot look at %s" % path) from None
    except OSError as exc:
        raise _path_error(path, exc) from None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _baseline(given: Any) -> Optional[Sig]:
    """A baseline the caller kept from an earlier answer (so nothing between two waits is missed)."""
    if not isinstance(given, dict):
        raise HelperError(P.BAD_REQUEST, "baseline must be an earlier answer's {device, inode, size, mtime_ns}")
    said = "baseline must hold device, inode, size and mtime_ns as whole numbers (from an earlier answer)"
    values = []
    for key in ("device", "inode", "size", "mtime_ns"):
        value = given.get(key)
        # Whole, finite numbers only: 1e400 (inf), NaN, 1.5 or true are no stat an earlier answer gave.
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise HelperError(P.BAD_REQUEST, said)
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf")) or not value.is_integer()):
            raise HelperError(P.BAD_REQUEST, said)
        values.append(int(value))
    return (values[0], values[1], values[2], values[3])


class Inotify:
    """One inotify watch on a directory, through libc (ctypes: the helper installs nothing)."""

    def __init__(self, directory: str) -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            init, add = libc.inotify_init1, libc.inotify_add_watch
        except (OSError, AttributeError):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            init, add = libc.inotify_init1, libc.inotify_add_watch
        add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.fd = init(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        self.wd = add(self.fd, os.fsencode(directory), WATCH)
        if self.wd < 0:
            err = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(err, os.strerror(err))

    def read(self, timeout: float) -> Tuple[Dict[bytes, int], int]:
        """({name: mask} of the events that came within timeout, mask of the events on the directory itself)."""
        names: Dict[bytes, int] = {}
        own = 0
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        while ready:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            offset = 0
            while offset + EVENT.size <= len(data):
                _wd, mask, _cookie, length = EVENT.unpack_from(data, offset)
                name = data[offset + EVENT.size : offset + EVENT.size + length].rstrip(b"\0")
                offset += EVENT.size + length
                if name:
                    names[name] = names.get(name, 0) | mask
                else:
                    own |= mask
            ready, _, _ = select.select([self.fd], [], [], 0)
        return names, own

    def close(self) -> None:
        os.close(self.fd)


def _watcher(directory: str, poll: bool) -> Tuple[Optional[Inotify], str]:
    if poll:
        return None, "poll (asked for)"
    if not sys.platform.startswith("linux"):
        return None, "poll (no inotify on %s)" % sys.platform
    try:
        return Inotify(directory), "inotify"
    except OSError as exc:
        import errno

        if exc.errno == errno.EACCES:
            raise HelperError(P.PERMISSION_DENIED, "permission denied: this user cannot watch %s" % directory) from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise HelperError(P.NO_SUCH_DIRECTORY, "the directory %s went away" % directory) from None
        return None, "poll (inotify unavailable: %s)" % (exc.strerror or exc)


def _answer(path: str, event: Optional[str], now: Optional[Sig], how: str, started: float) -> Dict[str, Any]:
    out: Dict[str, Any] = {"path": path, "reached": event is not None, "event": event, "exists": now is not None, "how": how}
    if now is not None:
        out.update(device=now[0], inode=now[1], size=now[2], mtime_ns=now[3], mtime=now[3] / 1e9)
    out["waited_s"] = round(time.monotonic() - started, 3)
    return out


def wait_file(args: Dict[str, Any], profiles: Dict[str, Any]) -> Dict[str, Any]:
    """Block until the file exists (default) or, with `changed`, differs from its state at the start (or from
    `baseline`); `timeout_s` bounds it.  Answers the event (exists, created, changed) with the file's stat."""
    started = time.monotonic()
    path = resolve(args.get("path"))
    changed = bool(args.get("changed"))
    timeout = float(args.get("timeout_s", 600))
    directory = os.path.dirname(path) or "/"
    check_directory(directory)
    base = _baseline(args["baseline"]) if changed and args.get("baseline") is not None else signature(path)
    if not changed and base is not None:
        return _answer(path, "exists", base, "already there", started)
    watcher, how = _watcher(directory, bool(args.get("poll")))
    name = os.fsencode(os.path.basename(path))

    def verdict() -> Tuple[Optional[str], Optional[Sig]]:
        now = signature(path)
        if now is None or (changed and now == base):
            return None, now
        return ("created" if base is None else "changed"), now

    def directory_back() -> bool:
        """The directory was moved or removed (inotify), or is not there at a look (poll): is one at the path again
        (`rm -rf D; mkdir D`, `mv D D.old; mkdir D`)?  Looked at for up to DIR_GRACE_S, so a directory made right
        after the old one went is waited on, by inotify and poll alike."""
        deadline = time.monotonic() + DIR_GRACE_S
        while True:
            if os.path.isdir(directory):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    gone = "the directory %s was moved or removed while waiting" % directory

    try:
        # The first look comes after the watch is set: whatever happened before it is seen here, after it by the watch.
        event, now = verdict()
        if event is not None:
            return _answer(path, event, now, how, started)
        writing_since: Optional[float] = None
        interval = POLL_MIN_S
        while True:
            caller.check()  # between slices (each at most POLL_MAX_S): a wait nobody awaits ends here
            left = timeout - (time.monotonic() - started)
            if left <= 0:
                return _answer(path, None, signature(path), how, started)
            if watcher is None:
                time.sleep(min(interval, left))
                interval = min(interval * 1.5, POLL_MAX_S)
                look = True
                if not os.path.isdir(directory):
                    event, now = verdict()
                    if event is not None:
                        return _answer(path, event, now, how, started)
                    if not directory_back():
                        raise HelperError(P.NO_SUCH_DIRECTORY, gone)
            else:
                names, own = watcher.read(min(left, SETTLE_S if writing_since is not None else POLL_MAX_S))
                if own & DIR_GONE:
                    # The path may name a directory again, the file in it: look before failing, then watch the
                    # new directory (and look once more after the watch is set: nothing between is missed).
                    event, now = verdict()
                    if event is not None:
                        return _answer(path, event, now, how, started)
                    watcher.close()
                    watcher = None
                    if not directory_back():
                        raise HelperError(P.NO_SUCH_DIRECTORY, gone)
                    try:
                        watcher, how = _watcher(directory, bool(args.get("poll")))
                    except HelperError as exc:
                        if exc.code == P.NO_SUCH_DIRECTORY:
                            raise HelperError(P.NO_SUCH_DIRECTORY, gone) from None
                        raise
                    writing_since = None
                    event, now = verdict()
                    if event is not None:
                        return _answer(path, event, now, how, started)
                    continue
                mask = names.get(name, 0)
                quiet = writing_since is not None and time.monotonic() - writing_since >= SETTLE_S
                if mask & WRITING and not mask & DONE:
                    writing_since, look = time.monotonic(), False
                else:
                    # Complete (closed, renamed into place), a quiet write, an overflow, or the periodic look.
                    look = bool(mask & DONE) or quiet or bool(own & IN_Q_OVERFLOW) or writing_since is None
                    if look:
                        writing_since = None
            if look:
                event, now = verdict()
                if event is not None:
                    return _answer(path, event, now, how, started)
    finally:
        if watcher is not None:
            watcher.close()
