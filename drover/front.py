"""The `drover` program's entry point: a front that imports the standard library only, then whatever it needs.

- `drover --version` and `drover --help` are answered here: the version is a constant, and the help is the text
  typer printed the last time, cached per version, per CLI source and per width in the drover home (a miss
  runs typer once and saves what it printed).  Exactly typer's text, at a fraction of its start-up.
- The hot commands (send, ls, status, wait, op, read, log) go to the persistent daemon when one answers for this
  environment (drover/daemon/client.py); without one they run here directly and a daemon is started for next time.
- Everything else imports the typer CLI, as before.  A hot command run here (no daemon) imports only the command
  module that defines it (drover/cli/hot.py): typer builds a click command for every registered function, reading
  each signature, which is most of a cold command's start.
"""

from __future__ import annotations

import os
import sys

from drover import __version__, terminal_columns

HELP_WORDS = (["--help"], ["-h"])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if sys.stdout is None or sys.stderr is None:
        return _closed()
    if args == ["--version"]:
        sys.stdout.write(f"drover {__version__}\n")
        sys.stdout.flush()
        return 0
    if args in HELP_WORDS:
        return _help(args)
    from drover.daemon import client

    code = client.run(args)
    if code is not None:
        return code
    return _full(args)


def _closed() -> int:
    """Started with stdout or stderr closed (`>&-`): nothing is run -- a send would deliver a message and then
    fail to say so -- and one line says why, on whichever of the two is open."""
    which = "standard output" if sys.stdout is None else "standard error"
    line = f"drover: {which} is closed: nothing was run (send it somewhere, e.g. >/dev/null)\n".encode()
    try:
        os.write(2 if sys.stderr is not None else 1, line)
    except OSError:
        pass
    return 2  # usage: how the command was started, not a bug in drover


def _full(args: list[str]) -> int:
    from drover.cli import hot

    word = hot.word(args)
    if word is not None:
        hot.register()
        from drover.cli.program import main as program_main

        return program_main(args, only=word)
    from drover.cli.main import main as cli_main

    return cli_main(args)


def _home() -> str:
    from drover import paths  # here: `drover --version` needs no path

    return paths.home()


def _help_key() -> str:
    """What typer's root help depends on: drover's version, the CLI's source (its commands and their help) and the
    width click formats to (the terminal's, between 50 and 78 columns)."""
    width = max(min(terminal_columns(), 80) - 2, 50)
    cli = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cli")
    stamp = 0
    try:
        for entry in os.scandir(cli):
            if entry.name.endswith(".py"):
                stamp = max(stamp, entry.stat().st_mtime_ns)
    except OSError:
        pass
    return f"{__version__}-{stamp:x}-{width}"


def _help(args: list[str]) -> int:
    home = _home()
    path = os.path.join(home, f"help-{_help_key()}.txt")
    text = _cached(path)
    if text is None:
        import io

        captured = io.StringIO()
        real, sys.stdout = sys.stdout, captured
        try:
            code = _full(args)
        finally:
            sys.stdout = real
        text = captured.getvalue()
        if code != 0 or not text:
            sys.stdout.write(text)
            return code
        _save(home, path, text)
    sys.stdout.write(text)
    sys.stdout.flush()
    return 0


def _cached(path: str) -> str | None:
    """The cached help, if it is ours and nobody else could have written it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or st.st_mode & 0o022 or st.st_size > 1 << 20:
            return None
        return os.read(fd, st.st_size + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def _save(home: str, path: str, text: str) -> None:
    """Best effort: an unwritable home only means the next --help is slow too."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(home, mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
