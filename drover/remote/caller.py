"""Is whoever asked still there?  A long wait on the host (a file, a session going idle) looks between its slices.

A helper answers on its stdout.  When the caller goes away -- the client killed, the connection dropped, the
daemon closing this helper after its request was cancelled -- sshd closes the other end of that stdout, and the
kernel reports it on our end at once (POLLERR on a pipe, POLLHUP on a socket) without anything being written.
Stdin says nothing useful: a one-request helper's stdin ends right after the request, by design.  A wait that
sees its caller gone stops (CallerGone unwinds it, so its finally blocks run) instead of holding the host and a
process there until its timeout.  In-process (`local`, the daemon's own host) nothing is watched.
"""

import select
from typing import Optional

_FD = None  # type: Optional[int]


class CallerGone(Exception):
    """The one who asked is gone: nobody will read the answer."""


def watch(fd: Optional[int]) -> None:
    """Watch this descriptor (the helper's stdout) for the reader going away; None stops watching."""
    global _FD
    _FD = fd


def gone() -> bool:
    if _FD is None:
        return False
    try:
        poller = select.poll()
        poller.register(_FD, 0)  # no events asked for: errors and hang-ups are always reported
        return bool(poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll() on this platform, or a closed descriptor
        return False


def check() -> None:
    """Raise CallerGone when the caller left (a wait calls this between its slices)."""
    if gone():
        raise CallerGone
