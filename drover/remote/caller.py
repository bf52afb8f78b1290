"""Is whoever asked still there?  A long wait on the host (a file, a session going idle) looks between its slices.

A helper answers on its stdout.  When the caller goes away -- the client killed, the connection dropped, the
daemon closing this helper after its request was cancelled -- sshd closes the other end of that stdout, and the
kernel reports it on our end at once (POLLERR on a pipe, POLLHUP on a socket) without anything being written.
Stdin says nothing useful: a one-request helper's stdin ends right after the request, by design.  A wait that
sees its caller gone stops (CallerGone unwinds it, so its finally blocks run) instead of holding the host and a
process there until its timeout.  In-process (`local`, the daemon's own host) there is no stdout to watch: the
transport running the op on a thread hands it an event instead, set when nobody awaits the answer any more.
"""

import select
import threading
from typing import Optional

_FD = None  # type: Optional[int]
_THREAD = threading.local()  # .abandoned: a threading.Event, on a thread that runs an op in-process


class CallerGone(Exception):
    """The one who asked is gone: nobody will read the answer."""


def watch(fd: Optional[int]) -> None:
    """Watch this descriptor (the helper's stdout) for the reader going away; None stops watching."""
    global _FD
    _FD = fd


def abandon_with(event: "threading.Event") -> None:
    """This thread runs an op for an in-process caller: the op's waits end once `event` is set."""
    _THREAD.abandoned = event


def gone() -> bool:
    event = getattr(_THREAD, "abandoned", None)
    if event is not None and event.is_set():
        return True
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
