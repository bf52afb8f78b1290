"""drover broadcast: one text to every agent session a selector matches, over real panes on real (SSH) hosts; the
sessions waiting on a human are skipped, said so, and recorded."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import drover
from tests.conftest import Pane, Tmux, remote_agent, stays, wait_for
from tests.support.sshfleet import SSHFleet, free_port

ACTOR = "coordinator"


def envelope(body: str) -> str:
    return f'<cross-session-message from-name="drover ({ACTOR})" from-mode="prompting">\n{body}\n</cross-session-message>'


def show_dialog(pane: Pane, screen: Any) -> None:
    os.kill(pane.pid, signal.SIGUSR1)
    wait_for(lambda: "Do you want to proceed?" in screen(), what="the dialog on screen")


def log_rows() -> list[dict[str, Any]]:
    return list(drover.run("messages.list", {"limit": 100}).data["messages"])


def test_broadcast_over_three_hosts_skips_the_dialog_and_the_draft(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    """The issue's must-show: delivered to the rest, the session in a dialog and the one with a draft listed as
    skipped, each with its reason, every one of them in the record under one broadcast id."""
    panes = {
        ("h1", "worker-1"): remote_agent(sshfleet, "h1", "worker-1", isolated),
        ("h1", "worker-4"): remote_agent(sshfleet, "h1", "worker-4", isolated),
        ("h2", "worker-2"): remote_agent(sshfleet, "h2", "worker-2", isolated),
        ("h3", "worker-3"): remote_agent(sshfleet, "h3", "worker-3", isolated),
    }

    def screen(host: str, name: str) -> str:
        return sshfleet.tmux(host, "capture-pane", "-p", "-t", panes[(host, name)].id).stdout

    show_dialog(panes[("h2", "worker-2")], lambda: screen("h2", "worker-2"))
    sshfleet.tmux("h3", "send-keys", "-t", panes[("h3", "worker-3")].id, "-l", "half a thought of my own")
    wait_for(lambda: "half a thought of my own" in screen("h3", "worker-3"), what="the draft on screen")

    res = cli("--actor", ACTOR, "broadcast", "--all", "standup in 5: push what you have", "--json")
    assert res.code == 4, res.out + res.err  # the worst outcome is a skip, which counts as refused
    data = res.json()["data"]
    rows = {(r["host"], r["session"]["name"]): r for r in data["messages"]}
    assert {k: r["outcome"] for k, r in rows.items()} == {
        ("h1", "worker-1"): "delivered",
        ("h1", "worker-4"): "delivered",
        ("h2", "worker-2"): "skipped",
        ("h3", "worker-3"): "skipped",
    }
    assert rows[("h2", "worker-2")]["code"] == "waiting_on_human"
    assert rows[("h2", "worker-2")]["detail"].startswith("dialog on screen: ") and "proceed" in rows[("h2", "worker-2")]["detail"]
    assert rows[("h3", "worker-3")]["detail"] == "draft in the input"
    assert data["counts"] == {"delivered": 2, "skipped": 2}
    assert data["summary"].startswith(f"broadcast {data['broadcast']}: 2 delivered, 2 skipped (4 sessions on 4 hosts)")

    for key in (("h1", "worker-1"), ("h1", "worker-4")):
        wait_for(panes[key].messages, what=f"the message on {key}")
        assert panes[key].messages() == [envelope("standup in 5: push what you have")]
    # The person's dialog was not answered and their draft was neither submitted nor disturbed.
    stays(lambda: panes[("h2", "worker-2")].events("dialog") == [] and panes[("h2", "worker-2")].messages() == [])
    assert panes[("h3", "worker-3")].messages() == [] and "half a thought of my own" in screen("h3", "worker-3")

    # The record shows every session the broadcast meant, under its one id; the skips as refused, with the reason.
    logged = {(m["host"], m["outcome"], m["code"]) for m in log_rows()}
    assert logged == {("h1", "delivered", None), ("h2", "refused", "waiting_on_human"), ("h3", "refused", "waiting_on_human")}
    assert len(log_rows()) == 4
    for m in log_rows():
        full = drover.run("messages.get", {"id": m["id"]}).data["message"]
        assert full["options"]["broadcast"] == data["broadcast"], full
        assert full["text"] == "standup in 5: push what you have"

    human = cli("--actor", ACTOR, "broadcast", "--host", "h2", "--host", "h3", "second round")
    assert human.code == 4
    assert "skipped" in human.out and "draft in the input" in human.out and "dialog on screen" in human.out
    assert "0 delivered" not in human.out and ": 2 skipped (2 sessions on 2 hosts)" in human.out


def test_a_bare_broadcast_to_everyone_is_refused_and_nothing_is_recorded(cli: Any) -> None:
    res = cli("broadcast", "hello everyone")
    assert res.code == 2
    assert "a broadcast needs a selector" in res.err and "--all" in res.err
    assert len(res.err.strip().splitlines()) == 1 and "Traceback" not in res.err
    assert cli("broadcast", "--all", "   ").code == 2
    shells = cli("broadcast", "--engine", "shell", "ls -la")
    assert shells.code == 2 and "agent sessions only" in shells.err
    unknown = cli("broadcast", "--host", "nosuchhost", "hi")
    assert unknown.code == 6 and "unknown host 'nosuchhost'" in unknown.err
    op = cli("op", "sessions.broadcast", json.dumps({"text": "hi", "everyone": True}))
    assert op.code == 2 and "everyone: unknown field" in op.err
    assert log_rows() == []


def test_a_broadcast_that_matches_nothing_says_so(tmux: Tmux, cli: Any) -> None:
    pane = tmux.agent("alpha-1")
    shell = tmux.start("plain-shell", "bash --norc --noprofile")
    res = cli("broadcast", "--name", "beta-*", "anyone?", "--json")
    assert res.code == 6, res.out
    doc = res.json()
    assert doc["data"]["messages"] == [] and doc["errors"][0]["code"] == "no_match"
    human = cli("broadcast", "--name", "beta-*", "anyone?")
    assert human.code == 6 and "no agent session matched the selector" in human.err and "nothing sent" in human.out
    # A pane that runs no agent is never addressed, even by --all.
    res = cli("--actor", ACTOR, "broadcast", "--all", "only agents", "--json")
    assert res.code == 0, res.out
    assert [r["session"]["id"] for r in res.json()["data"]["messages"]] == [pane.id]
    assert shell.id not in json.dumps(log_rows())
    assert log_rows()[0]["outcome"] == "delivered"


def test_selectors_name_glob_cwd_glob_and_engine(tmux: Tmux, isolated: Path, cli: Any) -> None:
    api1, api2, web = tmux.agent("api-1"), tmux.agent("api-2"), tmux.agent("web-1")
    res = cli("--actor", ACTOR, "broadcast", "--name", "api-*", "api only", "--json")
    assert res.code == 0, res.out
    assert sorted(r["session"]["name"] for r in res.json()["data"]["messages"]) == ["api-1", "api-2"]
    wait_for(lambda: api1.messages() and api2.messages())
    stays(lambda: web.messages() == [], what="web-1 getting nothing")
    assert cli("broadcast", "--cwd", "/nowhere/*", "x").code == 6
    res = cli("--actor", ACTOR, "broadcast", "--cwd", f"{isolated}*", "--engine", "demo", "all three", "--json")
    assert res.code == 0 and len(res.json()["data"]["messages"]) == 3
    assert cli("broadcast", "--engine", "codex", "nobody runs codex here").code == 6


def test_the_guards_own_last_look_still_applies_after_the_skip_check(tmux: Tmux, cli: Any) -> None:
    """A dialog that appears after the broadcast looked (here: the moment the paste starts) is the guard's to catch:
    the row is refused by the guard, never delivered, and no Enter answers the dialog."""
    calm = tmux.agent("calm")
    jumpy = tmux.agent("jumpy", "default", "--dialog-on-paste")
    res = cli("--actor", ACTOR, "broadcast", "--all", "careful now", "--json")
    assert res.code == 4, res.out
    rows = {r["session"]["name"]: r for r in res.json()["data"]["messages"]}
    assert rows["calm"]["outcome"] == "delivered"
    assert (rows["jumpy"]["outcome"], rows["jumpy"]["code"]) == ("refused", "dialog_after_paste"), rows["jumpy"]
    wait_for(calm.messages)
    stays(lambda: jumpy.events("dialog") == [] and jumpy.messages() == [], what="the dialog left unanswered")


def test_claude_waiting_in_its_registry_is_skipped_with_what_it_waits_for(
    tmux: Tmux, isolated: Path, cli: Any, monkeypatch: Any
) -> None:
    """Claude's own `waiting` (its registry record) is a skip before anything is sent, with its waitingFor."""
    sessions = isolated / "claude" / "sessions"
    sessions.mkdir(parents=True)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(sessions.parent))
    holder = tmux.start("holder", "sleep 600")  # a live process for the record to name
    pid = int(holder.tmux("display-message", "-p", "-t", holder.id, "#{pane_pid}").strip())
    start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    record = {
        "pid": pid,
        "sessionId": "c0ffee00-1111-2222-3333-444455556666",
        "procStart": start,
        "name": "reviewer",
        "cwd": str(isolated),
        "status": "waiting",
        "waitingFor": "permission prompt",
        "statusUpdatedAt": 1_700_000_000_000,
        "messagingSocketPath": str(isolated / "nobody-listens.sock"),
    }
    (sessions / f"{pid}.json").write_text(json.dumps(record))
    agent = tmux.agent("helper-agent")
    res = cli("--actor", ACTOR, "broadcast", "--all", "status please", "--json")
    assert res.code == 4, res.out
    rows = {r["session"]["name"]: r for r in res.json()["data"]["messages"]}
    assert rows["reviewer"]["outcome"] == "skipped" and rows["reviewer"]["detail"] == "Claude is waiting: permission prompt"
    assert rows["helper-agent"]["outcome"] == "delivered"
    wait_for(agent.messages)


def test_an_unreachable_host_is_a_failed_row_and_the_others_still_get_it(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    pane = remote_agent(sshfleet, "h1", "survivor", isolated)
    extra = f'[hosts.closed]\nssh = "127.0.0.1"\nport = {free_port()}\nconnect_timeout = 2.0\n'
    sshfleet.fleet_file.write_text(sshfleet.fleet_toml(extra), encoding="utf-8")  # type: ignore[attr-defined]
    res = cli("--actor", ACTOR, "broadcast", "--host", "h1", "--host", "closed", "still there?", "--json")
    assert res.code == 8, res.out  # a host that could not be asked while another answered: a partial fan-out
    doc = res.json()
    rows = {r["host"]: r for r in doc["data"]["messages"]}
    assert rows["closed"]["outcome"] == "failed" and rows["closed"]["code"] == "connection_refused"
    assert rows["closed"]["session"] is None and rows["closed"]["id"] is None
    assert rows["h1"]["outcome"] == "delivered"
    assert [e["host"] for e in doc["errors"]] == ["closed"]
    wait_for(pane.messages)
    human = cli("--actor", ACTOR, "broadcast", "--host", "h1", "--host", "closed", "and again?")
    assert human.code == 8 and "drover: closed: " in human.err and "1 delivered, 1 failed" in human.out
    alone = cli("--actor", ACTOR, "broadcast", "--host", "closed", "anyone?")
    assert alone.code == 5  # no host answered: failed


def test_broadcast_reads_its_text_from_stdin(tmux: Tmux, cli: Any) -> None:
    pane = tmux.agent("piped")
    res = cli("--actor", ACTOR, "broadcast", "--name", "piped", "-", stdin="from a pipe\nline two\n")
    assert res.code == 0, res.err
    wait_for(pane.messages)
    assert pane.messages() == [envelope("from a pipe\nline two\n")]


def test_a_truth_file_that_cannot_be_used_sends_nothing_and_says_so_per_session(tmux: Tmux, isolated: Path, cli: Any) -> None:
    """drover sends nothing it cannot record: every row says why, the exit code is the truth file's (7)."""
    calm, asking = tmux.agent("calm"), tmux.agent("asking")
    show_dialog(asking, asking.screen)
    home = isolated / "home"
    home.mkdir(mode=0o700, exist_ok=True)
    home.chmod(0o777)  # writable by anyone: drover will not trust a record others could forge
    res = cli("--actor", ACTOR, "broadcast", "--all", "nobody gets this", "--json")
    assert res.code == 7, res.out
    rows = {r["session"]["name"]: r for r in res.json()["data"]["messages"]}
    assert {n: (r["outcome"], r["code"]) for n, r in rows.items()} == {
        "calm": ("failed", "truth_unsafe"),
        "asking": ("failed", "truth_unsafe"),
    }
    stays(lambda: calm.messages() == [] and asking.events("dialog") == [], what="nothing sent")


def test_each_delivery_keeps_the_sender_side_limits(tmux: Tmux, isolated: Path, cli: Any, monkeypatch: Any) -> None:
    """A broadcast is no way around the limits: each message is sized and counted like any `drover send`."""
    fleet = isolated / "fleet.toml"
    fleet.write_text("[limits]\nmax_chars = 10\n", encoding="utf-8")
    monkeypatch.setenv("DROVER_FLEET", str(fleet))
    one, two = tmux.agent("one"), tmux.agent("two")
    res = cli("--actor", ACTOR, "broadcast", "--all", "far more than ten characters", "--json")
    assert res.code == 4, res.out
    rows = res.json()["data"]["messages"]
    assert sorted((r["session"]["name"], r["outcome"], r["code"]) for r in rows) == [
        ("one", "refused", "too_large"),
        ("two", "refused", "too_large"),
    ]
    assert {m["code"] for m in log_rows()} == {"too_large"} and len(log_rows()) == 2
    stays(lambda: one.messages() == [] and two.messages() == [], what="nothing pasted")


def _socket_of(pane: Pane) -> str:
    return os.path.join(os.environ["TMUX_TMPDIR"], f"tmux-{os.getuid()}", pane.server)


def waiting_on_pane_lock() -> bool:
    """Is a thread of this process (the local helper of an in-process drover) inside PaneLock's wait?"""
    from drover.remote.tmux_lane import PaneLock

    for frame in sys._current_frames().values():
        here: Any = frame
        while here is not None:
            if here.f_code is PaneLock.__enter__.__code__:
                return True
            here = here.f_back
    return False


def test_a_delivery_in_progress_is_not_taken_for_a_persons_draft(tmux: Tmux, cli: Any) -> None:
    """Another sender holds the pane's lock, its paste in the input box: the broadcast waits its turn, like `drover
    send`, and delivers -- never a `skipped: draft in the input` blamed on a person."""
    import threading

    from drover.remote.tmux_lane import PaneLock

    pane = tmux.agent("mid-delivery")
    lock = PaneLock(_socket_of(pane), pane.id, 1.0)
    assert lock.__enter__()
    pane.tmux("send-keys", "-t", pane.id, "-l", "zzq")
    wait_for(lambda: "zzq" in pane.screen(), what="the other sender's paste")

    failed: list[BaseException] = []

    def the_other_sender_finishes() -> None:
        # Once the broadcast waits for the pane (past its skip check, which saw the paste): a fixed moment could
        # come before the broadcast looked at all on a loaded machine, proving nothing, or after drover's own bound
        # on the wait.  The lock is let go whatever happens, so the broadcast never waits on a thread that died.
        try:
            wait_for(waiting_on_pane_lock, what="the broadcast waiting for the pane's lock")
            pane.tmux("send-keys", "-t", pane.id, "BSpace", "BSpace", "BSpace")
            wait_for(lambda: "zzq" not in pane.screen(), what="the paste gone")
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's own thread below
            failed.append(exc)
        finally:
            lock.__exit__()

    other = threading.Thread(target=the_other_sender_finishes)
    other.start()
    try:
        res = cli("--actor", ACTOR, "broadcast", "--name", "mid-delivery", "your turn", "--json")
    finally:
        other.join()
    assert not failed, failed
    rows = res.json()["data"]["messages"]
    assert [r["outcome"] for r in rows] == ["delivered"], rows
    assert "draft" not in (rows[0]["detail"] or "")
    wait_for(pane.messages, what="the message")


def test_drovers_own_text_left_in_the_input_is_not_called_a_persons_draft(tmux: Tmux, cli: Any) -> None:
    pane = tmux.agent("leftover")
    pane.tmux("send-keys", "-t", pane.id, "-l", '<cross-session-message from-session="msg_0">old')
    wait_for(lambda: "cross-session-message" in pane.screen(), what="drover's leftover in the input")
    res = cli("--actor", ACTOR, "broadcast", "--name", "leftover", "hello", "--json")
    rows = res.json()["data"]["messages"]
    assert [r["outcome"] for r in rows] == ["skipped"], rows
    assert "draft in the input" not in rows[0]["detail"] and "drover's own" in rows[0]["detail"]
    assert rows[0]["code"] == "not_submitted"


def test_a_host_named_twice_is_asked_once_and_sent_to_once(tmux: Tmux, cli: Any) -> None:
    pane = tmux.agent("twice")
    res = cli("--actor", ACTOR, "broadcast", "-H", "local", "-H", "local", "--name", "twice", "once only", "--json")
    assert res.code == 0, res.out + res.err
    rows = res.json()["data"]["messages"]
    assert [r["outcome"] for r in rows] == ["delivered"], rows
    wait_for(pane.messages, what="the message")
    stays(lambda: len(pane.messages()) == 1)
    assert len(log_rows()) == 1
    listed = cli("ls", "-H", "local", "-H", "local", "--json").json()["data"]
    assert [s["id"] for s in listed["sessions"]].count(pane.id) == 1
    assert [h["host"] for h in listed["hosts"]] == ["local"]


def test_an_explicitly_empty_host_list_is_nobody_not_everyone(tmux: Tmux, cli: Any) -> None:
    pane = tmux.agent("bystander")
    for field in ("hosts", "tags"):
        res = cli("op", "sessions.broadcast", json.dumps({"text": "hi", field: [], "all": True}))
        assert res.code == 2, res.out + res.err
        assert f"{field} is empty" in res.out + res.err
    listed = cli("op", "sessions.list", json.dumps({"hosts": []}))
    assert listed.code == 0 and listed.json()["data"]["sessions"] == []
    stays(lambda: pane.messages() == [])
    assert log_rows() == []


def test_the_hosts_warnings_reach_the_broadcast(tmux: Tmux, isolated: Path, cli: Any, monkeypatch: Any) -> None:
    """What the host said while listing (here a Claude record it could not read; a tmux server that did not answer
    is said the same way) is in the broadcast's warnings and on stderr, as `ls` and `board` say it."""
    tmux.agent("lonely")
    sessions = isolated / "claude" / "sessions"
    sessions.mkdir(parents=True)
    (sessions / "123.json").write_text("{ not json")
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(sessions.parent))
    res = cli("--actor", ACTOR, "broadcast", "--name", "nobody-*", "anyone?", "--json")
    assert res.code == 6
    warned = res.json()["data"]["warnings"]
    assert any(w["host"] == "local" and "123.json" in w["message"] for w in warned), warned
    human = cli("--actor", ACTOR, "broadcast", "--name", "nobody-*", "anyone?")
    assert "warning: local: skipped Claude session record" in human.err


def test_a_directory_name_can_neither_forge_nor_hide_a_session(tmux: Tmux, isolated: Path, cli: Any) -> None:
    """A directory named with a newline and tmux's separators, as a row of `list-panes` would read: the shell in it
    stays a shell in its own directory (no agent forged with a made-up cwd for --cwd to pick), and a directory that
    merely holds a newline does not make its pane vanish."""
    agent = tmux.agent("real-agent")
    agent_pid = agent.tmux("display-message", "-p", "-t", agent.id, "#{pane_pid}").strip()
    forged = f"{isolated}/x\n%77\x1fsh1\x1f0\x1f0\x1f{agent_pid}\x1fpython\x1f{isolated}/forged3"
    plain = f"{isolated}/two\nlines"
    for d in (forged, plain):
        os.makedirs(d)
    shells = []
    for i, d in enumerate((forged, plain)):
        (isolated / f"dir{i}").write_text(d)
        shell = tmux.start(f"shell{i}", "bash --norc --noprofile")
        shell.tmux("send-keys", "-t", shell.id, f'cd "$(cat {isolated}/dir{i})"', "Enter")
        shells.append(shell)
    wanted = {forged, plain}
    wait_for(
        lambda: wanted <= {s.get("cwd") for s in cli("ls", "--json").json()["data"]["sessions"]},
        what="both shells listed in their directories",
    )
    listed = cli("ls", "--json").json()["data"]["sessions"]
    by_id = {s["id"]: s for s in listed}
    assert "%77" not in by_id and not any(str(s.get("cwd")).endswith("forged3") and s.get("cwd") != forged for s in listed)
    for shell, d in zip(shells, (forged, plain), strict=True):
        assert by_id[shell.id]["cwd"] == d and by_id[shell.id]["engine"] == "shell", by_id[shell.id]
    assert cli("broadcast", "--cwd", f"{isolated}/forged3", "hi").code == 6
    assert log_rows() == []


def test_list_panes_drops_rows_that_do_not_parse_and_a_pane_id_seen_twice() -> None:
    from drover.remote import tmux as T

    _fmt, start, sep = T._format()

    def row(pane_id: str, pid: str = "42", index: str = "0") -> str:
        values = dict.fromkeys(T.FIELDS, "")
        values.update(pane_id=pane_id, session_name="s", window_index=index, pane_index="0", pane_pid=pid)
        values.update(pane_dead="0", pane_in_mode="0", pane_input_off="0", window_activity="1", window_panes="1")
        values.update(session_windows="1", pane_current_path="/a\nb")
        return start + sep.join(values[f] for f in T.FIELDS) + "\n"

    warnings: list[str] = []
    out = row("%1") + row("%2") + row("%2") + row("x3") + row("%4", pid="4x") + row("%5", index="") + row("%6")
    panes = T.parse_rows(out, start, sep, warnings, "sock")
    assert [p["pane_id"] for p in panes] == ["%1", "%6"]
    assert panes[0]["pane_current_path"] == "/a\nb"
    assert len(warnings) == 4 and any("%2 listed 2 times" in w for w in warnings), warnings


def test_a_repeated_or_empty_selector_is_refused_not_half_kept(tmux: Tmux, cli: Any) -> None:
    a1, a2 = tmux.agent("a1"), tmux.agent("a2")
    for option, values in (("--name", ("a1", "a2")), ("--engine", ("demo", "claude")), ("--cwd", ("/x", "/y"))):
        res = cli("broadcast", option, values[0], option, values[1], "hi")
        assert res.code == 2 and f"{option} given 2 times" in res.err, res.out + res.err
        # Each says what it is: an engine is no glob, and the help shows one value, not a list.
        assert ("glob" in res.err) is (option != "--engine") and ("once per engine" in res.err) is (option == "--engine")
    shown = cli("broadcast", "--help").out
    assert "list[str]" not in shown and "--engine ENGINE" in shown and "--name GLOB" in shown, shown
    for option in ("--name", "--cwd", "--engine"):
        res = cli("broadcast", option, "", "--all", "hi")
        assert res.code == 2 and "is empty" in res.err, res.out + res.err
    stays(lambda: a1.messages() == [] and a2.messages() == [])
    assert log_rows() == []


def test_ctrl_c_half_way_prints_every_row_with_the_one_on_its_way_marked_indeterminate(tmux: Tmux) -> None:
    """SIGINT while one send waits for its pane (another sender holds it) and the others have landed: `--json`
    still prints one row per session -- the delivered ones as delivered, the one on its way as interrupted and
    indeterminate with its id (the record says the same) -- and exits 130, however often Ctrl-C is pressed.
    Nothing lands after the exit."""
    import subprocess

    from drover.remote.tmux_lane import PaneLock

    panes = [tmux.agent(f"cut-{i}") for i in (1, 2, 3)]
    lock = PaneLock(_socket_of(panes[1]), panes[1].id, 1.0)
    assert lock.__enter__()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "drover", "--actor", ACTOR, "broadcast", "--name", "cut-*", "half way", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: panes[0].messages() and panes[2].messages(), what="the two free panes to get it")
        # All three under way, and two of them finished in drover's own record -- not only in the agents' logs,
        # which a send still verifying (then cut short) would outrun.
        wait_for(
            lambda: len(rows := log_rows()) == 3 and sum(m["outcome"] == "delivered" for m in rows) == 2,
            what="two sends delivered and the third under way, in the record",
        )
        assert proc.poll() is None, proc.communicate()
        # Ctrl-C, then again at once, and again a moment later (a person pressing it three times): the report of
        # what was sent is still printed whole, and the exit is 130, not death by the signal.
        for pause in (0.01, 0.1, 0.0):
            proc.send_signal(signal.SIGINT)
            time.sleep(pause)
        out, err = proc.communicate(timeout=30)
    finally:
        lock.__exit__()
    assert proc.returncode == 130, (out, err)
    doc = json.loads(out)
    assert doc["data"]["interrupted"] is True and doc["errors"][0]["code"] == "interrupted"
    rows = {r["session"]["name"]: r for r in doc["data"]["messages"]}
    assert [rows[n]["outcome"] for n in ("cut-1", "cut-3")] == ["delivered", "delivered"], rows
    cut = rows["cut-2"]
    assert (cut["outcome"], cut["code"], cut["indeterminate"]) == ("failed", "interrupted", True), cut
    recorded = {m["id"]: m for m in log_rows()}
    assert cut["id"] in recorded and recorded[cut["id"]]["code"] == "interrupted"
    stays(lambda: not panes[1].messages(), 1.5, what="nothing landing after the broadcast was interrupted")
