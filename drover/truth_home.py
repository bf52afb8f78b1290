"""Opening the truth file's home safely: the home, the record and the message locks, each checked as drover's own.

Split from drover/truth.py (TruthFile inherits it): every path under the home is opened relative to a checked
directory without following a link, then checked by its fstat -- a real file or directory, yours, not writable by
others, and (for files) no other hard link, since another name for the inode is as good as a symlink to it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from drover.errors import TruthDiskFull, TruthFileError, TruthUnsafe, TruthUnwritable

NAME = "truth.jsonl"
LOCKS = "locks"
DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class SafeHome:
    home: Path
    path: Path

    # -- opening, safely ----------------------------------------------------------------------------------------
    def _error(self, exc: OSError, doing: str, what: Path | None = None) -> TruthFileError:
        what = what or self.path
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        words = exc.strerror or str(exc)
        details = {"path": str(what), "errno": name}
        if exc.errno in DISK_FULL:
            return TruthDiskFull(
                f"cannot {doing} {what}: {words}",
                hint=f"free some space where {self.home} lives, or point DROVER_HOME elsewhere",
                details=details,
            )
        if exc.errno == errno.ELOOP:
            return TruthUnsafe(
                f"{what} is a symlink: drover does not follow links to its record",
                hint="remove the link, or point DROVER_HOME at a directory of your own; what it points to was not touched",
                details=details,
            )
        return TruthUnwritable(
            f"cannot {doing} {what}: {words}",
            hint="make it writable, or point DROVER_HOME at a writable directory of your own",
            details=details,
        )

    def _unsafe(self, what: Path, why: str, hint: str) -> TruthUnsafe:
        return TruthUnsafe(f"refusing {what}: {why}", hint=hint, details={"path": str(what)})

    def _check(self, st: os.stat_result, what: Path, kind: str) -> None:
        me = os.geteuid()
        if st.st_uid != me:
            raise self._unsafe(
                what,
                f"the {kind} belongs to uid {st.st_uid}, not to you (uid {me})",
                f"someone else's {kind} could feed drover a false record; point DROVER_HOME at a directory of your own",
            )
        if st.st_mode & 0o022:
            raise self._unsafe(
                what,
                f"the {kind} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})",
                f"chmod {'700' if kind == 'directory' else '600'} {what}",
            )
        if kind != "directory" and st.st_nlink > 1:
            # Another name for the same inode, as a symlink is: whoever placed it can read or rewrite what drover
            # trusts, under a name drover never checks.
            raise self._unsafe(
                what,
                f"the {kind} has {st.st_nlink} hard links: another name could change it",
                f"remove the other links (find -samefile {what}), or move it away; drover creates its files itself",
            )

    def _open_home(self, create: bool) -> int | None:
        """An O_DIRECTORY fd on the home, checked (None: it does not exist and create is False)."""
        home = self.home
        if create:
            try:
                home.mkdir(parents=True, exist_ok=True, mode=0o700)
            except FileExistsError:
                pass  # a dangling link or a file: the checks below say which
            except OSError as exc:
                raise self._error(exc, "create the directory", home) from None
        try:
            lst = os.lstat(home)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._error(exc, "look at", home) from None
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        if stat.S_ISLNK(lst.st_mode):
            if lst.st_uid != os.geteuid():
                raise self._unsafe(
                    home,
                    f"it is a symlink made by uid {lst.st_uid}, not by you",
                    "point DROVER_HOME at a directory of your own (mode 700)",
                )
        else:
            flags |= os.O_NOFOLLOW  # it was not a link a moment ago: it must not become one now
        try:
            dfd = os.open(home, flags)
        except FileNotFoundError:
            if create:
                raise self._unsafe(home, "it is a dangling symlink", "remove it, or point it at a directory") from None
            return None
        except NotADirectoryError:
            raise self._unsafe(home, "it is not a directory", "point DROVER_HOME at a directory") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._unsafe(home, "it became a symlink while drover looked at it", "check who else writes there") from None
            raise self._error(exc, "open the directory", home) from None
        try:
            self._check(os.fstat(dfd), home, "directory")
        except BaseException:
            os.close(dfd)
            raise
        return dfd

    # -- a message being worked on ------------------------------------------------------------------------------
    def _locks(self) -> int:
        """An O_DIRECTORY fd on the home's `locks` folder (created), checked as the home is: a real directory (not a
        symlink, which O_NOFOLLOW refuses), yours, not writable by others."""
        dfd = self._open_home(create=True)
        assert dfd is not None
        folder = self.home / LOCKS
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(LOCKS, 0o700, dir_fd=dfd)
            lfd = os.open(LOCKS, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except NotADirectoryError:  # what O_NOFOLLOW says of a symlink to a directory, too
            try:
                kind = "a symlink" if stat.S_ISLNK(os.lstat(LOCKS, dir_fd=dfd).st_mode) else "not a directory"
            except OSError:
                kind = "not a directory"
            raise self._unsafe(folder, f"it is {kind}", f"remove it; drover creates {folder} itself") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._unsafe(folder, "it is a symlink", f"remove it; drover creates {folder} itself") from None
            raise self._error(exc, "open the lock folder", folder) from None
        finally:
            os.close(dfd)
        try:
            self._check(os.fstat(lfd), folder, "directory")
        except BaseException:
            os.close(lfd)
            raise
        return lfd

    def _slot(self, lfd: int, name: str) -> int:
        """One lock file, opened in the checked folder without following a link, and checked like the record."""
        what = self.home / LOCKS / name
        try:
            # O_NONBLOCK: a FIFO planted under the name must not hang the open.
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=lfd)
        except OSError as exc:
            raise self._error(exc, "open the lock", what) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._unsafe(what, "it is not a regular file", "remove it; drover creates its locks itself")
            self._check(st, what, "lock file")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_lock(self, name: str) -> int:
        """The lock file `name` under the home's locks/, opened (created) and checked: its fd, for flock."""
        lfd = self._locks()
        try:
            return self._slot(lfd, name)
        finally:
            os.close(lfd)

    def check_locks(self) -> None:
        """Before a message is accepted: the lock folder and every lock in it are drover's own, so that holding
        the message's lock after its accepted event cannot fail on something planted there (and leave it
        pending).  TruthUnsafe names the folder or the lock."""
        try:
            lfd = self._locks()
        except TruthFileError as exc:
            exc.message = f"nothing was sent (drover records a message before it sends it): {exc.message}"
            raise
        me = os.geteuid()
        try:
            for entry in os.scandir(lfd):
                if entry.is_symlink() or not entry.is_file(follow_symlinks=False):
                    what = self.home / LOCKS / entry.name
                    kind = "a symlink" if entry.is_symlink() else "not a regular file"
                    raise self._unsafe(what, f"it is {kind}", "remove it; drover creates its locks itself")
                st = entry.stat(follow_symlinks=False)
                if st.st_uid != me or st.st_mode & 0o022 or st.st_nlink > 1:  # the common case costs no Path
                    self._check(st, self.home / LOCKS / entry.name, "lock file")
        finally:
            os.close(lfd)

    @contextmanager
    def working_on(self, msg_id: str, exclusive: bool) -> Iterator[bool]:
        """Who is working on a message.  A send holds its message shared from its accepted event to its outcome;
        a retry takes it exclusively and without waiting (yields False when it cannot), so a retry never races the
        send it finishes, or another retry.  256 lock files, one per slot of the id's hash: two messages that share
        a slot only make a retry wait for the other's send to end."""
        with self.slot_lock("slot", msg_id, 256, exclusive) as held:
            yield held

    @contextmanager
    def slot_lock(self, kind: str, key: str, slots: int, exclusive: bool = True) -> Iterator[bool]:
        """One of `slots` lock files of a kind (`KIND-NNN.lock`, by the key's hash), taken exclusively without
        waiting (yields whether it was had) or shared (waits).  Few files however many keys: two keys that share
        a slot only make one wait for the other."""
        slot = int(hashlib.sha256(key.encode()).hexdigest()[:4], 16) % slots
        fd = self.open_lock(f"{kind}-{slot:03d}.lock")
        try:
            try:
                fcntl.flock(fd, (fcntl.LOCK_EX | fcntl.LOCK_NB) if exclusive else fcntl.LOCK_SH)
                held = True
            except BlockingIOError:
                held = False
            yield held
        finally:
            os.close(fd)
