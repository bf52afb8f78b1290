"""What one run of the `drover` CLI reads and writes: its streams, its terminal, and the Context its ops run in.

The CLI never reaches for sys.stdout, sys.stderr or sys.stdin, nor asks them whether they are a terminal: it is
handed an Environment (httpie's `Environment`, passed to `main(argv, env)`), and formats for its terminal (with no
width given, rich and click measure this process's, as they always did).  A direct run builds one from the process
(`Environment.from_process()`); the daemon builds one per request from the caller's streams and terminal facts it
receives (drover/daemon/request.py) and calls the program it was handed with it.  Below both the CLI and the daemon,
so neither imports the other for it.  Standard library only at import (rich is imported when a Console is first
asked for: the front's --help path never asks).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from drover.ops.core import Context

STREAMS = ("stdin", "stdout", "stderr")
# A text stream: the process's, a test's io.StringIO, the daemon's per-request streams (io.TextIOBase, not IO[str]).
Stream = Any


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class Environment:
    """The streams, terminal facts and Context maker of one run.

    `columns` None: rich measures the terminal itself (a direct run); `term` None: rich reads TERM, COLORTERM,
    NO_COLOR, FORCE_COLOR, COLUMNS from os.environ (a direct run) -- the daemon passes the caller's instead.
    `make_context` builds the run's Context (drover.ops.Context when None); the daemon's shares its pool."""

    def __init__(
        self,
        *,
        stdin: Stream | None,
        stdout: Stream,
        stderr: Stream,
        tty: Mapping[str, bool] | None = None,
        columns: int | None = None,
        term: Mapping[str, str] | None = None,
        make_context: Callable[..., Context] | None = None,
    ) -> None:
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        streams = {"stdin": stdin, "stdout": stdout, "stderr": stderr}
        self.tty = {k: bool(tty[k]) if tty is not None else _isatty(streams[k]) for k in STREAMS}
        self.columns = columns
        self.term = dict(term) if term is not None else None
        self.make_context = make_context
        self._out: Console | None = None
        self._err: Console | None = None

    @classmethod
    def from_process(cls) -> Environment:
        """This process's streams as they are now (a test's captured ones included), its terminal, a plain Context."""
        return cls(stdin=sys.stdin, stdout=sys.stdout, stderr=sys.stderr)

    def isatty(self, stream: str) -> bool:
        return self.tty[stream]

    def _console(self, file: Stream, **options: Any) -> Console:
        from rich.console import Console

        common: dict[str, Any] = {"highlight": False, "markup": False, "emoji": False}
        if self.term is not None:
            common["_environ"] = self.term
        if options.get("width") is not None:
            # rich takes a width given alone as a hint a dumb terminal (TERM=dumb: emacs, some CI) overrides with
            # 80 columns; with a height beside it, the width given is the width used.
            options.setdefault("height", 25)
        return Console(file=file, **common, **options)

    @property
    def out(self) -> Console:
        """The Console for stdout.  Piped output is for reading later or for grep: not squeezed into 80 columns."""
        if self._out is None:
            self._out = self._console(self.stdout, soft_wrap=False, width=self.columns if self.tty["stdout"] else 200)
        return self._out

    @property
    def err(self) -> Console:
        """The Console for stderr (errors, warnings, the fan-out progress bar)."""
        if self._err is None:
            self._err = self._console(self.stderr, soft_wrap=True, width=self.columns)
        return self._err
