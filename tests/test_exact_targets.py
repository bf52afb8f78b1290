"""Targets never guess: each way a typo used to reach some session (or an empty answer) is now an error that names
the right thing -- the fleet's hosts, the names that exist, the engines and tags there are -- and never a delivery."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Pane, Tmux, remote_agent, stays


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert "Traceback" not in err and lines[0].startswith("drover: ")
    return lines[0]


def logged(cli: Any) -> list[tuple[str, str, str]]:
    return [(m["host"], m["target"], m["outcome"]) for m in cli("log", "--json").json()["data"]["messages"]]


@pytest.fixture
def fleet(isolated: Path) -> Path:
    """A fleet with two hosts and tags; box-a is never reached (these cases fail before any connection)."""
    path = isolated / "fleet.toml"
    path.write_text(
        '[hosts.box-a]\nssh = "box-a.invalid"\ntags = ["gpu"]\n[hosts.hb]\nssh = "hb.invalid"\ntags = ["web"]\n'
        '[engines.mine]\ncommands = ["mine"]\n',
        encoding="utf-8",
    )
    return path


@pytest.fixture
def worker(tmux: Tmux) -> Pane:
    return tmux.agent("worker-1")


def test_a_typo_in_the_host_is_an_unknown_host_never_a_local_name(cli: Any, fleet: Path, worker: Pane) -> None:
    for command in (["send", "hbb:worker-1", "hi"], ["nudge", "hbb:worker-1", "hi"], ["status", "hbb:worker-1"]):
        res = cli("--fleet", str(fleet), *command)
        assert res.code == 6, (command, res.err)
        line = one_line(res.err)
        assert "unknown host 'hbb'" in line and "known hosts: local, box-a, hb" in line, line
        assert "no session" not in line  # not taken as a local pane's name
    assert logged(cli) == []  # refused before anything was recorded
    stays(lambda: worker.messages() == [], what="nothing delivered")


def test_a_local_name_with_a_colon_is_written_with_its_host(cli: Any, fleet: Path, tmux: Tmux) -> None:
    pane = tmux.agent("work")
    res = cli("--fleet", str(fleet), "send", "work:0.0", "hi")
    assert res.code == 6 and "a local pane whose name holds ':' is written local:work:0.0" in one_line(res.err)
    res = cli("--fleet", str(fleet), "send", "local:work:0.0", "hi", "--json")
    assert res.code == 0, res.err
    assert res.json()["data"]["session"]["id"] == pane.id


def test_a_prefix_of_a_name_is_no_target(cli: Any, worker: Pane, tmux: Tmux) -> None:
    """`send hb:worker` went to worker-1: now no session bears the name, and the error says which names start so."""
    for typed in ("worker", "local:worker", "worker-", "w"):
        res = cli("send", typed, "to whom?", "--json")
        assert res.code == 6, (typed, res.out)
        data = res.json()["data"]
        assert (data["outcome"], data["code"]) == ("failed", "session_not_found"), data
        if typed != "w":
            assert "did you mean 'worker-1'" in data["detail"], data["detail"]
    for command in (["status", "worker"], ["read", "worker"], ["wait", "worker"]):
        res = cli(*command)
        assert res.code == 6 and "no session 'worker'" in one_line(res.err), (command, res.err)
    stays(lambda: worker.messages() == [], what="nothing delivered")
    # the whole name still reaches it
    assert cli("send", "worker-1", "by its name").code == 0


def test_an_unknown_engine_is_a_usage_error_in_every_command(cli: Any, fleet: Path, worker: Pane) -> None:
    commands = (
        ["ls", "--engine", "claud"],
        ["broadcast", "--engine", "claud", "hi"],
        ["send", "worker-1", "hi", "--expect-engine", "claud"],
    )
    for command in commands:
        res = cli("--fleet", str(fleet), *command)
        assert res.code == 2, (command, res.err)
        line = one_line(res.err)
        assert "unknown engine 'claud'" in line and "claude, codex, demo, gemini, mine, shell" in line, line
    assert logged(cli) == []
    stays(lambda: worker.messages() == [], what="nothing delivered")
    # an engine of the fleet's own is known: an empty answer, said as such
    res = cli("--fleet", str(fleet), "ls", "--engine", "mine", "--host", "local")
    assert res.code == 0, res.err
    assert "no mine sessions on the 1 host(s) that answered" in res.out and "start an agent" not in res.out


def test_an_unknown_tag_is_a_target_error_in_every_command(cli: Any, fleet: Path, worker: Pane) -> None:
    commands = (
        ["ls", "--tag", "gpux"],
        ["board", "--tag", "gpux"],
        ["broadcast", "--tag", "gpux", "hi"],
        ["fleet", "check", "--tag", "gpux"],
        ["ls", "--tag", "gpu", "--tag", "gpux"],  # a typo beside a good tag is not dropped quietly
    )
    for command in commands:
        res = cli("--fleet", str(fleet), *command)
        assert res.code == 6, (command, res.err)
        line = one_line(res.err)
        assert "unknown tag(s) 'gpux'" in line and "the fleet's tags: gpu, web" in line, line
        assert "no sessions" not in res.out
    # a known tag that none of the chosen hosts has: the same class, said as such
    for command in (["ls", "--host", "local", "--tag", "gpu"], ["board", "--host", "hb", "--tag", "gpu"]):
        res = cli("--fleet", str(fleet), *command, "--json")
        assert res.code == 6, (command, res.out)
        assert res.json()["errors"][0]["code"] == "no_match"
    assert logged(cli) == []
    stays(lambda: worker.messages() == [], what="nothing delivered")


def test_an_unknown_host_is_a_target_error_in_every_command(cli: Any, fleet: Path) -> None:
    for command in (["ls", "--host", "hbb"], ["board", "--host", "hbb"], ["fleet", "check", "--host", "hbb"]):
        res = cli("--fleet", str(fleet), *command)
        assert res.code == 6, (command, res.err)
        assert "unknown host 'hbb'" in one_line(res.err)
    res = cli("--fleet", str(fleet), "broadcast", "--host", "hbb", "hi")
    assert res.code == 6 and "unknown host 'hbb'" in res.err


def test_ls_says_which_hosts_failed_and_why_beside_what_it_found(cli: Any, isolated: Path, tmux: Tmux) -> None:
    path = isolated / "dark.toml"
    path.write_text('[defaults]\nconnect_timeout = 2.0\n[hosts.dark]\nssh = "127.0.0.1"\nport = 1\n', encoding="utf-8")
    res = cli("--fleet", str(path), "ls")  # local answers with no session, dark fails: not "nothing runs"
    assert res.code == 8, res.out + res.err
    assert "start an agent" not in res.out and "no sessions on the 1 host(s) that answered" in res.out
    assert "1 of 2 host(s) failed" in res.out and "dark (" in res.out
    tmux.agent("found")
    res = cli("--fleet", str(path), "ls", "--json")
    assert res.code == 8
    data = res.json()["data"]
    assert [s["name"] for s in data["sessions"]] == ["found"]
    dark = next(h for h in data["hosts"] if h["host"] == "dark")
    assert dark["ok"] is False and dark["code"] and dark["error"]
    human = cli("--fleet", str(path), "ls")
    assert "found" in human.out and "1 of 2 host(s) failed" in human.out and "dark (" in human.out


def test_select_says_a_tag_that_matched_nothing_and_keeps_an_empty_list_empty(fleet: Path) -> None:
    from drover import fleet as fleet_mod
    from drover.errors import TargetError

    f = fleet_mod.parse(fleet.read_text(encoding="utf-8"), fleet)
    assert f.select(None, ["gpu"]) == ["box-a"] and f.select(None, ["gpu", "web"]) == ["box-a", "hb"]
    assert f.select([], ["gpu"]) == []  # an explicitly empty host list selects nothing, as before
    with pytest.raises(TargetError, match="no host among local, hb has the tag"):
        f.select(["local", "hb"], ["gpu"])
    with pytest.raises(TargetError, match="unknown tag"):
        f.select(None, ["GPU"])  # tags match exactly too


def test_read_takes_a_rollout_by_its_id_never_by_a_piece_of_its_file_name(
    cli: Any, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`drover read NAME` globbed `rollout-*NAME*`: a name's substring of a date or of another id read that file."""
    home = isolated / "codex"
    day = home / "sessions" / "2026" / "01" / "02"
    day.mkdir(parents=True)
    tid = "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
    line = '{"timestamp":"2026-01-02T03:04:05Z","type":"response_item","payload":{"type":"message","role":"user",'
    line += '"content":[{"type":"input_text","text":"the secret plan"}]}}\n'
    (day / f"rollout-2026-01-02T03-04-05-{tid}.jsonl").write_text(line, encoding="utf-8")
    monkeypatch.setenv("CODEX_HOME", str(home))
    for typed in (tid, tid[:8]):  # its id, or 8+ hex digits from its start
        res = cli("read", f"local:{typed}")
        assert res.code == 0 and "the secret plan" in res.out, (typed, res.err)
    for typed in ("02T03-04", "2026-01-02", "0c1d2e3f", "worker"):  # pieces of its name, or of the middle of its id
        res = cli("read", f"local:{typed}")
        assert res.code == 6 and "the secret plan" not in res.out, (typed, res.out)
        assert f"no session '{typed}'" in one_line(res.err)


def test_on_a_remote_host_a_typo_and_a_prefix_reach_nobody(sshfleet: Any, isolated: Path, cli: Any) -> None:
    """The issue as reported, over real ssh: `send hb:worker` went to worker-1, `hbb:worker-1` was a local name."""
    worker = remote_agent(sshfleet, "h1", "worker-1", isolated)
    res = cli("send", "h1:worker", "to whom?", "--json")
    assert res.code == 6, res.out
    data = res.json()["data"]
    assert (data["host"], data["code"]) == ("h1", "session_not_found") and "did you mean 'worker-1'" in data["detail"]
    res = cli("send", "hh1:worker-1", "to whom?")
    assert res.code == 6 and "unknown host 'hh1'" in one_line(res.err) and "h1, h2, h3" in res.err
    stays(lambda: worker.messages() == [] and worker.events("key") == [], what="nothing delivered on h1")
    assert cli("send", "h1:worker-1", "by its name").code == 0
