"""The fleet inventory: `fleet.toml`, validated with pydantic.

Found at `--fleet`, else `$DROVER_FLEET`, else `$XDG_CONFIG_HOME/drover/fleet.toml`; with none, a built-in fleet
that holds only `local`, so drover works with no file at all.  `drover fleet init` writes
an example that documents every key (drover/fleet.example.toml, shipped with the package).
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from drover import paths
from drover.bots.config import BotConfig, WebhookConfig
from drover.errors import ConfigError, FleetInvalid, TargetError, UnknownHost, UsageError
from drover.fleet_adapters import AdapterConfig, check_names
from drover.fleet_engines import EngineProfile, MaybeSeconds, Seconds, SpawnEngine, _Strict, check_regexes
from drover.fleet_lines import deep_line, problems, strange_values
from drover.fleet_schedule import quiet_minutes
from drover.paths import MAX_DURATION_S, duration_s
from drover.remote import protocol as P

LOCAL = "local"
# Receivers that are not sessions (drover/ops/endpoints.py): `bot:NAME`, `adapter:NAME`.  Their kinds are not host
# names: a host called `bot` would make `bot:x` mean two things, and targets never guess.
ENDPOINT_KINDS = ("bot", "adapter")
HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")  # \Z: `$` would let a final newline through
# The interpreter's path as the remote bootstrap accepts it (drover/transport/bundle.py): it is run unquoted by
# whatever login shell the host has, so only characters no shell treats specially, and `~/` for the home.
PYTHON_PATH = re.compile(r"^(~/)?[A-Za-z0-9_./+-]+\Z")
MAX_BYTES = 16 << 20  # a fleet file is a few KB; anything this large is not one
# Characters no path drover passes on may hold: C0 controls (newline, CR, ESC, ...), DEL, C1 controls, and the
# Unicode line and paragraph separators (a line break to Python's splitlines).
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# The engines `drover spawn` can start with no [spawn.ENGINE] table (drover/ops/spawn.py DEFAULT_TEMPLATES).
BUILTIN_SPAWN_ENGINES = ("claude", "codex")


class HostConfig(_Strict):
    ssh: str | None = Field(None, description="ssh target: a hostname or a ~/.ssh/config alias (default: the host's name)")
    user: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    identity: str | None = Field(None, description="private key file")
    proxy_jump: str | None = None
    python: str = "python3"
    transport: Literal["asyncssh", "openssh"] = Field(
        "asyncssh",
        description="openssh: run the system ssh with your own config, riding your ControlMaster (second factor, "
        "Kerberos, hardware keys); open it with `drover connect HOST`",
    )
    tags: list[str] = Field(default_factory=list)
    known_hosts: str | None = None
    accept_new: bool = False
    owner_relay: bool = False
    raw: list[str] = Field(
        default_factory=list, description="sessions (as addressed) that run no agent but may get raw text at a shell prompt"
    )
    connect_timeout: MaybeSeconds = Field(None, gt=0, le=MAX_DURATION_S)
    request_timeout: MaybeSeconds = Field(None, gt=0, le=MAX_DURATION_S)
    trusted: list[str] = Field(
        default_factory=list,
        description="folders (and their subfolders) `drover spawn` pre-trusts in the engine's own settings file",
    )
    banner_ok: list[str] = Field(
        default_factory=list,
        description="regexes: what the login shell prints before every command, accepted without a warning if one matches all",
    )
    spawn_server: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="the tmux server (as tmux -L) spawned sessions start in"
    )
    stall_after: MaybeSeconds = Field(
        None, gt=0, le=MAX_DURATION_S, description="this host's sessions: working with no progress this long is stalled"
    )

    @field_validator("banner_ok")
    @classmethod
    def _banners(cls, patterns: list[str]) -> list[str]:
        check_regexes(patterns)
        return patterns

    @field_validator("trusted")
    @classmethod
    def _trusted(cls, folders: list[str]) -> list[str]:
        for folder in folders:
            place(folder, "the trusted folder")
        return folders

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


class Limits(_Strict):
    max_chars: int = Field(1_048_576, ge=1)
    bucket_size: int = Field(30, ge=1)
    bucket_refill_per_s: float = Field(0.5, ge=0)
    duplicate_window_s: Seconds = Field(30.0, ge=0, le=MAX_DURATION_S)


class Defaults(_Strict):
    actor: str | None = None
    connect_timeout: Seconds = Field(10.0, gt=0, le=MAX_DURATION_S)
    request_timeout: Seconds = Field(30.0, gt=0, le=MAX_DURATION_S)
    concurrency: int = Field(64, ge=1)
    settle_s: Seconds = Field(3.0, ge=0, le=MAX_DURATION_S)
    receipt_wait_s: Seconds = Field(1.5, ge=0, le=MAX_DURATION_S)
    # Persistent mode (drover/daemon/): read by the stdlib front with tomllib before it starts a daemon.
    daemon: bool = Field(True, description="start a per-user daemon on first use, keeping SSH connections warm")
    daemon_idle_s: Seconds = Field(
        600.0, gt=0, le=MAX_DURATION_S, description="seconds a daemon with nothing to do waits before exiting"
    )
    stall_after: Seconds = Field(
        600.0, gt=0, le=MAX_DURATION_S, description="a session working with no progress evidence this long is stalled"
    )
    watch_interval: Seconds = Field(
        60.0,
        ge=0,
        le=MAX_DURATION_S,
        description="how often a running daemon runs `drover watch run` between requests (0: off)",
    )


def place(value: str, what: str) -> str:
    """A directory as the fleet names it on a host: absolute, or ~ / ~/... (the host's home), on one line.  A
    relative one would be taken relative to wherever drover happens to run."""
    if CONTROL_CHARS.search(value):
        raise ValueError(f"{what} {value!r} holds a control character (a newline, ESC, ...): no directory drover uses may")
    if not (value.startswith("/") or value == "~" or value.startswith("~/")):
        raise ValueError(f"{what} {value!r} is not an absolute path: write /path or ~/path (the host's home)")
    return value


class NudgeEntry(_Strict):
    """One scheduled nudge: `drover nudge run` sends it when it is due, through the nudge's refusals."""

    name: str | None = Field(None, description="what identifies the entry's last send (default: its target as written)")
    target: str = Field(..., description="HOST:ID, as for drover nudge")
    text: str
    every: str = Field(..., description="how often: 30s, 15m, 1h, 1d, 1h30m")
    retry: str = Field("1m", description="after an attempt that did not deliver (refused, failed), try again this much later")
    actor: str | None = None
    quiet_hours: str | None = Field(None, description="HH:MM-HH:MM, local time here: nothing is sent then")
    via: Literal["auto", "inbox", "queue", "tmux"] = "auto"
    create_if_missing: bool = False
    engine: str | None = Field(None, description="with create_if_missing: the engine a new session runs")
    cwd: str | None = Field(None, description="with create_if_missing: the directory a new session starts in")

    @field_validator("name", "target", "text")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("is empty")
        return value

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        if value.strip().endswith(":"):
            raise ValueError(f"{value!r} names a host but no session: write it as HOST:ID, e.g. box-a:webapp-f8")
        return value

    @field_validator("every", "retry", mode="before")
    @classmethod
    def _number_is_seconds(cls, value: Any) -> Any:
        # `every = 90` means what `every = "90"` does: seconds, like every other length of time in the file.
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        return value

    @field_validator("every", "retry")
    @classmethod
    def _duration(cls, value: str) -> str:
        duration_s(value)
        return value

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, value: str | None) -> str | None:
        return value if value is None else place(value, "the directory")

    @field_validator("quiet_hours")
    @classmethod
    def _quiet(cls, value: str | None) -> str | None:
        if value is not None:
            quiet_minutes(value)
        return value

    @model_validator(mode="after")
    def _spawnable(self) -> NudgeEntry:
        if self.create_if_missing and not (self.engine and self.cwd):
            raise ValueError("create_if_missing needs engine and cwd: what to start, and where, when the session is not live")
        return self

    @property
    def key(self) -> str:
        """What the entry's last send is remembered by: its name, else its target as written (so editing the text
        keeps its schedule, and pointing it at another session starts a new one)."""
        return (self.name or self.target).strip()


class Fleet(_Strict):
    defaults: Defaults = Field(default_factory=Defaults)
    limits: Limits = Field(default_factory=Limits)
    hosts: dict[str, HostConfig] = Field(default_factory=dict)
    engines: dict[str, EngineProfile] = Field(default_factory=dict)
    spawn: dict[str, SpawnEngine] = Field(default_factory=dict)
    nudge: list[NudgeEntry] = Field(default_factory=list)
    # Receivers that are not sessions (drover/bots/): `bot:NAME` is a [bots.NAME]; [webhook] is their reply listener.
    bots: dict[str, BotConfig] = Field(default_factory=dict)
    webhook: WebhookConfig = Field(default_factory=WebhookConfig)
    # `adapter:NAME` receivers (drover/fleet_adapters.py, drover/adapters.py).
    adapters: dict[str, AdapterConfig] = Field(default_factory=dict)

    @field_validator("adapters")
    @classmethod
    def _adapter_names(cls, adapters: dict[str, AdapterConfig]) -> dict[str, AdapterConfig]:
        return check_names(adapters)

    @field_validator("nudge", mode="before")
    @classmethod
    def _nudge_list(cls, value: Any) -> Any:
        if isinstance(value, dict):
            raise ValueError("each nudge is an entry of a list: write [[nudge]] (two brackets), not [nudge]")
        return value

    @field_validator("nudge")
    @classmethod
    def _nudge_keys(cls, entries: list[NudgeEntry]) -> list[NudgeEntry]:
        seen: dict[str, int] = {}
        for number, entry in enumerate(entries, 1):
            if entry.key in seen:
                raise ValueError(
                    f"[[nudge]] entries {seen[entry.key]} and {number} are both {entry.key!r}: their last sends would be "
                    'one; give each a distinct name = "..."'
                )
            seen[entry.key] = number
        return entries

    @field_validator("nudge")
    @classmethod
    def _nudge_engines(cls, entries: list[NudgeEntry], info: ValidationInfo) -> list[NudgeEntry]:
        spawn = info.data.get("spawn")
        if spawn is None:
            return entries  # [spawn] itself is invalid: that is the error to fix first
        known = {*BUILTIN_SPAWN_ENGINES, *spawn}
        for number, entry in enumerate(entries, 1):
            if entry.engine is not None and entry.engine not in known:
                raise ValueError(
                    f"[[nudge]] entry {number} ({entry.key!r}): engine {entry.engine!r} is not one drover spawn can "
                    f"start: {', '.join(sorted(known))}, or add a [spawn.ENGINE] table with its command"
                )
        return entries

    @field_validator("nudge")
    @classmethod
    def _nudge_hosts(cls, entries: list[NudgeEntry], info: ValidationInfo) -> list[NudgeEntry]:
        """A target's head that could be a host must be one of the fleet's (drover/targets.py reads it so): a typo
        is said when the file is read, not on each run as a send to nobody."""
        hosts = info.data.get("hosts")
        if hosts is None:
            return entries  # [hosts] itself is invalid: that is the error to fix first
        known = [*([] if LOCAL in hosts else [LOCAL]), *hosts]
        for number, entry in enumerate(entries, 1):
            head, sep, _rest = entry.target.partition(":")
            if sep and HOST_NAME.match(head) and head not in known:
                raise ValueError(
                    f"[[nudge]] entry {number} ({entry.key!r}): unknown host {head!r} in target {entry.target!r} (known "
                    f"hosts: {', '.join(known)}; a local pane whose name holds ':' is written local:{entry.target})"
                )
        return entries

    @field_validator("bots")
    @classmethod
    def _bot_names(cls, bots: dict[str, BotConfig]) -> dict[str, BotConfig]:
        for name in bots:
            if not HOST_NAME.match(name):
                raise ValueError(f"bot name {name!r} must be letters, digits, '.', '_' or '-'")
        return bots

    @field_validator("hosts")
    @classmethod
    def _host_names(cls, hosts: dict[str, HostConfig]) -> dict[str, HostConfig]:
        for name, host in hosts.items():
            if not HOST_NAME.match(name):
                raise ValueError(f"host name {name!r} must be letters, digits, '.', '_' or '-' (no ':')")
            if name == LOCAL and host.ssh:
                raise ValueError("'local' is this machine and cannot have an ssh target")
            if name in ENDPOINT_KINDS:
                raise ValueError(
                    f"host name {name!r} is reserved: `{name}:NAME` names a [{name}s.NAME] of the fleet; rename the host"
                )
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

    def select(
        self, hosts: list[str] | None = None, tags: list[str] | None = None, look_up: Callable[[str], HostConfig] | None = None
    ) -> list[str]:
        """The hosts named (each once, in the order first named; host expressions as drover/hostsets.py reads
        them), or every host when none is given (None); only those with one of `tags`.  An explicitly empty list
        selects nothing: `[]` is not "everyone".  A tag no host of the fleet has, or tags none of the named hosts
        has, is a TargetError (no_match): never an empty answer.  `look_up` checks and reads each host (default:
        `host`): a Context passes its routes' (Context.select), so that a fan-out looks each host up once."""
        from drover.hostsets import expand  # ranges and exclusions: node[01-40], h[1-3],!h2

        look_up = look_up or self.host
        names = self.host_names() if hosts is None else list(dict.fromkeys(expand(hosts, self.host_names())))
        configs = {name: look_up(name) for name in names}  # an unknown host raises UnknownHost, the first named first
        if tags is not None:
            _known_tags(self, tags)
            chosen = [n for n in names if set(tags) & set(configs[n].tags)]
            if tags and names and not chosen:  # a selector that matched nothing is said, never an empty answer
                raise TargetError(
                    f"no host among {', '.join(names)} has the tag(s) {', '.join(tags)}: nobody was asked",
                    code=P.NO_MATCH,
                    hint="`drover fleet show` lists the hosts and their tags",
                )
            names = chosen
        return names

    def stall_after(self, host: str, engine: str | None) -> float:
        """How long a working session may show no progress before it is `stalled`: the host's own setting, else its
        engine's, else [defaults] (a host that is slow or loaded knows better than an engine in general)."""
        own = self.hosts[host].stall_after if host in self.hosts else None
        prof = self.engines.get(engine or "")
        for value in (own, prof.stall_after if prof is not None else None):
            if value is not None:
                return value
        return self.defaults.stall_after

    def profile_overrides(self) -> dict[str, dict[str, Any]]:
        return {name: prof.overrides() for name, prof in self.engines.items()}


def _known_tags(fleet: Fleet, tags: list[str]) -> None:
    """A tag no host of the fleet has is a typo, not a selector: an error naming the tags there are (exit 6)."""
    known = sorted({t for h in fleet.hosts.values() for t in h.tags})
    unknown = [t for t in tags if t not in known]
    if unknown:
        raise TargetError(
            f"unknown tag(s) {', '.join(map(repr, unknown))}: no host of the fleet has it",
            code=P.NO_MATCH,
            hint=f"the fleet's tags: {', '.join(known) or 'none'}; `drover fleet show` lists the hosts and their tags",
        )


def default_path() -> Path:
    return Path(paths.default_fleet())


def find_path(explicit: str | os.PathLike[str] | None = None) -> tuple[Path, bool]:
    """The fleet file to use, and whether the user named it (a named file must exist)."""
    if explicit is not None:
        if not os.fspath(explicit).strip():
            raise UsageError(
                "--fleet is empty: name a fleet file", hint="or leave --fleet out to use $DROVER_FLEET or the default"
            )
        return Path(explicit).expanduser(), True
    named = paths.named_fleet()
    if named:
        return Path(named).expanduser(), True
    return default_path(), False


def parse(text: str, path: Path) -> Fleet:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FleetInvalid(str(path), [f"{path.name}: not valid TOML: {exc}"]) from None
    except RecursionError:  # arrays or tables nested past what the parser can descend
        raise FleetInvalid(str(path), [deep_line(text, path)]) from None
    hostile = strange_values(data, text, path)  # before validation, which would carry them into an error or a path
    if hostile:
        raise FleetInvalid(str(path), hostile)
    try:
        return Fleet.model_validate(data)
    except ValidationError as exc:
        raise FleetInvalid(str(path), problems(path, text, exc)) from None


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
