"""Editing fleet.toml: `drover fleet init | add | remove`, the way a careful human would.

Through tomlkit, so comments, key order and formatting survive; the result is validated exactly as
`drover.fleet.load` will read it before it replaces the file; edits are serialised under an exclusive flock on a
lock file beside the real file; a symlink is followed (and stays a symlink); the new text is written to a
temporary file in the same directory and renamed over the old one, with the old file's mode.  Anything that is
not a regular file is refused before it is opened.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import stat
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from drover.errors import ConfigError, DroverError, FleetInvalid, UnknownHost, UsageError
from drover.fleet import Fleet, _not_regular, find_path, parse, read_text
from drover.fleet_lines import deep_line


class InvalidEdit(FleetInvalid):
    """The edited fleet would not validate: nothing was written."""

    def __init__(self, path: str, problems: list[str]) -> None:
        super().__init__(path, problems)
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        self.message = f"refused to edit {path}: the result would be invalid: {problems[0] if problems else '?'}{more}"
        self.hint = "the file is untouched"


def _toml(text: str, path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FleetInvalid(str(path), [f"{path.name}: not valid TOML: {exc}"]) from None
    except RecursionError:  # nested past the parser's reach: said with its line, as `load` says it
        raise FleetInvalid(str(path), [deep_line(text, path)]) from None


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal as fleets: an empty [hosts] table and no [hosts] table mean the same."""

    def norm(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if not (k == "hosts" and v == {})}

    return norm(a) == norm(b)


def _unsafe(path: Path, what: str) -> ConfigError:
    return ConfigError(
        f"could not {what} in {path} without changing other settings; the file is untouched",
        hint="edit it by hand, or report the file's layout as a bug",
    )


def add_host(text: str, path: Path, name: str, entry: dict[str, Any], replace: bool = False) -> str:
    """The fleet text with host `name` added (or, with replace, its keys set to `entry`), everything else kept."""
    import tomlkit
    from tomlkit.items import InlineTable

    before = _toml(text, path)
    hosts_now = before.get("hosts", {})
    if not isinstance(hosts_now, dict):
        raise FleetInvalid(str(path), [f"{path.name}: hosts: must be a table of hosts"])
    exists = name in hosts_now
    if exists and not replace:
        raise UsageError(f"host {name!r} is already in {path}", hint="use --replace to overwrite it")
    if text and not text.endswith("\n"):
        text += "\n"
    try:
        doc = tomlkit.parse(text)
        hosts = doc.get("hosts")
        if hosts is None:
            hosts = tomlkit.table(is_super_table=True)
            doc["hosts"] = hosts
        if exists:
            # In place, key by key: the table keeps its position, its comments and the comments that follow it.
            table = hosts[name]
            for key in [k for k in table if k not in entry]:
                del table[key]
            for key, value in entry.items():
                table[key] = value
        elif isinstance(hosts, InlineTable):  # hosts = { a = {…} }: one more inline entry
            inline = tomlkit.inline_table()
            inline.update(entry)
            hosts[name] = inline
        else:
            table = tomlkit.table()
            for key, value in entry.items():
                table[key] = value
            table.add(tomlkit.nl())
            hosts[name] = table
        new = tomlkit.dumps(doc).rstrip("\n") + "\n"
    except Exception:  # noqa: BLE001 - a layout tomlkit cannot edit: refuse, never crash
        raise _unsafe(path, f"add host {name!r}") from None
    expected = {**before, "hosts": {**hosts_now, name: entry}}
    if not _same(_toml(new, path), expected):
        raise _unsafe(path, f"add host {name!r}")
    return new


_HOST_HEADER = re.compile(r"""^\s*\[\s*hosts\s*\.\s*(?:"([^"]*)"|'([^']*)'|([A-Za-z0-9_-]+))\s*\]\s*(?:#.*)?$""")
_ANY_HEADER = re.compile(r"^\s*\[")
_COMMENT = re.compile(r"^\s*#")


def _blank(line: str) -> bool:
    return not line.strip()


def _remove_table_lines(text: str, name: str) -> str | None:
    """Remove the `[hosts.NAME]` table as a human would, or None when the file is not laid out that way.

    Comments directly above the header (no blank line between) describe the host and go with it, unless they
    open the file; comments after a blank line at the end of its body belong to what follows and stay.
    """
    lines = text.splitlines(keepends=True)
    starts = []
    for i, line in enumerate(lines):
        m = _HOST_HEADER.match(line.rstrip("\r\n"))
        if m and (m.group(1) or m.group(2) or m.group(3)) == name:
            starts.append(i)
    if len(starts) != 1:
        return None
    start = starts[0]
    end = next((j for j in range(start + 1, len(lines)) if _ANY_HEADER.match(lines[j])), len(lines))
    keep_from = end
    j = end
    while j > start + 1 and (_blank(lines[j - 1]) or _COMMENT.match(lines[j - 1])):
        j -= 1
        if _blank(lines[j]):
            keep_from = j
    lead = start
    while lead > 0 and _COMMENT.match(lines[lead - 1]):
        lead -= 1
    if lead == 0:
        lead = start  # a comment that opens the file is the file's, not this host's
    head, tail = lines[:lead], lines[keep_from:]
    if head and tail and _blank(head[-1]) and _blank(tail[0]):
        tail = tail[1:]
    if not tail:
        while head and _blank(head[-1]):
            head.pop()
    return "".join(head + tail)


def remove_host(text: str, path: Path, name: str) -> str:
    """The fleet text without host `name`, everything else kept."""
    before = _toml(text, path)
    hosts = before.get("hosts", {})
    if not isinstance(hosts, dict) or name not in hosts:
        known = ", ".join(hosts) if isinstance(hosts, dict) and hosts else "none"
        raise UnknownHost(f"host {name!r} is not in {path}", hint=f"hosts in the file: {known}")
    expected = {**before, "hosts": {k: v for k, v in hosts.items() if k != name}}
    new = _remove_table_lines(text, name)
    if new is None or not _same(_toml(new, path), expected):
        import tomlkit

        try:
            doc = tomlkit.parse(text)
            del doc["hosts"][name]
            new = tomlkit.dumps(doc)
        except Exception:  # noqa: BLE001 - a layout tomlkit cannot edit: refuse, never crash
            raise _unsafe(path, f"remove host {name!r}") from None
        if not _same(_toml(new, path), expected):
            raise _unsafe(path, f"remove host {name!r}")
    return new


def _cannot_write(path: Path, real: Path, exc: OSError, step: str = "") -> ConfigError:
    reason = exc.strerror or str(exc)
    blocker = next((a for a in real.parents if os.path.lexists(a) and not a.is_dir()), None)
    if isinstance(exc, FileExistsError | NotADirectoryError) and blocker is not None:
        reason = f"{blocker} is not a directory"
    elif step:
        reason += f" ({step})"
    return ConfigError(
        f"cannot write fleet file {path}: {reason}",
        hint="the file is untouched; make it and its directory writable (a read-only mount? `chattr -i`?), "
        "or point --fleet or $DROVER_FLEET at a file you can write",
    )


def _missing(path: Path, change: Callable[[str, Path], str]) -> NoReturn:
    """An edit of a file that does not exist, without creating it: `change` says what is wrong with no fleet at all
    (remove: the host is not there), told that the file does not exist."""
    try:
        change("", path)
    except DroverError as exc:
        exc.hint = f"{path} does not exist"
        raise
    raise ConfigError(f"fleet file {path} does not exist", hint="create it with `drover fleet add`")


def edit(
    explicit: str | os.PathLike[str] | None, change: Callable[[str, Path], str], *, create: bool = True
) -> tuple[Fleet, Path, bool]:
    """Apply `change(text, path) -> new text` to the fleet file under its lock; validate; replace atomically.

    The file is the one `load` would read; a missing one is created (with `create`; without, `change` is asked
    about an empty fleet and nothing is created: no directory, no lock file).  Anything that is not a regular
    file is refused before anything is created or opened for writing.  Anything raised by `change` or by the
    validation leaves the file untouched; a place that cannot be written is a ConfigError, never an OSError.
    Returns the new fleet, its path, and whether this edit created the file (decided under the lock).
    """
    path, _named = find_path(explicit)
    real = Path(os.path.realpath(path))  # a symlinked fleet.toml is edited where it points, and stays a link
    try:
        st: os.stat_result | None = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _cannot_write(path, real, exc) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st.st_mode)
    if st is None and not create:
        _missing(path, change)
    lock = real.parent / f".{real.name}.lock"
    step = f"creating its directory {real.parent}"
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        step = f"creating its lock file {lock}"
        lock_fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise _cannot_write(path, real, exc, step) from None
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        text = read_text(real, follow=False)
        if text is None and not create:
            _missing(path, change)
        new = change(text or "", path)
        try:
            fleet = parse(new, path)  # exactly as `load` will read it: every problem with its line number
        except FleetInvalid as exc:
            raise InvalidEdit(str(path), exc.problems) from None
        try:
            _replace(real, new)
        except OSError as exc:
            raise _cannot_write(path, real, exc, "replacing it") from None
    finally:
        os.close(lock_fd)  # closing releases the lock
    return fleet, path, text is None


def _replace(real: Path, text: str) -> None:
    try:
        st: os.stat_result | None = os.stat(real, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):  # never replace a device, a FIFO or a symlink
        raise _not_regular(real, st.st_mode)
    tmp = real.parent / f".{real.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)  # umask applies to a new file
    try:
        try:
            if st is not None:
                os.fchmod(fd, stat.S_IMODE(st.st_mode))
                if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):
                    os.fchown(fd, st.st_uid, st.st_gid)
            data = memoryview(text.encode("utf-8"))
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(real.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def example_text() -> str:
    """The example fleet file shipped with the package: every key drover knows, with its default and meaning."""
    from importlib.resources import files

    return files("drover").joinpath("fleet.example.toml").read_text(encoding="utf-8")


def commented_example() -> str:
    """The example with every setting commented out: a valid fleet (just `local`) that documents every key, for
    `drover fleet init`.  Uncommenting a line turns that setting on."""
    head = (
        "# Written by `drover fleet init`: every setting drover knows, commented out. Uncomment and edit what you\n"
        "# need; `drover fleet show` checks the file, `drover fleet add NAME --ssh TARGET` adds a host.\n#\n"
    )
    lines = [line if not line.strip() or line.lstrip().startswith("#") else "# " + line for line in example_text().splitlines()]
    return head + "\n".join(lines) + "\n"


def init(text: str | None, path: Path, force: bool) -> str:
    """The new text for `drover fleet init`: refused over an existing fleet file unless forced."""
    if text and text.strip() and not force:
        raise UsageError(
            f"{path} exists already: drover fleet init writes a new file only",
            hint="`drover fleet init --print` shows the commented example; --force replaces the file",
        )
    return commented_example()
