"""How long a program keeps drawing after a paste lands in its input box: timed from tmux's own view of the pane.

A control-mode client (`tmux -C`) is told of every chunk of output tmux reads from the pane (`%output`), as tmux
reads it; the paste is made the way drover's tmux lane makes it (`paste-buffer -p -r -d`), and the redraw is the
time from the paste to the last chunk before the pane goes quiet.  These numbers set each engine's `paste_hold_s`
(drover/remote/profiles.py): the hold before drover's last look must cover the program's reaction to a paste.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import Any


def tmux(server: list[str], *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(["tmux", *server, *args], input=stdin, capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def cursor(server: list[str], pane: str) -> tuple[int, int]:
    x, y = tmux(server, "display-message", "-p", "-t", pane, "#{cursor_x} #{cursor_y}").split()
    return int(x), int(y)


class Watch:
    """A read-only control-mode client on the pane's session: the time of each output chunk tmux reads."""

    def __init__(self, server: list[str], pane: str) -> None:
        session = tmux(server, "display-message", "-p", "-t", pane, "#{session_name}").strip()
        self.mark = b"%output " + pane.encode() + b" "
        self.times: list[float] = []
        self.proc = subprocess.Popen(
            ["tmux", *server, "-C", "attach-session", "-r", "-t", session],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(self.mark):
                self.times.append(time.monotonic())

    def quiet_after(self, since: float, quiet: float, cap: float) -> None:
        """Wait until no output came for `quiet` seconds (at most `cap` after `since`)."""
        while time.monotonic() < since + cap:
            last = max([since, *self.times])
            if time.monotonic() - last >= quiet:
                return
            time.sleep(0.01)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def paste_redraw(server: list[str], pane: str, text: str, quiet: float = 0.6, cap: float = 4.0) -> dict[str, Any]:
    """Paste `text` into the pane and time what the program draws after it: ms from the paste to the first and to
    the last output chunk, and how many chunks.  The box is left holding the text."""
    watch = Watch(server, pane)
    try:
        watch.quiet_after(time.monotonic(), quiet, cap)  # whatever attaching stirred up, gone
        buf = f"redraw-{os.getpid()}-{time.monotonic_ns()}"
        tmux(server, "load-buffer", "-b", buf, "-", stdin=text)
        start = len(watch.times)
        t0 = time.monotonic()
        tmux(server, "paste-buffer", "-p", "-r", "-d", "-b", buf, "-t", pane)
        watch.quiet_after(t0, quiet, cap)
        after = [t - t0 for t in watch.times[start:] if t - t0 < cap]
    finally:
        watch.close()
    return {
        "first_ms": round(after[0] * 1000, 1) if after else None,
        "last_ms": round(after[-1] * 1000, 1) if after else None,
        "chunks": len(after),
        "at_ms": [round(t * 1000, 1) for t in after],
    }


def clear_box(server: list[str], pane: str, chars: int) -> None:
    tmux(server, "send-keys", "-t", pane, "-N", str(chars + 10), "BSpace")
