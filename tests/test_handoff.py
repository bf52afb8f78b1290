"""Handoff chains: a message to a session that is gone reaches the newest live generation it handed its work to,
never while the named session lives, never past a generation drover cannot see, and a broken chain says so."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from drover.remote import discovery
from tests.conftest import Pane, Tmux, remote_agent, wait_for
from tests.support.sshfleet import SSHFleet


def send(cli: Any, target: str, text: str) -> tuple[int, dict[str, Any]]:
    res = cli("send", target, text, "--json")
    return res.code, res.json()


def truth_events(isolated: Path, kind: str) -> list[dict[str, Any]]:
    path = isolated / "home" / "truth.jsonl"
    return [e for e in map(json.loads, path.read_text().splitlines()) if e.get("event") == kind]


def gone(pane: Pane) -> None:
    pane.tmux("kill-session", "-t", pane.id)


def generations(tmux: Tmux, cli: Any) -> tuple[Pane, Pane, Pane]:
    ocean, ocean2, ocean3 = tmux.agent("ocean"), tmux.agent("ocean-2"), tmux.agent("ocean-3")
    for old, new in (("ocean", "ocean-2"), ("ocean-2", "ocean-3")):
        res = cli("handoff", f"local:{old}", f"local:{new}", "--note", "context full")
        assert res.code == 0, res.err
        assert "handoff recorded" in res.out
    return ocean, ocean2, ocean3


def test_three_generations_the_newest_live_one_gets_it_and_never_while_the_named_one_lives(
    tmux: Tmux, cli: Any, isolated: Path
) -> None:
    ocean, ocean2, ocean3 = generations(tmux, cli)

    # Every generation is live: each name reaches its own session, nothing is redirected.
    code, doc = send(cli, "local:ocean", "to the first")
    assert code == 0 and "redirected_from" not in doc["data"], doc
    code, doc = send(cli, "local:ocean-2", "to the second")
    assert code == 0 and "redirected_from" not in doc["data"], doc
    wait_for(lambda: ocean.messages() and ocean2.messages(), what="both delivered")
    assert "to the first" in ocean.messages()[-1] and "to the second" in ocean2.messages()[-1]
    assert ocean3.messages() == []

    # The first is gone: a message to its name goes to the newest live generation, and says so.
    gone(ocean)
    code, doc = send(cli, "local:ocean", "after the first left")
    assert code == 0, doc
    data = doc["data"]
    assert data["redirected_from"] == "local:ocean"
    assert [g.get("name") or g["ref"] for g in data["handoff_chain"]] == ["ocean", "ocean-2", "ocean-3"]
    assert data["session"]["name"] == "ocean-3"
    wait_for(lambda: any("after the first left" in m for m in ocean3.messages()), what="ocean-3 got it")
    assert not any("after the first left" in m for m in ocean2.messages())
    outcome = [e for e in truth_events(isolated, "outcome") if e["id"] == data["id"]][-1]
    assert outcome["redirected_from"] == "local:ocean" and outcome["outcome"] == "delivered"
    human = cli("send", "local:ocean", "once more, for the human line")
    assert human.code == 0 and "redirected from local:ocean" in human.out

    # The newest is gone too: the message goes to the newest generation still live.
    gone(ocean3)
    code, doc = send(cli, "local:ocean", "after the third left")
    assert code == 0 and doc["data"]["session"]["name"] == "ocean-2", doc
    wait_for(lambda: any("after the third left" in m for m in ocean2.messages()), what="ocean-2 got it")

    shown = cli("handoff", "--show", "local:ocean", "--json")
    assert shown.code == 0, shown.err
    chain = shown.json()["data"]
    assert [r["state"] for r in chain["chain"]] == ["gone", "live", "gone"]
    assert chain["delivers_to"]["name"] == "ocean-2" and chain["delivers_to"]["redirected"] is True

    # None is live: a clear failure that shows the chain, recorded as failed, exit 6.
    gone(ocean2)
    res = cli("send", "local:ocean", "nobody left")
    assert res.code == 6
    assert "handoff_broken" in res.err or "every session it handed its work to" in res.err
    assert "ocean-2" in res.err and "ocean-3" in res.err and "gone" in res.err
    last = truth_events(isolated, "outcome")[-1]
    assert last["outcome"] == "failed" and last["code"] == "handoff_broken"


def test_a_stranger_that_took_a_name_is_not_a_generation(tmux: Tmux, cli: Any) -> None:
    ocean, ocean2, ocean3 = generations(tmux, cli)
    # A new session takes the first one's name: it is live under that name, so the message is its own.
    gone(ocean)
    stranger = tmux.agent("ocean", server="other")
    code, doc = send(cli, "local:ocean", "whoever is ocean now")
    assert code == 0 and "redirected_from" not in doc["data"], doc
    wait_for(lambda: stranger.messages(), what="the live bearer of the name got it")
    gone(stranger)

    # The newest generation exits and a stranger takes its name: it is not that generation (identity, not name).
    gone(ocean3)
    impostor = tmux.agent("ocean-3", server="third")
    code, doc = send(cli, "local:ocean", "for the real successor")
    assert code == 0 and doc["data"]["session"]["name"] == "ocean-2", doc
    wait_for(lambda: ocean2.messages(), what="ocean-2 got it")
    assert impostor.messages() == []


def test_bad_handoffs_are_refused_and_record_nothing(tmux: Tmux, cli: Any, isolated: Path) -> None:
    generations(tmux, cli)
    before = len(truth_events(isolated, "handoff"))
    loop = cli("handoff", "local:ocean-3", "local:ocean")
    assert loop.code == 2 and "loop" in loop.err
    same = cli("handoff", "local:ocean-2", "local:ocean-2")
    assert same.code == 2 and "same session" in same.err
    nowhere = cli("handoff", "local:ocean-3", "local:no-such-session")
    assert nowhere.code == 6 and "no-such-session" in nowhere.err
    no_successor = cli("handoff", "local:ocean-3")
    assert no_successor.code == 2 and "successor" in no_successor.err
    unknown = cli("op", "sessions.handoff", '{"id": "ocean", "to": "ocean-2", "to_host": "nowhere"}')
    assert unknown.code == 6 and "nowhere" in unknown.err
    assert len(truth_events(isolated, "handoff")) == before


def test_a_newer_generation_that_cannot_be_seen_stops_the_search(tmux: Tmux, cli: Any, isolated: Path) -> None:
    """ocean → ocean-2 (live) → a generation on a host that does not answer: never delivered to ocean-2 instead."""
    fleet = isolated / "fleet.toml"
    fleet.write_text('[defaults]\nconnect_timeout = 2.0\n[hosts.dark]\nssh = "127.0.0.1"\nport = 1\n', encoding="utf-8")
    ocean, ocean2 = tmux.agent("ocean"), tmux.agent("ocean-2")
    assert cli("--fleet", str(fleet), "handoff", "local:ocean", "local:ocean-2").code == 0
    # Recorded while the dark host still answered (written as drover writes it).
    from drover.truth import TruthFile

    TruthFile().append(
        {
            "v": 1,
            "event": "handoff",
            "ts": time.time(),
            "from": {"host": "local", "ref": "ocean-2", "name": "ocean-2", "identity": None},
            "to": {"host": "dark", "ref": "ocean-3", "name": "ocean-3", "pin": "%9", "identity": "tmux:default/%9@123"},
        }
    )
    gone(ocean)
    res = cli("--fleet", str(fleet), "send", "local:ocean", "where did the work go?")
    assert res.code == 5, res.err  # the dark host's own failure (a script may retry), not "no such session'
    assert "cannot see generation 3" in res.err and "dark:ocean-3" in res.err
    assert ocean2.messages() == []
    shown = cli("--fleet", str(fleet), "handoff", "--show", "local:ocean")
    assert shown.code == 5 and "cannot tell" in shown.out and "no generation is live" not in shown.err, shown


def test_over_ssh_the_successor_on_another_host_gets_it(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    first = remote_agent(sshfleet, "h1", "worker", isolated)
    second = remote_agent(sshfleet, "h2", "worker-2", isolated)
    res = cli("handoff", "h1:worker", "h2:worker-2", "--json")
    assert res.code == 0, res.err
    assert res.json()["data"]["to"]["host"] == "h2"
    sshfleet.tmux("h1", "kill-session", "-t", first.id)
    code, doc = send(cli, "h1:worker", "the schema landed")
    assert code == 0, doc
    assert doc["data"]["host"] == "h2" and doc["data"]["redirected_from"] == "h1:worker"
    wait_for(lambda: any("the schema landed" in m for m in second.messages()), what="h2 got it")


def test_a_former_name_finds_its_session_only_when_no_live_session_bears_it() -> None:
    def session(sid: str, name: str, former: list[str]) -> dict[str, Any]:
        return {"id": sid, "name": name, "aliases": [sid], "former_names": former, "_record": {}, "engine": "claude"}

    renamed = session("aaaa1111", "ocean-2", ["ocean"])
    found = discovery.resolve("ocean", [renamed])
    assert found is renamed and found["redirected_from"] == "ocean"
    # A live session named ocean wins over one that was once called ocean.
    live = session("bbbb2222", "ocean", [])
    other = session("cccc3333", "ocean-3", ["ocean"])
    assert discovery.resolve("ocean", [other, live]) is live
    assert "redirected_from" not in live


def test_an_ambiguous_name_is_never_taken_for_a_gone_one(tmux: Tmux, cli: Any) -> None:
    """Two live sessions bear the name: an ambiguity (exit 6, the candidates), not a redirect to the successor."""
    worker, worker2 = tmux.agent("worker"), tmux.agent("worker2")
    assert cli("handoff", "local:worker", "local:worker2").code == 0
    twin = tmux.agent("worker", server="other")
    res = cli("send", "local:worker", "which worker?")
    assert res.code == 6 and "2 sessions" in res.err, res.err
    assert worker2.messages() == [] and worker.messages() == [] and twin.messages() == []


def test_a_live_first_generation_named_by_a_prefix_keeps_its_mail(tmux: Tmux, cli: Any) -> None:
    """A chain recorded from a live session keeps its messages while that session lives, however it was named."""
    main, reef = tmux.agent("ocean-main"), tmux.agent("reef")
    # `ocean` only prefixes ocean-main: the handoff is recorded from the name, which no session bears.
    res = cli("handoff", "local:ocean", "local:reef", "--json")
    assert res.code == 0 and res.json()["data"]["old_live"] is False, res.out
    code, doc = send(cli, "local:ocean", "to the name ocean")
    assert code == 0 and doc["data"]["redirected_from"] == "local:ocean" and doc["data"]["session"]["name"] == "reef"
    # Handed over by its full name while it lives: its own messages stay its own.
    assert cli("handoff", "local:ocean-main", "local:reef").code == 0
    code, doc = send(cli, "local:ocean-main", "to ocean-main itself")
    assert code == 0 and "redirected_from" not in doc["data"], doc
    wait_for(lambda: any("ocean-main itself" in m for m in main.messages()), what="ocean-main kept its mail")
    assert not any("ocean-main itself" in m for m in reef.messages())


def test_a_handoff_from_a_host_that_is_down_is_recorded_by_name(tmux: Tmux, cli: Any, isolated: Path) -> None:
    fleet = isolated / "fleet.toml"
    fleet.write_text('[defaults]\nconnect_timeout = 2.0\n[hosts.dark]\nssh = "127.0.0.1"\nport = 1\n', encoding="utf-8")
    tmux.agent("rescue")
    res = cli("--fleet", str(fleet), "handoff", "dark:worker", "local:rescue", "--json")
    assert res.code == 0, res.err
    data = res.json()["data"]
    assert data["from"] == {"host": "dark", "ref": "worker"} and data["old_live"] is False
    # A successor on a host that is down cannot be checked: refused, nothing recorded.
    before = len(truth_events(isolated, "handoff"))
    res = cli("--fleet", str(fleet), "handoff", "local:rescue", "dark:worker-2")
    assert res.code == 5 and len(truth_events(isolated, "handoff")) == before
    # --show of a chain on that host: it cannot tell, so it fails with the host's error -- never exit 0 with
    # "would fail: no generation is live".
    shown = cli("--fleet", str(fleet), "handoff", "--show", "dark:worker")
    assert shown.code == 5, shown.out + shown.err
    assert "no generation is live" not in shown.err and "dark" in shown.err, shown
    doc = cli("--fleet", str(fleet), "handoff", "--show", "dark:worker", "--json").json()
    assert doc["ok"] is False and doc["errors"][0]["host"] == "dark", doc


def test_nudge_follows_the_chain_and_never_a_stranger_the_name_prefixes(tmux: Tmux, cli: Any, isolated: Path) -> None:
    foo, bar = tmux.agent("foo"), tmux.agent("bar")
    assert cli("handoff", "local:foo", "local:bar").code == 0
    gone(foo)
    log = isolated / "foobaz.jsonl"  # a stranger in a directory of its own (no shared_cwd with bar)
    stranger = tmux.start("foobaz", f"sh -c 'cd / && exec {sys.executable} -m drover.demo_agent --log {log}'", "other")
    stranger.log = log
    stranger.wait_idle()
    res = cli("nudge", "local:foo", "status?", "--json")
    assert res.code == 0, res.err
    data = res.json()["data"]
    assert data["redirected_from"] == "local:foo" and data["session"]["name"] == "bar"
    wait_for(lambda: any("status?" in m for m in bar.messages()), what="bar got the nudge")
    assert stranger.messages() == []
    accepted = next(e for e in truth_events(isolated, "accepted") if e["id"] == data["id"])
    assert accepted["options"]["nudge"] is True and accepted["options"]["addressed"] == "local:foo"


def test_a_long_chain_is_followed_and_shown_by_its_ends(tmux: Tmux, cli: Any) -> None:
    from drover.truth import TruthFile

    last = tmux.agent("gen-70")
    truth = TruthFile()
    for i in range(69):
        new = {"host": "local", "ref": f"gen-{i + 1}", "name": f"gen-{i + 1}"}
        if i == 68:
            new.update(pin=last.address, identity=f"tmux:{last.server}/{last.id}@{last.pid}")
        truth.append({"v": 1, "event": "handoff", "ts": time.time(), "from": {"host": "local", "ref": f"gen-{i}"}, "to": new})
    code, doc = send(cli, "local:gen-0", "from the start of a long chain")
    assert code == 0 and doc["data"]["session"]["name"] == "gen-70", doc
    shown = cli("handoff", "--show", "local:gen-0", "--json")
    assert shown.code == 0 and len(shown.json()["data"]["chain"]) == 70
