"""Engine profiles and spawn templates as fleet.toml writes them (`[engines.NAME]`, `[spawn.ENGINE]`), and the
strict base every fleet table shares: a typo in a key is an error, never a setting silently ignored.

Split from fleet.py, which holds the hosts, the limits and the fleet as a whole.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from drover.paths import MAX_DURATION_S, seconds_in


def check_regexes(value: list[str] | str | None) -> list[str] | str | None:
    """A pattern (or patterns) of the fleet file, compiled once to refuse a broken one with its line."""
    for pattern in [value] if isinstance(value, str) else value or []:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{pattern!r} is not a valid regular expression: {exc}") from None
    return value


# A key that holds seconds takes a number or a duration of the one grammar ("90s", "15m", "1h30m"): the fleet file
# writes every length of time the same way.
Seconds = Annotated[float, BeforeValidator(seconds_in)]
MaybeSeconds = Annotated[float | None, BeforeValidator(seconds_in)]


class _Strict(BaseModel):
    # A typo in a key is an error, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid")


class EngineProfile(_Strict):
    commands: list[str] | None = None
    scripts: list[str] | None = None
    dialog: list[str] | None = None
    busy: list[str] | None = None
    idle: list[str] | None = None
    dialog_scope: Literal["screen", "live", "last_line"] | None = None
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
    live_skip_block: list[str] | None = Field(None, description="[first line, last line] of a block left out")
    placeholder_faint: bool | None = None
    submit_when_busy: Literal["Enter", "Tab"] | None = None
    submit_delay_s: MaybeSeconds = Field(None, ge=0, le=10)
    paste_hold_s: MaybeSeconds = Field(None, ge=0, le=2)
    input_end_last: bool | None = None
    # [engines.shell]: the user vouches that their tcsh never uses vi bindings (drover cannot read tcsh's mode).
    tcsh_emacs: bool | None = None
    # Read by the client (drover/session_state.py), never sent to the host with the screen patterns.
    stall_after: MaybeSeconds = Field(None, gt=0, le=MAX_DURATION_S)

    @field_validator(
        "scripts",
        "dialog",
        "busy",
        "idle",
        "placeholder",
        "paste_marker",
        "input",
        "input_above",
        "input_end",
        "empty_footer",
        "live_skip_block",
    )
    @classmethod
    def _regexes(cls, value: list[str] | str | None) -> list[str] | str | None:
        return check_regexes(value)

    @field_validator("live_skip_block")
    @classmethod
    def _two_lines(cls, value: list[str] | None) -> list[str] | None:
        if value and len(value) != 2:
            raise ValueError("live_skip_block names two patterns: the block's first line and its last line")
        return value

    def overrides(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True, exclude={"stall_after"})


class SpawnEngine(_Strict):
    """How `drover spawn` starts one engine: `[spawn.claude]`, `[spawn.codex]`, or an engine of your own."""

    command: str = Field(..., min_length=1, description="the command line; {cwd} and {name} are filled in, shell-quoted")
    ready_timeout_s: Seconds = Field(60.0, gt=0, le=3600, description="how long a new session may take to be ready")
    trust_file: str | None = Field(None, description="the engine's settings file that pre-trusting writes (default: its own)")
    ready: str | None = Field(None, description="a regex the screen must show, besides an idle input box, to be ready")

    @field_validator("ready")
    @classmethod
    def _ready_regex(cls, value: str | None) -> str | None:
        check_regexes(value or None)
        return value

    @field_validator("command")
    @classmethod
    def _placeholders(cls, value: str) -> str:
        import string

        try:
            fields = [f for _t, f, _s, _c in string.Formatter().parse(value) if f is not None]
        except ValueError as exc:
            raise ValueError(f"not a valid template ({exc}): write a literal brace as {{{{ or }}}}") from None
        unknown = sorted(set(fields) - {"cwd", "name"})
        if unknown:
            raise ValueError(f"unknown placeholder {{{unknown[0]}}}: only {{cwd}} and {{name}} are filled in")
        return value
