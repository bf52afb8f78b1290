"""Command adapters as fleet.toml writes them: `[adapters.NAME]`, the receivers `adapter:NAME` (drover/adapters.py).

Split from fleet.py like the engine tables: the fleet holds them as `Fleet.adapters`, keyed by NAME.
"""

from __future__ import annotations

import re

from pydantic import Field, ValidationInfo, field_validator

from drover.fleet_engines import Seconds, _Strict
from drover.paths import MAX_DURATION_S

# The name is written into `adapter:NAME` and the adapter's DROVER_TARGET: the host names' alphabet, so it reads
# the same everywhere and never carries a ':' that would make the target mean two things.
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# Set by drover for every run: the fleet's env may not override what the adapter is told about the message.
RESERVED_ENV = ("DROVER_MESSAGE_ID", "DROVER_ACTOR", "DROVER_TARGET", "DROVER_ATTEMPT")


class AdapterConfig(_Strict):
    command: str = Field(..., min_length=1, description="the program: a path, or a name looked up on PATH (no shell)")
    args: list[str] = Field(default_factory=list, description="its arguments, each passed as it is written")
    timeout: Seconds = Field(30.0, gt=0, le=MAX_DURATION_S, description="killed (its whole process group) after this")
    env: dict[str, str] = Field(default_factory=dict, description="added to drover's own environment for it")
    cwd: str | None = Field(None, description="the directory it runs in (~ is the home); default: drover's own")

    @field_validator("command", "args", "cwd")
    @classmethod
    def _no_nul(cls, value: str | list[str] | None) -> str | list[str] | None:
        # A NUL cannot be passed to exec: said here, with the line, rather than at the first send.
        for item in [value] if isinstance(value, str) else value or []:
            if "\x00" in item:
                raise ValueError("may not hold a NUL character")
        return value

    @field_validator("command", "cwd")
    @classmethod
    def _absolute(cls, value: str | None, info: ValidationInfo) -> str | None:
        # Relative to what?  The daemon runs from /, a cron job from the home, a shell from anywhere: said once.
        if value is None or (info.field_name == "command" and "/" not in value):
            return value  # a bare command name is looked up on PATH
        if not (value.startswith("/") or value.startswith("~/")):
            raise ValueError(f"{value!r} must be absolute or ~/... (a bare command name is looked up on PATH)")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for key, value in env.items():
            if not ENV_NAME.match(key):
                raise ValueError(f"environment name {key!r} must be letters, digits and '_' (not starting with a digit)")
            if key in RESERVED_ENV:
                raise ValueError(f"{key} is set by drover for each message; remove it from env")
            if "\x00" in value:
                raise ValueError(f"{key}'s value may not hold a NUL character")
        return env


def check_names(adapters: dict[str, AdapterConfig]) -> dict[str, AdapterConfig]:
    for name in adapters:
        if not ADAPTER_NAME.match(name):
            raise ValueError(f"adapter name {name!r} must be letters, digits, '.', '_' or '-' (no ':')")
    return adapters
