"""The fleet inventory: `fleet.toml`, validated with pydantic.

Found at `--fleet`, else `$DROVER_FLEET`, else `$XDG_CONFIG_HOME/drover/fleet.toml`; with none, a built-in fleet
that holds only `local`, so drover works with no file at all.  `fleet.example.toml` documents every key.
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
from typing import Any, Literal, NoReturn

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from drover.errors import ConfigError, DroverError, FleetInvalid, UnknownHost, UsageError

LOCAL = "local"
HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# The interpreter's path as the remote bootstrap accepts it (drover/transport/bundle.py): it is run unquoted by
# whatever login shell the host has, so only characters no shell treats specially, and `~/` for the home.
PYTHON_PATH = re.compile(r"^(~/)?[A-Za-z0-9_./+-]+$")
MAX_BYTES = 16 << 20  # a fleet file is a few KB; anything this large is not one


class _Strict(BaseModel):
    # A typo in a key is an error, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid")


class HostConfig(_Strict):
    ssh: str | None = Field(None, description="ssh target: a hostname or a ~/.ssh/config alias (default: the host's name)")
    user: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    identity: str | None = Field(None, description="private key file")
    proxy_jump: str | None = None
    python: str = "python3"
    tags: list[str] = Field(default_factory=list)
    known_hosts: str | None = None
    accept_new: bool = False
    owner_relay: bool = False
    raw: list[str] = Field(
        default_factory=list, description="sessions (as addressed) that run no agent but may get raw text at a shell prompt"
    )
    connect_timeout: float | None = Field(None, gt=0)
    request_timeout: float | None = Field(None, gt=0)

    @field_validator("ssh")
    @classmethod
    def _ssh_target(cls, value: str | None) -> str | None:
        if value is not None and "@" in value:
            raise ValueError('an ssh target holds no user: give the user as user = "dev" (--user dev) and the host alone')
        return value

    @field_validator("python")
    @classmethod
    def _python_path(cls, value: str) -> str:
        if not PYTHON_PATH.match(value):
            raise ValueError(
                "the interpreter's path may hold only letters, digits and _ . / + - (optionally after a leading ~/): "
                "the remote bootstrap runs it unquoted in the host's login shell"
            )
        return value


class EngineProfile(_Strict):
    commands: list[str] | None = None
    scripts: list[str] | None = None
    dialog: list[str] | None = None
    busy: list[str] | None = None
    idle: list[str] | None = None
    dialog_scope: Literal["screen", "last_line"] | None = None
    default_state: Literal["idle", "unknown"] | None = None
    queues_when_busy: bool | None = None
    envelope: bool | None = None
    input: str | None = None
    input_above: str | None = None
    input_end: str | None = None
    placeholder: list[str] | None = None
    empty_footer: str | None = None
    paste_marker: list[str] | None = None
    live_above: int | None = Field(None, ge=0, le=50)
    submit_when_busy: Literal["Enter", "Tab"] | None = None
    submit_delay_s: float | None = Field(None, ge=0, le=10)
    input_end_last: bool | None = None

    @field_validator(
        "scripts", "dialog", "busy", "idle", "placeholder", "paste_marker", "input", "input_above", "input_end", "empty_footer"
    )
    @classmethod
    def _regexes(cls, value: list[str] | str | None) -> list[str] | str | None:
        for pattern in [value] if isinstance(value, str) else value or []:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a valid regular expression: {exc}") from None
        return value

    def overrides(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class Limits(_Strict):
    max_chars: int = Field(1_048_576, ge=1)
    bucket_size: int = Field(30, ge=1)
    bucket_refill_per_s: float = Field(0.5, ge=0)
    duplicate_window_s: float = Field(30.0, ge=0)


class Defaults(_Strict):
    actor: str | None = None
    connect_timeout: float = Field(10.0, gt=0)
    request_timeout: float = Field(30.0, gt=0)
    concurrency: int = Field(64, ge=1)
    settle_s: float = Field(3.0, ge=0)
    receipt_wait_s: float = Field(1.5, ge=0)


class Fleet(_Strict):
    defaults: Defaults = Field(default_factory=Defaults)
    limits: Limits = Field(default_factory=Limits)
    hosts: dict[str, HostConfig] = Field(default_factory=dict)
    engines: dict[str, EngineProfile] = Field(default_factory=dict)

    @field_validator("hosts")
    @classmethod
    def _host_names(cls, hosts: dict[str, HostConfig]) -> dict[str, HostConfig]:
        for name, host in hosts.items():
            if not HOST_NAME.match(name):
                raise ValueError(f"host name {name!r} must be letters, digits, '.', '_' or '-' (no ':')")
            if name == LOCAL and host.ssh:
                raise ValueError("'local' is this machine and cannot have an ssh target")
        return hosts

    def host_names(self) -> list[str]:
        names = list(self.hosts)
        return names if LOCAL in names else [LOCAL, *names]

    def host(self, name: str) -> HostConfig:
        if name in self.hosts:
            return self.hosts[name]
        if name == LOCAL:
            return HostConfig()
        known = ", ".join(self.host_names())
        raise UnknownHost(f"unknown host {name!r}", hint=f"known hosts: {known}; add one with `drover fleet add`")

    def select(self, hosts: list[str] | None = None, tags: list[str] | None = None) -> list[str]:
        names = hosts or self.host_names()
        for name in names:
            self.host(name)
        if tags:
            names = [n for n in names if set(tags) & set(self.host(n).tags)]
        return names

    def profile_overrides(self) -> dict[str, dict[str, Any]]:
        return {name: prof.overrides() for name, prof in self.engines.items()}


def default_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "drover" / "fleet.toml"


def find_path(explicit: str | os.PathLike[str] | None = None) -> tuple[Path, bool]:
    """The fleet file to use, and whether the user named it (a named file must exist)."""
    if explicit is not None:
        if not os.fspath(explicit).strip():
            raise UsageError(
                "--fleet is empty: name a fleet file", hint="or leave --fleet out to use $DROVER_FLEET or the default"
            )
        return Path(explicit).expanduser(), True
    env = os.environ.get("DROVER_FLEET")
    if env:
        return Path(env).expanduser(), True
    return default_path(), False


def _table_path(header: str) -> list[str]:
    parts = re.findall(r'"([^"]*)"|\'([^\']*)\'|([^.\s]+)', header)
    return [a or b or c for a, b, c in parts]


def locate(text: str, loc: tuple[Any, ...]) -> int | None:
    """The line number in the TOML text of the key at pydantic location `loc` (best effort)."""
    keys = [str(k) for k in loc]
    table: list[str] = []
    best: int | None = None
    for number, line in enumerate(text.splitlines(), 1):
        header = re.match(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$", line)
        if header:
            table = _table_path(header.group(1))
            if table == keys:
                return number
            if keys[: len(table)] == table and (best is None or len(table) > 0):
                best = number
            continue
        assign = re.match(r"^\s*(\"[^\"]+\"|'[^']+'|[A-Za-z0-9_.-]+)\s*=", line)
        if assign:
            key_path = table + _table_path(assign.group(1))
            if keys[: len(key_path)] == key_path:
                return number
    return best


def _problems(path: Path, text: str, exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = ".".join(str(part) for part in loc) or "(top level)"
        line = locate(text, loc)
        prefix = f"{path.name}:{line}" if line else path.name
        msg = err["msg"].removeprefix("Value error, ")  # our own validators' words, without pydantic's label
        if err["type"] == "extra_forbidden":
            msg = "unknown key (see fleet.example.toml for the keys drover knows)"
        elif "input" in err and not isinstance(err["input"], dict | list):
            msg = f"{msg} (got {err['input']!r})"
        out.append(f"{prefix}: {where}: {msg}")
    return out


def parse(text: str, path: Path) -> Fleet:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FleetInvalid(str(path), [f"{path.name}: not valid TOML: {exc}"]) from None
    try:
        return Fleet.model_validate(data)
    except ValidationError as exc:
        raise FleetInvalid(str(path), _problems(path, text, exc)) from None


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symlink"),
)


def _not_regular(path: Path, mode: int) -> ConfigError:
    kind = next((name for test, name in _KINDS if test(mode)), "not a file")
    return ConfigError(
        f"fleet file {path} is not a regular file ({kind}): drover neither reads it nor writes it",
        hint="point --fleet or $DROVER_FLEET at a TOML file",
    )


def read_text(path: Path, *, follow: bool = True) -> str | None:
    """The fleet file's text (None when it does not exist); undecodable bytes are a FleetInvalid, not a crash.

    Only a regular file (after following symlinks, unless `follow` is False) is read: a FIFO, a device, a
    directory or a socket is refused before it is opened (and the open itself never blocks), so `--fleet
    /dev/zero` or a FIFO is an error, not a hang or a runaway read.
    """
    try:
        st = os.stat(path, follow_symlinks=follow)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st.st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read fleet file {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped between the stat and the open
            raise _not_regular(path, st.st_mode)
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 16):
            size += len(chunk)
            if size > MAX_BYTES:
                raise FleetInvalid(str(path), [f"{path.name}: larger than {MAX_BYTES >> 20} MiB: not a fleet file"])
            chunks.append(chunk)
    except OSError as exc:
        raise ConfigError(f"cannot read fleet file {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise FleetInvalid(str(path), [f"{path.name}:{line}: not valid UTF-8 (byte {exc.start}: {exc.reason})"]) from None


def load(explicit: str | os.PathLike[str] | None = None) -> tuple[Fleet, Path | None]:
    """The fleet and the file it came from (None for the built-in fleet)."""
    path, named = find_path(explicit)
    text = read_text(path)
    if text is None:
        if named:
            raise ConfigError(
                f"fleet file {path} does not exist", hint="create it with `drover fleet add`, or drop --fleet/$DROVER_FLEET"
            )
        return Fleet(), None
    return parse(text, path), path


# -- editing ---------------------------------------------------------------------------------------------------
#
# `drover fleet add | remove` edit the file the way a careful human would: through tomlkit, so comments, key
# order and formatting survive; the result is validated exactly as `load` will read it before it replaces the
# file; edits are serialised under an exclusive flock on a lock file beside the real file; a symlink is followed
# (and stays a symlink); the new text is written to a temporary file in the same directory and renamed over
# the old one, with the old file's mode.


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
