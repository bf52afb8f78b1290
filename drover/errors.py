"""One error tree for drover: every failure has a stable string code and a documented exit code.

Errors are raised as domain exceptions anywhere in the library and rendered in exactly one place
(`drover.cli.render.render_error` for humans, the op document for `--json` and `drover op`).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from drover.remote import protocol as P


class ExitCode(IntEnum):
    """The process exit codes drover documents (docs/cli.md, `drover --help`)."""

    OK = 0  # delivered or queued; the op succeeded
    INTERNAL = 1  # a bug in drover: please report it (run with --debug for the traceback)
    USAGE = 2  # bad arguments, malformed JSON, unknown op, empty text
    HELD = 3  # the receiver holds the message for its human
    REFUSED = 4  # refused (by the receiver, or by drover's guard or limits) or dropped; guard check: would refuse
    FAILED = 5  # never reached the receiver: host unreachable, auth, timeout, tmux stuck
    TARGET = 6  # unknown host, unknown or ambiguous session
    CONFIG = 7  # the fleet file is invalid or cannot be read/written
    PARTIAL = 8  # a fan-out where some hosts answered and some failed
    TIMEOUT = 9  # drover wait: the session did not reach the state in time
    INTERRUPTED = 130  # Ctrl-C


OUTCOME_EXIT = {
    P.DELIVERED: ExitCode.OK,
    P.QUEUED: ExitCode.OK,
    P.HELD: ExitCode.HELD,
    P.REFUSED: ExitCode.REFUSED,
    P.DROPPED: ExitCode.REFUSED,
    P.FAILED: ExitCode.FAILED,
}

# The exit code of each class of code in drover/remote/protocol.py: every code's exit code follows from its class.
CLASS_EXIT = {
    P.USAGE: ExitCode.USAGE,
    P.TARGET: ExitCode.TARGET,
    P.CONFIG: ExitCode.CONFIG,
    P.REFUSAL: ExitCode.REFUSED,
    P.DROP: ExitCode.REFUSED,
    P.FAILURE: ExitCode.FAILED,
    P.TIMEOUT: ExitCode.TIMEOUT,
    P.INTERNAL: ExitCode.INTERNAL,
}


def exit_code_of(code: str) -> ExitCode:
    """The documented exit code for an error code (an unknown code is a failure, never success)."""
    return CLASS_EXIT.get(P.CODES.get(code, P.FAILURE), ExitCode.FAILED)


class DroverError(Exception):
    """Base of every error drover reports. `code` is stable; `message` is one human line; `hint` says what to do."""

    code = P.INTERNAL_ERROR
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
    code = P.USAGE_ERROR
    exit_code = ExitCode.USAGE


class BadJSON(UsageError):
    code = P.BAD_JSON


class UnknownOp(UsageError):
    code = P.UNKNOWN_OP


class InvalidRequest(UsageError):
    code = P.INVALID_REQUEST


class EmptyText(UsageError):
    code = P.EMPTY_TEXT


class UnknownEngine(UsageError):
    code = P.UNKNOWN_ENGINE


class ConfigError(DroverError):
    code = P.CONFIG_ERROR
    exit_code = ExitCode.CONFIG


class FleetInvalid(ConfigError):
    code = P.FLEET_INVALID

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
    code = P.TARGET_ERROR
    exit_code = ExitCode.TARGET


class UnknownHost(TargetError):
    code = P.UNKNOWN_HOST


class UnknownEndpoint(TargetError):
    code = P.UNKNOWN_ENDPOINT


class SessionNotFound(TargetError):
    code = P.SESSION_NOT_FOUND


class AmbiguousSession(TargetError):
    code = P.AMBIGUOUS_SESSION


class Refused(DroverError):
    """drover itself refuses to send (size or rate limits); recorded like any other outcome."""

    code = P.REFUSED_BY_DROVER
    exit_code = ExitCode.REFUSED


class TransportError(DroverError):
    """The host could not be reached or did not answer in time."""

    code = P.UNREACHABLE
    exit_code = ExitCode.FAILED


class HelperFailed(TransportError):
    """The helper ran but reported an error it could not recover from."""

    code = P.HELPER_ERROR


# A helper error becomes the exception of its code's class.
CLASS_ERROR: dict[str, type[DroverError]] = {
    P.USAGE: InvalidRequest,
    P.TARGET: TargetError,
    P.CONFIG: ConfigError,
    P.FAILURE: HelperFailed,
}
# Where the class's generic exception is not specific enough.
CODE_ERROR: dict[str, type[DroverError]] = {
    P.SESSION_NOT_FOUND: SessionNotFound,
    P.NO_TRANSCRIPT: SessionNotFound,
    P.AMBIGUOUS_SESSION: AmbiguousSession,
    P.EMPTY_TEXT: EmptyText,
}

HELPER_HINTS = {
    P.SESSION_NOT_FOUND: "run `drover ls` to see the sessions",
    P.AMBIGUOUS_SESSION: "name it exactly: a pane id such as %3, or session:window.pane",
    P.NO_TMUX: "install tmux on that host",
    P.TMUX_TIMEOUT: "the tmux server may be stopped or overloaded",
}


def from_helper(error: dict[str, Any], host: str) -> DroverError:
    """Turn a helper's error answer into the right exception."""
    code = str(error.get("code", P.HELPER_ERROR))
    cls = CODE_ERROR.get(code) or CLASS_ERROR.get(P.CODES.get(code, P.FAILURE), HelperFailed)
    details = {k: v for k, v in error.items() if k not in ("code", "message")}
    hint = HELPER_HINTS.get(code)
    if code == P.AMBIGUOUS_SESSION:
        hint = _ambiguous_hint(host, details.get("candidates"), hint)
    return cls(str(error.get("message", "the helper failed")), host=host, code=code, hint=hint, details=details)


def _ambiguous_hint(host: str, candidates: Any, hint: str | None) -> str | None:
    """Sessions on different tmux servers share pane ids (%0 on each) and session:window.pane: only SERVER/ID names
    one of them, so the hint gives one such target that works, not forms that are ambiguous too."""
    if not isinstance(candidates, list):
        return hint
    servers = {c.get("server") for c in candidates if isinstance(c, dict)}
    first = next((c for c in candidates if isinstance(c, dict) and c.get("server") and c.get("id")), None)
    if len(servers) < 2 or first is None:
        return hint
    return f"they are on different tmux servers: name one with its server, e.g. {host}:{first['server']}/{first['id']}"


# -- the truth file (drover/truth.py) ----------------------------------------------------------------------------
class TruthFileError(ConfigError):
    """The truth file cannot be used: drover will not send what it cannot record (exit code 7, config)."""

    code = P.TRUTH_FILE_ERROR


class TruthUnwritable(TruthFileError):
    """The truth file or its directory cannot be written: read-only, permissions, I/O error."""

    code = P.TRUTH_UNWRITABLE


class TruthDiskFull(TruthUnwritable):
    """No space left for the truth file (ENOSPC, EDQUOT, or a file size limit)."""

    code = P.TRUTH_DISK_FULL


class TruthUnsafe(TruthFileError):
    """The truth file or its directory is a symlink, someone else's, or writable by others: not trusted."""

    code = P.TRUTH_UNSAFE
