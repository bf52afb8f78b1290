"""The seam for receivers that are not sessions (drover/ops/endpoints.py): `bot:NAME` and `adapter:NAME` are parsed
as such, never as hosts; a name the fleet does not have is a target error naming what it has, and recorded; a host
may not be called `bot` or `adapter`; session-only options are refused for them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from drover.fleet import Fleet
from drover.targets import EmptyTarget, Target, parse


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert "Traceback" not in err and lines[0].startswith("drover: ")
    return lines[0]


def test_bot_and_adapter_targets_parse_as_their_kind() -> None:
    fleet = Fleet()
    assert parse("bot:triage", fleet) == Target("bot", "triage", True)
    assert parse("adapter:pager:x", fleet) == Target("adapter", "pager:x", True)
    with pytest.raises(EmptyTarget):
        parse("bot:", fleet)


@pytest.mark.parametrize("kind", ["bot", "adapter"])
def test_a_host_named_like_an_endpoint_kind_is_a_config_error(cli: Any, isolated: Path, kind: str) -> None:
    path = isolated / "fleet.toml"
    path.write_text(f'[hosts.{kind}]\nssh = "x.invalid"\n', encoding="utf-8")
    res = cli("--fleet", str(path), "ls")
    assert res.code == 7, res.err
    assert f"host name {kind!r} is reserved" in one_line(res.err)


@pytest.mark.parametrize("kind", ["bot", "adapter"])
def test_an_unknown_endpoint_is_a_recorded_target_error(cli: Any, isolated: Path, kind: str) -> None:
    res = cli("send", f"{kind}:nobody", "hello", "--json")
    assert res.code == 6, res.out
    doc = res.json()
    assert doc["errors"][0]["code"] == "unknown_endpoint"
    assert f"no {kind} 'nobody' in the fleet" in doc["errors"][0]["message"]
    assert f"[{kind}s.nobody]" in doc["errors"][0]["message"]
    messages = cli("log", "--json").json()["data"]["messages"]
    assert [(m["host"], m["target"], m["outcome"]) for m in messages] == [(kind, "nobody", "failed")]


def test_session_options_are_refused_for_an_endpoint(cli: Any, isolated: Path) -> None:
    res = cli("send", "bot:x", "hello", "--via", "tmux")
    assert res.code == 2
    assert "--via apply to sessions, not to bot:x" in one_line(res.err)
    assert cli("log", "--json").json()["data"]["messages"] == []
