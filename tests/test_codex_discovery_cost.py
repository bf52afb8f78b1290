"""What discovery asks the real Codex app-server (0.169, offline): a thread that is no pane's is read once.

Codex starts an ephemeral thread (a title) after a prompt and keeps it loaded; discovery read every loaded thread
on every look, so each send's two looks grew with every turn the daemon had served.  Measured here on the real
daemon: the second look reads only the threads that may be a pane's, and finds the same ones with their status.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from drover.remote import codex
from tests.support.codexlab import CodexLab, module_lab, wait_for


@pytest.fixture(scope="module")
def lab() -> Iterator[CodexLab]:
    with module_lab("dcd-") as lab:
        yield lab


def test_a_thread_that_is_no_panes_is_read_once(lab: CodexLab, monkeypatch: pytest.MonkeyPatch) -> None:
    s = lab.start("cost-a")
    s.submit("a prompt, after which Codex loads a title thread")
    s.wait_screen(r"^› a prompt, after which Codex loads a title thread\s*\n\s*• Understood\.")
    s.wait_idle()
    home = str(lab.codex_home)

    def loaded() -> list[str]:
        return [str(t) for t in codex.call(home, [("thread/loaded/list", {})])[0]["result"]["data"]]

    def read(tid: str) -> dict[str, Any]:
        return dict(codex.call(home, [("thread/read", {"threadId": tid})])[0]["result"]["thread"])

    # the title thread, loaded beside the pane's own (an ephemeral thread of the same daemon)
    def with_a_title() -> list[str] | None:
        ids = loaded()
        return ids if any(read(t).get("ephemeral") for t in ids) else None

    everything = wait_for(with_a_title, 30, "a title thread among the loaded ones")
    not_users = {t for t in everything if not codex.is_users(read(t))}
    assert not_users and set(everything) - not_users

    reads: list[str] = []
    real_call = codex.call

    Calls = list[tuple[str, dict[str, Any]]]

    def counted(calls: Calls) -> Calls:
        reads.extend(str(p["threadId"]) for method, p in calls if method == "thread/read")
        return calls

    def counting(home: str, calls: Calls, timeout: float = 3.0, then: Any = None) -> list[dict[str, Any]]:
        follow = (lambda answers: counted(then(answers))) if then is not None else None
        return real_call(home, counted(calls), timeout, then=follow)

    monkeypatch.setattr(codex, "call", counting)
    monkeypatch.setattr(codex, "_NOT_USERS", {})
    first = codex.loaded_threads(home, [])
    assert first is not None and set(reads) >= set(everything)  # a first look reads them all
    users = sorted(str(t["id"]) for t in first)
    assert users and not set(users) & not_users  # and gives back only threads that may be a pane's
    reads.clear()
    second = codex.loaded_threads(home, [])
    assert second is not None and sorted(str(t["id"]) for t in second) == users
    assert reads and not set(reads) & not_users  # the next look skips what is no pane's ...
    assert all(codex.status_of(t) == "idle" for t in second)  # ... and still reads the others' status now
