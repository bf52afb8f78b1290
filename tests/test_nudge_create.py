"""--create-if-missing where it must not start anything: a directory another live session works in, and an ID
that could never name the session it would start (every later nudge would start another)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Tmux
from tests.test_nudge import records, spawnable_fleet


def test_not_into_a_directory_another_live_session_works_in(
    tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch, cli: Any
) -> None:
    spawnable_fleet(isolated, monkeypatch)
    resident = tmux.agent("resident")  # the Tmux fixture starts its panes in the test's directory
    create = ("--create-if-missing", "--engine", "demo", "--cwd", str(isolated))
    res = cli("nudge", "local:newcomer", "start here", *create, "--json")
    assert res.code == 4, res.out + res.err
    data = res.json()["data"]
    assert data["code"] == "shared_cwd" and "resident" in data["detail"]
    assert records(isolated, "spawn_requested") == [] and resident.messages() == []
    # Recorded as a refused nudge, like the other refusals.
    assert cli("log", "--json").json()["data"]["messages"][0]["code"] == "shared_cwd"


@pytest.mark.parametrize("spelt", ["symlink", "tilde"])
def test_not_into_that_directory_by_another_name_either(
    tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch, cli: Any, spelt: str
) -> None:
    """The same directory through a symlink, or as `~/...`: the client cannot tell, the host resolves both sides
    and refuses before anything starts (nothing spawned, the nudge recorded as refused)."""
    spawnable_fleet(isolated, monkeypatch)
    resident = tmux.agent("resident")  # works in the test's directory
    if spelt == "symlink":
        (isolated / "alias").symlink_to(isolated)
        where = str(isolated / "alias")
    else:
        monkeypatch.setenv("HOME", str(isolated.parent))
        where = f"~/{isolated.name}"
    create = ("--create-if-missing", "--engine", "demo", "--cwd", where)
    res = cli("nudge", "local:newcomer", "start here", *create, "--json")
    assert res.code == 4, res.out + res.err
    data = res.json()["data"]
    assert data["code"] == "shared_cwd" and "resident" in data["detail"], data
    assert [s["name"] for s in data["sharing"]] == ["resident"]
    assert resident.messages() == []
    assert cli("ls", "--json").json()["data"]["sessions"] and not [
        s for s in cli("ls", "--json").json()["data"]["sessions"] if s.get("name") == "newcomer"
    ]
    assert cli("log", "--json").json()["data"]["messages"][0]["code"] == "shared_cwd"


def test_an_id_that_cannot_name_a_new_session_needs_a_name(
    tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch, cli: Any
) -> None:
    spawnable_fleet(isolated, monkeypatch)
    where = isolated / "elsewhere"
    where.mkdir()
    res = cli("nudge", "local:%99", "hello", "--create-if-missing", "--engine", "demo", "--cwd", str(where))
    assert res.code == 2 and "--name" in res.err
    assert records(isolated, "spawn_requested") == []


@pytest.mark.parametrize("shared", [True, False])
def test_an_engine_drover_cannot_start_is_a_usage_error_first_shared_directory_or_not(
    tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch, cli: Any, shared: bool
) -> None:
    """A typo in --engine: exit 2, nothing recorded, the same whether or not the directory is shared (it was a
    recorded shared_cwd refusal, exit 4, when another session worked there)."""
    spawnable_fleet(isolated, monkeypatch)
    tmux.agent("resident")  # works in the test's directory
    where = isolated if shared else isolated / "elsewhere"
    where.mkdir(exist_ok=True)
    for argv in (
        ("nudge", "local:newcomer", "start here", "--create-if-missing", "--engine", "claud", "--cwd", str(where)),
        (
            "op",
            "sessions.nudge",
            json.dumps(
                {"host": "local", "id": "newcomer", "text": "x", "create_if_missing": True, "engine": "claud", "cwd": str(where)}
            ),
        ),
    ):
        res = cli(*argv)
        assert res.code == 2, res.out + res.err
        assert "does not know how to start engine 'claud'" in res.err and "did you mean 'claude'?" in res.err, res.err
    assert records(isolated) == []
