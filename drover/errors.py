"""One error tree for drover: every failure has a stable string code and a documented exit code.

Errors are raised as domain exceptions anywhere in the library and rendered in exactly one place
(`drover.cli.render.render_error` for humans, the op document for `--json` and `drover op`).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    """The process exit codes drover documents (README, `drover --help`)."""

    OK = 0  # delivered or queued; the op succeeded
    INTERNAL = 1  # a bug in drover: please report it (run with --debug for the traceback)
    USAGE = 2  # bad arguments, malformed JSON, unknown op, empty text
    HELD = 3  # the receiver holds the message for its human
    REFUSED = 4  # refused (by the receiver, or by drover's guard or limits) or dropped
    FAILED = 5  # never reached the receiver: host unreachable, auth, timeout, tmux stuck
    TARGET = 6  # unknown host, unknown or ambiguous session
    CONFIG = 7  # the fleet file is invalid or cannot be read/written
    PARTIAL = 8  # a fan-out where some hosts answered and some failed
    TIMEOUT = 9  # drover wait: the session did not reach the state in time
    INTERRUPTED = 130  # Ctrl-C


OUTCOME_EXIT = {
    "delivered": ExitCode.OK,
    "queuedBehindTurn": ExitCode.OK,
    "held": ExitCode.HELD,
    "refused": ExitCode.REFUSED,
    "dropped": ExitCode.REFUSED,
    "failed": ExitCode.FAILED,
}


class DroverError(Exception):
    """Base of every error drover reports. `code` is stable; `message` is one human line; `hint` says what to do."""

    code = "error"
    exit_code = ExitCode.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        host: str | None = None,
        code: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.host = host
        if code:
            self.code = code
        self.details = details or {}

    def line(self) -> str:
        """The one line a human sees."""
        where = f"{self.host}: " if self.host else ""
        hint = f" ({self.hint})" if self.hint else ""
        return f"{where}{self.message}{hint}"

    def __str__(self) -> str:
        return self.line()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.host:
            out["host"] = self.host
        if self.hint:
            out["hint"] = self.hint
        out.update(self.details)
        return out


class UsageError(DroverError):
    code = "usage"
    exit_code = ExitCode.USAGE


class BadJSON(UsageError):
    code = "bad_json"


class UnknownOp(UsageError):
    code = "unknown_op"


class InvalidRequest(UsageError):
    code = "invalid_request"


class EmptyText(UsageError):
    code = "empty_text"


class ConfigError(DroverError):
    code = "config"
    exit_code = ExitCode.CONFIG


class FleetInvalid(ConfigError):
    code = "fleet_invalid"

    def __init__(self, path: str, problems: list[str]) -> None:
        self.problems = problems
        first = problems[0] if problems else "invalid"
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        super().__init__(
            f"invalid fleet file {path}: {first}{more}",
            hint="fix the file; `drover fleet show` re-checks it",
            details={"problems": problems},
        )


class TargetError(DroverError):
    code = "target"
    exit_code = ExitCode.TARGET


class UnknownHost(TargetError):
    code = "unknown_host"


class SessionNotFound(TargetError):
    code = "session_not_found"


class AmbiguousSession(TargetError):
    code = "ambiguous_session"


class Refused(DroverError):
    """drover itself refuses to send (size or rate limits); recorded like any other outcome."""

    code = "refused"
    exit_code = ExitCode.REFUSED


class TransportError(DroverError):
    """The host could not be reached or did not answer in time."""

    code = "unreachable"
    exit_code = ExitCode.FAILED


class HelperFailed(TransportError):
    """The helper ran but reported an error it could not recover from."""

    code = "helper_error"


# Helper error codes (drover/remote/helper.py) mapped onto the tree.
HELPER_CODES: dict[str, type[DroverError]] = {
    "session_not_found": SessionNotFound,
    "ambiguous_session": AmbiguousSession,
    "empty_text": EmptyText,
    "no_transcript": SessionNotFound,
    "bad_request": InvalidRequest,
    "bad_lane": InvalidRequest,
    "unknown_engine": InvalidRequest,
    "bad_profile": ConfigError,
}

HELPER_HINTS = {
    "session_not_found": "run `drover ls` to see the sessions",
    "ambiguous_session": "name it exactly: a pane id such as %3, or session:window.pane",
    "no_tmux": "install tmux on that host",
    "tmux_timeout": "the tmux server may be stopped or overloaded",
}


def from_helper(error: dict[str, Any], host: str) -> DroverError:
    """Turn a helper's error answer into the right exception."""
    code = str(error.get("code", "helper_error"))
    cls = HELPER_CODES.get(code, HelperFailed)
    details = {k: v for k, v in error.items() if k not in ("code", "message")}
    return cls(str(error.get("message", "the helper failed")), host=host, code=code, hint=HELPER_HINTS.get(code), details=details)
