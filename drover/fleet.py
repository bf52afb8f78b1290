"""The fleet inventory: `fleet.toml`, validated with pydantic.

Found at `--fleet`, else `$DROVER_FLEET`, else `$XDG_CONFIG_HOME/drover/fleet.toml`; with none, a built-in fleet
that holds only `local`, so drover works with no file at all.  `fleet.example.toml` documents every key.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from drover.errors import ConfigError, FleetInvalid, UnknownHost

LOCAL = "local"
HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


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
    connect_timeout: float | None = Field(None, gt=0)
    request_timeout: float | None = Field(None, gt=0)


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

    @field_validator("scripts", "dialog", "busy", "idle")
    @classmethod
    def _regexes(cls, value: list[str] | None) -> list[str] | None:
        for pattern in value or []:
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
    if explicit:
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
        msg = err["msg"]
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


def load(explicit: str | os.PathLike[str] | None = None) -> tuple[Fleet, Path | None]:
    """The fleet and the file it came from (None for the built-in fleet)."""
    path, named = find_path(explicit)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if named:
            raise ConfigError(
                f"fleet file {path} does not exist", hint="create it with `drover fleet add`, or drop --fleet/$DROVER_FLEET"
            ) from None
        return Fleet(), None
    except OSError as exc:
        raise ConfigError(f"cannot read fleet file {path}: {exc.strerror}") from None
    return parse(text, path), path


def read_raw(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise FleetInvalid(str(path), [f"{path.name}: not valid TOML: {exc}"]) from None


def write_raw(path: Path, data: dict[str, Any]) -> Fleet:
    """Validate, then write atomically (comments in the old file are not kept: tomli-w writes plain TOML)."""
    import tomli_w

    try:
        fleet = Fleet.model_validate(data)
    except ValidationError as exc:
        raise FleetInvalid(str(path), _problems(path, "", exc)) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(tomli_w.dumps(data), encoding="utf-8")
    os.replace(tmp, path)
    return fleet
