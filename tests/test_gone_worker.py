"""A worker drover spawned that died is said as that -- "it exited", `session_exited`, with when it was last seen
live (the newest sighting: `ls`/`status`/`spawns` refresh it) -- by send, nudge and read, never as a typo; `spawns
--target` takes the spellings `log --target` does; `spawn --parent-msg` takes only a message id.  Real tmux, the
demo agent started by `drover spawn`."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from drover.ops import sightings
from drover.remote import protocol as P
from tests.conftest import wait_for
from tests.test_spawn import demo_template, fleet_with
from tests.test_state import demo_pid, spawn_demo


def demo_fleet(isolated: Path) -> Path:
    fleet = isolated / "fleet.toml"
    fleet_with(fleet, {"demo": f'command = "{demo_template(isolated)}"\nready_timeout_s = 60'})
    return fleet


def test_a_dead_worker_is_said_as_exited_with_its_newest_sighting_and_a_typo_stays_a_typo(
    tmux: Any, isolated: Path, cli: Any
) -> None:
    fleet = demo_fleet(isolated)

    def drover(*args: str) -> Any:
        return cli("--fleet", str(fleet), *args)

    w4 = spawn_demo(cli, fleet, isolated, "w4")
    st = wait_for(lambda: (s := drover("status", "local:w4", "--json").json()["data"]["session"])["state"] == "idle" and s)

    # spawns --target takes the spellings log --target does: session:window.pane too.
    pane_target = f"local:{st['target']}"
    assert drover("log", "--target", pane_target, "--json").json()["data"]["messages"], "log finds the brief"
    rows = drover("spawns", "--target", pane_target, "--json").json()["data"]["spawns"]
    assert [r["spawn_id"] for r in rows] == [w4["spawn_id"]]
    none = drover("spawns", "--target", "local:nomatch")
    assert none.code == 0 and "no spawn matches --target local:nomatch" in none.out, none.out
    assert "no spawn matches --parent nobody" in drover("spawns", "--parent", "nobody").out

    # Seen live by `ls` well after the spawn record was written: that sighting is the "last seen" later.
    recorded = max(e["ts"] for e in map(json.loads, (isolated / "home" / "truth.jsonl").read_text().splitlines())
                   if e.get("id") == w4["spawn_id"])  # fmt: skip
    wait_for(lambda: time.time() > recorded + 3, what="time to pass since the spawn record")
    listed_at = time.time()
    assert [s["state"] for s in drover("ls", "--json").json()["data"]["sessions"]] == ["idle"]
    assert sightings.load_path(isolated / "home")[w4["spawn_id"]] >= listed_at

    os.kill(demo_pid(isolated / "w4.jsonl"), signal.SIGKILL)
    gone = wait_for(lambda: (s := drover("status", "local:w4", "--json").json()["data"]["session"])["state"] == "exited" and s)
    assert gone["last_seen"] >= listed_at and gone["evidence"]["last_seen_source"] == "sighting", gone

    sent = drover("send", "local:w4", "are you there?", "--json")
    assert sent.code == 6, sent.out + sent.err
    doc = sent.json()
    assert doc["data"]["code"] == P.SESSION_EXITED and doc["data"]["outcome"] == P.FAILED
    detail = doc["data"]["detail"]
    assert f"w4 was started by drover ({w4['spawn_id']}) and is gone (last seen" in detail, detail
    assert "it exited; nothing was sent" in detail and "drover spawns --target local:w4" in detail
    assert "drover handoff" in detail and "no session" not in detail
    human = drover("send", "local:w4", "again")
    assert human.code == 6 and "it exited; nothing was sent" in human.out + human.err
    assert "are you there?" not in (isolated / "w4.jsonl").read_text()

    nudged = drover("nudge", "local:w4", "wake up", "--json")
    assert nudged.code == 4, nudged.out + nudged.err
    assert nudged.json()["data"]["code"] == P.SESSION_EXITED
    assert "was started by drover" in nudged.json()["data"]["detail"]
    read = drover("read", "local:w4")
    assert read.code == 6 and "w4 was started by drover" in read.err and "there is nothing live to read" in read.err, read.err

    # A typo keeps today's answer.
    typo = drover("send", "local:w44", "hello", "--json")
    assert typo.code == 6 and typo.json()["data"]["code"] == P.SESSION_NOT_FOUND
    assert "no session 'w44'" in typo.json()["data"]["detail"]
    assert "no session 'w44'" in drover("nudge", "local:w44", "hi").out + drover("nudge", "local:w44", "hi").err

    # Hostile: the name reused by a newcomer -- it is that one's name now, and the send goes to it.
    wait_for(lambda: drover("ls", "--json").json()["data"]["sessions"] == [], what="w4's pane gone")
    newcomer = tmux.agent("w4")
    took = drover("send", "local:w4", "for the newcomer", "--json")
    assert took.code == 0, took.out + took.err
    wait_for(lambda: any("for the newcomer" in m for m in newcomer.messages()), what="the newcomer's message")


def test_parent_msg_must_be_a_message_id_and_one_not_in_the_record_is_said(tmux: Any, isolated: Path, cli: Any) -> None:
    fleet = demo_fleet(isolated)
    for bad in ("msg_doesnotexist", 'x"y</cross-session-message>', "msg_", "MSG_0123abcd", "msg_0123 abcd"):
        res = cli("--fleet", str(fleet), "spawn", "local", "--engine", "demo", "--cwd", str(isolated), "--name", "p1",
                  "--brief", "b", "--parent-msg", bad)  # fmt: skip
        assert res.code == 2 and "is not a message id" in res.err, (bad, res.out, res.err)
    assert cli("--fleet", str(fleet), "ls", "--json").json()["data"]["sessions"] == [], "nothing was started"
    assert cli("--fleet", str(fleet), "spawns", "--json").json()["data"]["spawns"] == []

    # A real message as the parent: no warning.  A well-formed id the record lacks: spawned, and said.
    sent = cli("--fleet", str(fleet), "send", "local:absent", "x", "--json").json()["data"]["id"]  # recorded, failed
    ok = cli("--fleet", str(fleet), "spawn", "local", "--engine", "demo", "--cwd", str(isolated), "--name", "p1",
             "--brief", "b", "--parent-msg", sent, "--json")  # fmt: skip
    assert ok.code == 0 and not ok.json()["data"].get("warnings"), ok.out
    odd = cli("--fleet", str(fleet), "spawn", "local", "--engine", "demo", "--cwd", str(isolated), "--name", "p2",
              "--brief", "b", "--parent-msg", "msg_0123456789abcdef")  # fmt: skip
    assert odd.code == 0, odd.out + odd.err
    assert "warning: --parent-msg msg_0123456789abcdef is not a message in this record" in odd.err, odd.err
    rows = cli("--fleet", str(fleet), "spawns", "--parent", "msg_0123456789abcdef", "--json").json()["data"]["spawns"]
    assert [r["name"] for r in rows] == ["p2"]


def test_a_cursor_taken_before_the_record_exists_reads_from_its_start(isolated: Path) -> None:
    """The library coordinator (docs/library.md) takes its cursor first, in a home that may have no record yet."""
    import drover as api

    first = api.run("events.read", since="end")
    assert first.ok and first.data["events"] == [], first.errors
    sent = api.run("sessions.message", host="local", id="nosuch", text="x")  # recorded: accepted, failed
    got = api.run("events.read", since=first.data["cursor"])
    assert got.ok, got.errors
    assert [e["event"]["event"] for e in got.data["events"]] == ["accepted", "outcome"]
    assert {e["event"]["id"] for e in got.data["events"]} == {sent.data["id"]}
    # Any other cursor of no record is still refused: only the one drover gives for "nothing yet" is taken.
    assert not api.run("events.read", since="0:5").ok


def test_sightings_noted_at_once_by_many_commands_are_all_kept(tmp_path: Path) -> None:
    """Hostile: `ls`, `status` and `spawns` in many shells at once each note their sightings; none is lost."""
    import threading
    from types import SimpleNamespace

    ctx: Any = SimpleNamespace(truth=SimpleNamespace(path=tmp_path / "truth.jsonl"))

    def noter(k: int) -> None:
        for i in range(40):
            sightings.note(ctx, [f"spawn_{k}_{i}"])

    threads = [threading.Thread(target=noter, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen = sightings.load_path(tmp_path)
    assert len(seen) == 160 and all(f"spawn_{k}_{i}" in seen for k in range(4) for i in range(40))
    # The newest wins: an older sighting never moves one back.
    sightings.note(ctx, ["spawn_0_0"], now=1.0)
    assert sightings.load_path(tmp_path)["spawn_0_0"] > 1.0
