"""A typed outcome (drover/ops/outcome.py): its members in the order they came, its exit code a property that no
document or record shows.  The documents themselves are pinned by tests/test_documents_golden.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from drover.errors import ExitCode
from drover.ops.outcome import Outcome, exit_code_for


def test_an_outcome_keeps_its_members_in_order_and_its_exit_code_out_of_them() -> None:
    answer = {"outcome": "refused", "lane": "tmux", "code": "dialog", "detail": "refused: a dialog", "state": "dialog"}
    outcome = Outcome.of(answer)
    assert outcome.to_dict() == answer and list(outcome.to_dict()) == list(answer)
    assert outcome.exit_code == ExitCode.REFUSED
    outcome.detail += " (redirected)"
    outcome.redirected_from = "local:old"
    assert list(outcome.to_dict()) == [*answer, "redirected_from"]  # a member set later goes last, as in a dict
    missing = Outcome.of({"outcome": "failed", "lane": None, "code": "session_not_found", "detail": "no"}, target_error=True)
    assert missing.exit_code == ExitCode.TARGET
    assert "target_error" not in missing.to_dict() and "target_error" not in missing.model_dump(mode="json")
    assert "exit_code" not in missing.to_dict()


def test_an_outcome_of_the_wrong_shape_is_an_error_not_a_coerced_value() -> None:
    with pytest.raises(ValidationError):
        Outcome.of({"outcome": "delivered", "verified": "yes"})
    with pytest.raises(ValidationError):
        Outcome.of({"outcome": 0})


@pytest.mark.parametrize(
    ("outcome", "code"),
    [("delivered", 0), ("queuedBehindTurn", 0), ("held", 3), ("refused", 4), ("dropped", 4), ("failed", 5), (None, 5)],
)
def test_exit_codes_follow_the_outcome(outcome: str | None, code: int) -> None:
    assert exit_code_for(outcome) == code
    assert exit_code_for(outcome, target_error=True) == ExitCode.TARGET
