"""What became of one delivery attempt, typed: the send path's `Outcome`.

An outcome comes from a host's helper (its `deliver` answer), from drover itself (a session not found, a limit, a
retry that does nothing), or from the truth file's view of a message.  It is reported in the op's document and
recorded in the truth file, both as the same JSON object, whose members keep the order in which they were given
(the helper's order, then what drover added): the documents are byte for byte what they were when outcomes were
plain dicts (tests/test_documents_golden.py).

The exit code is a property, never serialised: it follows from the outcome, except for a failure that was the
target's (no such session, an ambiguous name), which has the target's own exit code.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SerializerFunctionWrapHandler, model_serializer

from drover.errors import OUTCOME_EXIT, ExitCode
from drover.remote import protocol as P


def exit_code_for(outcome: str | None, target_error: bool = False) -> int:
    """The exit code of an outcome (delivered 0, held, refused, failed ...); a target's failure: TARGET."""
    if target_error:
        return ExitCode.TARGET
    return int(OUTCOME_EXIT.get(outcome or P.FAILED, ExitCode.FAILED))


class Outcome(BaseModel):
    """One outcome.  The members drover reads are typed fields; whatever else a lane reports (the session, the
    declared mode, the receiver's ids, ...) is kept as it came, in its place."""

    # Strict: a helper answer of the wrong shape is a loud error, never a value quietly coerced into a document.
    model_config = ConfigDict(extra="allow", strict=True)

    outcome: str = P.FAILED
    lane: str | None = None
    code: str | None = None
    detail: str = ""
    verified: bool | None = None
    indeterminate: bool | None = None
    redirected_from: str | None = None
    attempt: str | None = None
    # Not part of any document or record: the failure was the target's, so the exit code is TARGET.
    target_error: bool = Field(False, exclude=True)
    # The members given or set, in order: only these are serialised (a field left at its default is not a member).
    _keys: list[str] = PrivateAttr(default_factory=list)

    @classmethod
    def of(cls, members: dict[str, Any], *, target_error: bool = False) -> Outcome:
        """An outcome from its JSON members (a helper's answer, or drover's own)."""
        made = cls.model_validate(members)
        made._keys = [k for k in members if k != "target_error"]
        if target_error:
            made.target_error = True
        return made

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if not name.startswith("_") and name != "target_error" and name not in self._keys:
            self._keys.append(name)  # a member set later goes after the others, as a dict's would

    def set(self, name: str, value: Any) -> None:
        """Set a member that is not a typed field (a receiver's id, a lane's detail), in its place."""
        setattr(self, name, value)

    def get(self, name: str, default: Any = None) -> Any:
        """A member that is not a typed field, as it came (or default)."""
        return self.to_dict().get(name, default)

    @property
    def exit_code(self) -> int:
        return exit_code_for(self.outcome, self.target_error)

    @model_serializer(mode="wrap")
    def _members(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped = handler(self)
        return {k: dumped[k] for k in self._keys if k in dumped}

    def to_dict(self) -> dict[str, Any]:
        """The JSON members, in order: what the document shows and the truth file records."""
        return self.model_dump()


class DecidedThenCancelled(asyncio.CancelledError):
    """A cancellation (Ctrl-C, SIGTERM) that came after the receiver had decided: `outcome` is what it decided.

    An adapter that has exited has said what became of the message; drover may still be reading its pipes when it
    is stopped.  Recording `interrupted` then would make `drover retry` run it again: the send path records this
    outcome instead, and goes on being cancelled."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__("cancelled after the receiver decided")
        self.outcome = outcome
