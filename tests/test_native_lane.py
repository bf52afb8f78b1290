"""Native first, and only (issue 15), against the real Claude Code binary (2.1.328, offline).

Where Claude has an inbox, Claude decides what it takes -- its permission class after a person's shift+tab, plan
mode where bypass is available, its crossSessionInbound `hold` and `refuse` -- and no lane drover offers goes
around it: `--via tmux` is refused `native_lane` on a send, a broadcast, a nudge and a send through the daemon, with
nothing typed into the pane; a spawned Claude is briefed through its inbox only; and an inbox that cannot be used
is a failure that says what to do, never a paste.  Only the owner's own words (`--as-owner`) go by paste.

One lab for the module, with a tmux server of its own linked into each test's tmux directory: each Claude costs CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import drover
from drover.daemon import client, paths
from tests.conftest import drover_process, stays, wait_for
from tests.support.claudelab import HERE, ClaudeLab, ClaudeSession, expose, own_server_lab

ACTOR = "tester"
MODES = ("bypass permissions on", "accept edits on", "auto mode on", "plan mode on", "manual mode on")
DIALOG = "Deliver this message to Claude"


@pytest.fixture(scope="module")
def lab(claude_binary: Path) -> Iterator[ClaudeLab]:
    yield from own_server_lab(claude_binary, "dnl-")


@pytest.fixture(autouse=True)
def seen(lab: ClaudeLab, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(lab.config))
    yield from expose(lab)


@pytest.fixture(scope="module")
def moded(lab: ClaudeLab) -> ClaudeSession:
    """A session a person started with bypass available, in auto mode, with a turn of theirs behind it."""
    s = lab.start("moded", flags="--allow-dangerously-skip-permissions")
    lab.tmux("send-keys", "-t", s.pane, "-l", "a first turn, typed by its person")
    wait_for(lambda: "a first turn, typed" in s.screen(), timeout=10, what="the typed prompt")
    lab.tmux("send-keys", "-t", s.pane, "Enter")
    wait_for(lambda: any(r.get("type") == "assistant" for r in s.transcript()), timeout=30, what="the turn's answer")
    wait_for(lambda: s.status() == "idle", timeout=30, what="the turn's end")
    return s


@pytest.fixture(scope="module")
def holding(lab: ClaudeLab) -> ClaudeSession:
    return lab.start("holding", project_settings={"crossSessionInbound": "hold"})


@pytest.fixture(scope="module")
def refusing(lab: ClaudeLab) -> ClaudeSession:
    return lab.start("refusing", project_settings={"crossSessionInbound": "refuse"})


@pytest.fixture
def daemon(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Persistent mode on, the daemon started, in a runtime directory of this test's own; killed afterwards."""
    run = Path(tempfile.mkdtemp(prefix="dnd-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    monkeypatch.setenv("DROVER_DAEMON", "1")
    monkeypatch.setenv("DROVER_DAEMON_IDLE_S", "120")
    started = drover_process("daemon", "start")
    assert started.code == 0, started
    yield
    answer = client.control(paths.socket_path(), {"t": "status"}, timeout=2)
    if answer:
        os.kill(int(answer["pid"]), signal.SIGKILL)
    shutil.rmtree(run, ignore_errors=True)


def served() -> int:
    return int(json.loads(drover_process("daemon", "status", "--json").out)["served"])


def send(target: str, text: str, **extra: Any) -> Any:
    return drover.run("sessions.message", {"id": target, "text": text, **extra}, actor=ACTOR)


def recorded(s: ClaudeSession, text: str) -> bool:
    """Is the text in any user record of the session's transcript (typed, or taken from its inbox)?"""
    return any(text in json.dumps(r.get("message", {})) for r in s.transcript() if r.get("type") == "user")


def typed(s: ClaudeSession, text: str, screen: str | None = None) -> bool:
    """Did the text reach the session at all: on its screen (its input box), or in its transcript?"""
    return text in (s.screen() if screen is None else screen) or recorded(s, text)


def footer(s: ClaudeSession) -> str | None:
    for line in reversed(s.screen().splitlines()[-4:]):
        for words in MODES:
            if words in line:
                return words
    return None


def cycle_to(s: ClaudeSession, wanted: str) -> None:
    """Press shift+tab in the session's pane, as its person would, until its footer names the wanted mode."""
    if DIALOG in s.screen():
        s.lab.tmux("send-keys", "-t", s.pane, "Escape")  # the person sets an earlier held message aside
        wait_for(lambda: DIALOG not in s.screen(), timeout=10, what="the held-message dialog set aside")
    for _ in range(len(MODES) + 1):
        now = wait_for(lambda: footer(s), timeout=10, what="the mode footer")
        if now == wanted:
            return
        s.lab.tmux("send-keys", "-t", s.pane, "BTab")
        wait_for(lambda: footer(s) not in (None, now), timeout=10, what="the next mode")  # noqa: B023
    raise AssertionError(f"shift+tab never reached {wanted!r}:\n{s.screen()}")


def paste_refused_on_every_lane(s: ClaudeSession, tag: str) -> None:
    """`--via tmux` by send, broadcast, nudge, and send through the daemon: each refused native_lane, nothing typed."""
    texts = [f"{tag}, {lane} by paste" for lane in ("send", "broadcast", "nudge", "daemon")]
    sent = send(s.name, texts[0], via="tmux")
    assert (sent.data["outcome"], sent.data["code"], sent.exit_code) == ("refused", "native_lane", 4), sent.data
    assert "inbox" in sent.data["detail"] and "drop --via tmux" in sent.data["detail"], sent.data["detail"]
    cast = drover.run("sessions.broadcast", {"name": s.name, "text": texts[1], "via": "tmux"}, actor=ACTOR)
    assert [(r["outcome"], r["code"]) for r in cast.data["messages"]] == [("refused", "native_lane")], cast.data
    assert cast.exit_code == 4
    nudged = drover.run("sessions.nudge", {"id": s.name, "text": texts[2], "via": "tmux"}, actor=ACTOR)
    assert (nudged.data["outcome"], nudged.data["code"], nudged.exit_code) == ("refused", "native_lane", 4), nudged.data
    before = served()
    res = drover_process("--actor", ACTOR, "send", f"local:{s.name}", texts[3], "--via", "tmux", "--json")
    assert res.code == 4 and res.json()["data"]["code"] == "native_lane", res
    assert served() == before + 1, "the send did not go through the daemon"
    stays(lambda: not any(typed(s, t) for t in texts), 1.0, "nothing typed into the pane")


def test_shift_tab_to_bypass_after_the_last_turn_is_claudes_to_decide(moded: ClaudeSession, daemon: None) -> None:
    s = moded
    cycle_to(s, "bypass permissions on")
    # What the transcript says is from before the person's shift+tab: no reading of it decides anything now.
    modes = [r["permissionMode"] for r in s.transcript() if isinstance(r.get("permissionMode"), str)]
    assert modes and modes[-1] != "bypassPermissions", modes
    paste_refused_on_every_lane(s, "after shift+tab")
    held = send(s.name, "after shift+tab, through the inbox")
    assert (held.data["outcome"], held.data["lane"], held.exit_code) == ("held", "inbox", 3), held.data
    assert "permission-mode parity" in held.data["detail"] and "dialog" in held.data["detail"]
    wait_for(lambda: DIALOG in s.screen(), timeout=10, what="Claude's held-message dialog")
    stays(lambda: s.peer_messages() == [], 1.0, "the held message staying held")


def test_plan_mode_where_bypass_is_available_is_claudes_to_decide(moded: ClaudeSession, daemon: None) -> None:
    s = moded
    cycle_to(s, "plan mode on")
    paste_refused_on_every_lane(s, "in plan mode")
    # broadcast --all, as the stranger sent it: through the inbox, and held there
    everyone = drover.run("sessions.broadcast", {"all": True, "text": "in plan mode, to everyone"}, actor=ACTOR)
    rows = {r["session"]["name"]: r for r in everyone.data["messages"]}
    assert (rows["moded"]["outcome"], rows["moded"]["lane"]) == ("held", "inbox"), rows["moded"]
    wait_for(lambda: DIALOG in s.screen(), timeout=10, what="Claude's held-message dialog")
    stays(lambda: not recorded(s, "in plan mode"), 1.0, "nothing of it in the transcript")


def test_a_hold_setting_is_claudes_to_decide_and_said_as_a_setting(holding: ClaudeSession, daemon: None) -> None:
    s = holding
    paste_refused_on_every_lane(s, "held by setting")
    held = send(s.name, "held by setting, through the inbox")
    assert (held.data["outcome"], held.data["lane"], held.exit_code) == ("held", "inbox", 3), held.data
    detail = held.data["detail"]
    assert 'crossSessionInbound setting is "hold"' in detail and str(s.cwd / ".claude" / "settings.json") in detail
    assert "Held message" not in detail and "with no dialog" in detail, detail
    # Claude lists it for its person and raises no dialog
    wait_for(lambda: "Held peer message" in s.screen(), timeout=10, what="Claude's notice of it")
    stays(lambda: DIALOG not in s.screen() and s.peer_messages() == [], 1.0, "no dialog, nothing delivered")


def test_a_refuse_setting_is_claudes_to_decide(refusing: ClaudeSession, daemon: None) -> None:
    s = refusing
    paste_refused_on_every_lane(s, "refused by setting")
    refused = send(s.name, "refused by setting, through the inbox")
    assert (refused.data["outcome"], refused.data["code"], refused.data["lane"]) == ("refused", "refused", "inbox")
    assert "crossSessionInbound = refuse" in refused.data["detail"] and refused.exit_code == 4
    stays(lambda: s.peer_messages() == [] and not typed(s, "refused by setting"), 1.0, "nothing delivered")


def test_a_tmux_session_name_still_names_the_claude_session_it_runs(refusing: ClaudeSession, holding: ClaudeSession) -> None:
    """Claude registers under its own name; the tmux session's name, which the person gave, keeps naming it."""
    s = refusing
    s.lab.tmux("rename-session", "-t", "=refusing", "ops-desk")
    try:
        status = drover.run("sessions.status", {"id": "ops-desk"})
        assert status.exit_code == 0, status.errors
        assert (status.data["session"]["id"], status.data["session"]["name"]) == (s.session_id, "refusing")
        doc = send("ops-desk", "by the tmux session's name", via="tmux")
        assert (doc.data["outcome"], doc.data["code"]) == ("refused", "native_lane"), doc.data
        # A tmux name that is another Claude's own name is ambiguous: said so, never a guess
        s.lab.tmux("rename-session", "-t", "=holding", "holding-tmux")
        s.lab.tmux("rename-session", "-t", "=ops-desk", "holding")
        doc = send("holding", "which one?")
        assert (doc.data["outcome"], doc.data["code"], doc.exit_code) == ("failed", "ambiguous_session", 6), doc.data
        assert {c["id"] for c in doc.data["candidates"]} == {s.session_id, holding.session_id}
    finally:
        s.lab.tmux("rename-session", "-t", s.pane, "refusing")  # whatever it is called by now
        s.lab.tmux("rename-session", "-t", holding.pane, "holding")
    stays(lambda: holding.peer_messages() == [] and s.peer_messages() == [], 0.5, "nothing delivered")


def launcher_without_socket(lab: ClaudeLab) -> Path:
    """The lab's Claude as a spawn command, whose inbox socket file is removed as soon as it appears (as a /tmp
    cleaner would): the session runs and registers it, but nothing can connect to it."""
    script = lab.root / "launch-socketless.sh"
    api = f'{sys.executable} {HERE / "fake_anthropic.py"} --port 8765 --log {lab.root}/"$0".requests.jsonl'
    env = (
        f"env -u CLAUDE_CONFIG_DIR -u TMUX_PANE HOME={lab.home} ANTHROPIC_API_KEY=sk-ant-dummy "
        "ANTHROPIC_BASE_URL=http://127.0.0.1:8765 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 "
        "DISABLE_ERROR_REPORTING=1 IS_SANDBOX=1"
    )
    inner = f'ip link set lo up && ({api} &) && sleep 0.3 && exec {env} {lab.binary} --name "$0"'
    socks = '"${XDG_RUNTIME_DIR:-${CLAUDE_CODE_TMPDIR:-/tmp}}/cc-socks"'
    # $$ is the pid Claude will have: unshare and both shells exec into it.
    remover = (
        f"(i=0; while [ $i -lt 1200 ]; do for f in {socks}/$$.sock {socks}/$$-*.sock; do "
        '[ -S "$f" ] && rm -f "$f" && exit 0; done; sleep 0.05; i=$((i+1)); done) &\n'
    )
    script.write_text(f"#!/bin/sh\n{remover}exec unshare -n sh -c '{inner}' \"$1\"\n")
    return script


def test_a_spawned_claude_is_briefed_through_its_inbox_only_and_an_unusable_inbox_is_never_pasted_around(
    lab: ClaudeLab, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = isolated / "fleet.toml"
    fleet.write_text(
        "[hosts.local]\nowner_relay = true\n\n"
        f'[spawn.claude]\ncommand = "sh {launcher_without_socket(lab)} {{name}}"\nready_timeout_s = 60\n'
    )
    monkeypatch.setenv("DROVER_FLEET", str(fleet))
    cwd = lab.root / "w9"  # trusted in the lab's ~/.claude.json
    cwd.mkdir()
    brief = "the brief: review the schema change"
    spawned = drover.run("sessions.spawn", {"engine": "claude", "cwd": str(cwd), "name": "spawned", "brief": brief}, actor=ACTOR)
    data = spawned.data
    assert data["state"] == "ready" and data["identity"] == f"claude:{data['id']}", data
    got = data["brief"]
    assert (got["outcome"], got["code"], got["lane"], spawned.exit_code) == ("failed", "socket_missing", "inbox", 5), got
    assert "does not paste instead" in got["detail"] and "--as-owner --via tmux" in got["detail"], got["detail"]
    session = ClaudeSession(lab, "spawned", cwd, data["pane"], lab.root / "none", lab.root / "none")
    session.session_id = data["id"]
    # auto, on every lane: the same failure, never a paste
    sent = send("spawned", "auto, with no inbox socket")
    assert (sent.data["outcome"], sent.data["code"], sent.exit_code) == ("failed", "socket_missing", 5), sent.data
    cast = drover.run("sessions.broadcast", {"name": "spawned", "text": "a broadcast, no socket"}, actor=ACTOR)
    assert [(r["outcome"], r["code"]) for r in cast.data["messages"]] == [("failed", "socket_missing")], cast.data
    nudged = drover.run("sessions.nudge", {"id": "spawned", "text": "a nudge, no socket"}, actor=ACTOR)
    assert (nudged.data["outcome"], nudged.data["code"]) == ("failed", "socket_missing"), nudged.data
    pasted = send("spawned", "by paste, no socket", via="tmux")
    assert (pasted.data["outcome"], pasted.data["code"]) == ("refused", "native_lane"), pasted.data
    texts = [brief, "auto, with no inbox socket", "a broadcast, no socket", "a nudge, no socket", "by paste, no socket"]

    def screen() -> str:  # spawned on this test's own tmux server, not the lab's
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", data["pane"]], capture_output=True, text=True).stdout

    assert "❯" in screen()
    stays(lambda: not any(typed(session, t, screen()) for t in texts), 1.0, "nothing typed into the pane")
    # The owner's own words (owner_relay): by paste, and Claude's own <pasted_content> wrapper is not "altered"
    owner = send("spawned", "the owner's own words\non two lines", via="tmux", as_owner=True)
    assert (owner.data["outcome"], owner.data["lane"], owner.data["verified"]) == ("delivered", "tmux", True), owner.data
    assert "altered" not in owner.data, owner.data["verification"]
    typed_turn = [r for r in session.transcript() if r.get("type") == "user" and owner.data["id"] in json.dumps(r)]
    assert len(typed_turn) == 1 and "<pasted_content" in json.dumps(typed_turn[0]["message"]), typed_turn

    # A spawned Claude with its inbox: the brief goes there, and Claude decides (its project holds every message)
    fleet.write_text(f'[spawn.claude]\ncommand = "sh {lab.launcher()} {{name}}"\nready_timeout_s = 60\n')
    held_dir = lab.root / "w8"
    (held_dir / ".claude").mkdir(parents=True)
    (held_dir / ".claude" / "settings.json").write_text(json.dumps({"crossSessionInbound": "hold"}))
    request = {"engine": "claude", "cwd": str(held_dir), "name": "spawned-held", "brief": "a brief to be held"}
    second = drover.run("sessions.spawn", request, actor=ACTOR)
    got = second.data["brief"]
    assert (got["outcome"], got["lane"], second.exit_code) == ("held", "inbox", 3), got
    assert 'crossSessionInbound setting is "hold"' in got["detail"], got["detail"]
    held = ClaudeSession(lab, "spawned-held", held_dir, second.data["pane"], lab.root / "none", lab.root / "none")
    held.session_id = second.data["id"]

    def held_screen() -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", held.pane], capture_output=True, text=True).stdout

    wait_for(lambda: "Held peer message" in held_screen(), timeout=10, what="Claude's notice of the held brief")
    stays(lambda: not recorded(held, "a brief to be held") and held.peer_messages() == [], 1.0, "the brief held")
