"""drover as a library for scripts (drover/api.py): drover.run / drover.arun / Client / AsyncClient answer the
document `drover op` prints, keep their SSH connections between calls (counted by sshd itself), and work inside
a running event loop; the coordinator in docs/library.md runs as written."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import drover
from drover import api
from tests.conftest import ROOT, Tmux, drover_process, remote_agent, stays, wait_for
from tests.support.sshfleet import SSHFleet
from tests.test_daemon import fleet_helpers, persistent, running, status  # noqa: F401 - persistent is a fixture

KEYS = {"drover", "op", "ok", "data", "errors"}


def readme_coordinator() -> str:
    """The coordinator script of docs/library.md, as printed there."""
    text = (ROOT / "docs" / "library.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    found = [b for b in blocks if b.startswith('"""coordinate.py')]
    assert len(found) == 1, "docs/library.md shows one coordinate.py"
    return found[0]


def test_the_readme_coordinator_briefs_ten_sessions_on_three_hosts_over_one_connection_each(
    sshfleet: SSHFleet, isolated: Path
) -> None:
    """The issue's must-show: inside asyncio.run, through the async API, ten sessions on three hosts are briefed,
    waited for and read -- and sshd accepted exactly one connection per host for all of it."""
    layout = {"h1": 4, "h2": 3, "h3": 3}
    workers = [(host, f"worker-{host}-{i}") for host, n in layout.items() for i in range(1, n + 1)]
    panes = {w: remote_agent(sshfleet, w[0], w[1], isolated, "--busy-after-message", "0.5", "--reply") for w in workers}
    script = isolated / "coordinate.py"
    text = readme_coordinator()
    # One wait for all the workers and the record read from a cursor -- not one sessions.wait per worker.
    assert '"sessions.wait_many"' in text and '"events.read"' in text and '"sessions.wait",' not in text
    script.write_text(text, encoding="utf-8")
    mark = sshfleet.log_mark()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(script), *(f"{h}:{s}" for h, s in workers)], capture_output=True, text=True, env=env, timeout=240
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Each session answered its own brief (the demo agent replies "done: " + the words it got), and that answer
    # is what sessions.read gave back.
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines())
    assert lines == {f"{h}:{s}": f"done: take shard {i} of 10 of the test suite" for i, (h, s) in enumerate(workers, 1)}
    for i, w in enumerate(workers, 1):
        assert [m.endswith(f"take shard {i} of 10 of the test suite\n</cross-session-message>") for m in panes[w].messages()] == [
            True
        ]
        assert panes[w].events("reply"), f"{w} never answered"
    # sshd's own count: every TCP connection it accepted since the script started, per host address.
    assert sshfleet.connections(since=mark) == {"h1": 1, "h2": 1, "h3": 1}
    # And the record: ten sends, one each, by the coordinator.
    rows = drover.run("messages.list", limit=100)["data"]["messages"]
    assert sorted((m["host"], m["target"], m["actor"], m["outcome"]) for m in rows) == sorted(
        (h, s, "coordinator", "delivered") for h, s in workers
    )


def test_a_client_reuses_its_connection_across_runs(sshfleet: SSHFleet) -> None:
    mark = sshfleet.log_mark()
    with drover.Client() as client:
        docs = [client.run("sessions.list", hosts=["h1", "h2"]) for _ in range(4)]
        assert all(doc.ok for doc in docs), docs
        assert client.connections() == {"h1": 1, "h2": 1}
    assert sshfleet.connections(since=mark) == {"h1": 1, "h2": 1, "h3": 0}
    # A client dropped without close() still closes: its helpers end and its thread stops when it is collected.
    # (Only its own helpers: another test's daemon may still keep one on h2 until its idle exit.)
    before = set(fleet_helpers(sshfleet, "h2"))
    dropped = drover.Client()
    assert dropped.run("sessions.list", hosts=["h2"]).ok
    thread = dropped._thread
    assert thread is not None
    mine = wait_for(lambda: set(fleet_helpers(sshfleet, "h2")) - before, what="a helper kept on h2")
    del dropped
    gc.collect()
    wait_for(lambda: not thread.is_alive(), what="the dropped client's thread to stop")
    wait_for(lambda: not mine & set(fleet_helpers(sshfleet, "h2")), what="the dropped client's helpers to end")
    # drover.run's own client, across calls, sync and async alike.
    mark = sshfleet.log_mark()
    for _ in range(3):
        assert drover.run("sessions.list", {"hosts": ["h3"]}).ok

    async def from_a_loop() -> list[Any]:
        return list(await asyncio.gather(*(drover.arun("sessions.list", hosts=["h3"]) for _ in range(3))))

    assert all(doc["ok"] for doc in asyncio.run(from_a_loop()))
    assert sshfleet.connections(since=mark) == {"h1": 0, "h2": 0, "h3": 1}
    # Closed means closed: the next call opens a new connection.
    drover.close()
    assert drover.run("sessions.list", hosts=["h3"]).ok
    assert sshfleet.connections(since=mark) == {"h1": 0, "h2": 0, "h3": 2}


def test_run_works_inside_a_running_event_loop(tmux: Tmux) -> None:
    pane = tmux.agent("in-loop")

    async def coordinator() -> tuple[Any, Any, Any]:
        sent = drover.run("sessions.message", id=pane.address, text="sent from inside a loop", actor="looper")
        with drover.Client(actor="looper") as client:
            status = client.run("sessions.status", {"id": pane.address})
            waited = await client.arun("sessions.wait", id=pane.address, timeout_s=30)
        return sent, status, waited

    sent, status, waited = asyncio.run(coordinator())
    assert sent["ok"] and sent["data"]["outcome"] == "delivered", sent
    assert status["ok"] and status["data"]["session"]["id"] == pane.id
    assert waited["ok"] and waited["data"]["reached"], waited
    wait_for(pane.messages, what="the message")
    assert ["sent from inside a loop" in m and 'from-name="drover (looper)"' in m for m in pane.messages()] == [True]


def test_the_answer_is_the_document_drover_op_prints(tmux: Tmux, cli: Any) -> None:
    pane = tmux.agent("shape")
    screen = pane.screen()
    request = {"engine": "demo", "screen": screen}
    doc = drover.run("guard.check", request)
    assert type(doc) is api.Reply and isinstance(doc, dict) and set(doc) == KEYS
    printed = cli("op", "guard.check", json.dumps(request))
    assert doc == printed.json() and json.loads(json.dumps(doc)) == printed.json()
    assert doc["drover"] == 1 and doc["op"] == "guard.check" and doc["errors"] == [] and doc.exit_code == printed.code == 0
    # A dict and keyword arguments are one request (the keywords win); the attributes read the same fields.
    status = drover.run("sessions.status", {"id": "nobody-by-that-name"}, id=pane.address, tail=2)
    assert status.ok is status["ok"] is True and status.data is status["data"] and status.data["session"]["id"] == pane.id
    # Failures are documents too, with the CLI's exit code: never an exception.
    for args, code, exit_code in (
        ({"id": pane.address, "bogus": 1}, "invalid_request", 2),
        ({"id": "nobody-by-that-name"}, "session_not_found", 6),
    ):
        failed = drover.run("sessions.status", **args)
        assert set(failed) == KEYS and failed["ok"] is False and failed["data"] is None, failed
        assert failed["errors"][0]["code"] == code and failed.exit_code == exit_code
        assert failed == cli("op", "sessions.status", json.dumps(args)).json()
    unknown = drover.run("no.such.op")
    assert unknown["errors"][0]["code"] == "unknown_op" and unknown.exit_code == 2 and unknown.op == "no.such.op"
    with pytest.raises(TypeError, match="a dict or keyword arguments"):
        drover.run("sessions.list", ["h1"])  # type: ignore[arg-type]


async def until(cond: Any, what: str, timeout: float = 20.0) -> None:
    """conftest's wait_for, for a coroutine: the loop goes on while it waits."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def waiters() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "drover-helper-wait"]


def test_an_async_client_on_its_loop_and_a_cancelled_op(tmux: Tmux) -> None:
    pane = tmux.agent("async-busy")
    os.kill(pane.pid, signal.SIGUSR2)  # busy until told otherwise
    wait_for(lambda: "esc to interrupt" in pane.screen(), what="busy")

    async def scenario() -> tuple[Any, Any]:
        async with drover.AsyncClient() as client:
            waiting = asyncio.ensure_future(client.run("sessions.wait", id=pane.address, timeout_s=600))
            await until(waiters, "the wait at work (the local helper's thread)")
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await until(lambda: not waiters(), "the cancelled wait to stop")
            # The client goes on: the cancelled wait left nothing wedged.
            return await client.run("sessions.status", id=pane.address), client

    status, client = asyncio.run(scenario())

    async def through_drover_arun() -> None:
        waiting = asyncio.ensure_future(drover.arun("sessions.wait", id=pane.address, timeout_s=600))
        await until(waiters, "the wait at work, from the shared client's thread")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await until(lambda: not waiters(), "the cancelled wait to stop")

    asyncio.run(through_drover_arun())
    assert drover.run("sessions.status", id=pane.address)["data"]["session"]["state"] == "working"
    assert status["ok"] and status["data"]["session"]["state"] == "working", status

    async def elsewhere() -> None:
        await client.run("sessions.list")

    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(elsewhere())
    other = drover.AsyncClient()

    async def first() -> None:
        await other.run("messages.list")

    asyncio.run(first())
    with pytest.raises(RuntimeError, match="belongs to the event loop it was first used on"):
        asyncio.run(first())


@pytest.mark.usefixtures("persistent")
def test_a_running_daemon_serves_the_library_with_its_pool(sshfleet: SSHFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a daemon running, drover.run and drover.arun go through it: its one connection per host serves them,
    and the script's process opens none of its own."""
    first = drover_process("ls", "--json", timeout=60)  # the first use: runs directly and starts the daemon
    assert first.code == 0, first
    before = running()["served"]
    mark = sshfleet.log_mark()
    docs = [drover.run("sessions.list", hosts=["h1"]) for _ in range(3)]

    async def from_a_loop() -> Any:
        return await drover.arun("sessions.list", hosts=["h1"])

    docs.append(asyncio.run(from_a_loop()))
    assert all(set(d) == KEYS and d.ok for d in docs), docs
    assert status()["served"] == before + 4
    assert api.shared().connections() == {}
    assert sshfleet.connections(since=mark) == {"h1": 1, "h2": 0, "h3": 0}
    # A client that says no to the daemon runs its ops itself.
    mark = sshfleet.log_mark()
    with drover.Client(daemon=False) as own:
        assert own.run("sessions.list", hosts=["h2"]).ok
        assert own.connections() == {"h2": 1}
    assert status()["served"] == before + 4
    assert sshfleet.connections(since=mark) == {"h1": 0, "h2": 1, "h3": 0}
    # The daemon's answer is the very document a run here gives, odd characters and all.
    odd = {"engine": "demo", "screen": "\x1b[31m\u276f caf\u00e9 \u202e\x07 \U0001f600 \u2028"}
    served = before + 4
    with drover.Client(daemon=False) as own:
        assert drover.run("guard.check", odd) == own.run("guard.check", odd)
        assert status()["served"] == served + 1
    # The daemon stands for another environment than the script's now: not asked, the op runs here.
    monkeypatch.setenv("DROVER_SOMETHING_ELSE", "1")
    mark = sshfleet.log_mark()
    assert drover.run("sessions.list", hosts=["h3"]).ok
    assert api.shared().connections() == {"h3": 1}
    assert sshfleet.connections(since=mark) == {"h1": 0, "h2": 0, "h3": 1}
    monkeypatch.delenv("DROVER_SOMETHING_ELSE")
    assert status()["served"] == served + 1


@pytest.mark.usefixtures("persistent")
def test_a_send_whose_daemon_dies_after_recording_it_is_reported_uncertain_never_resent(
    tmux: Tmux, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon kills itself right after the write-ahead record, before anything is delivered: the library
    must not run the send again itself (that could deliver it twice); it answers a failed document naming the
    message, which messages.retry then finishes exactly once."""
    pane = tmux.agent("once-only")
    monkeypatch.setenv("DROVER_FAULT", "after_accept")  # the daemon's environment and ours alike: it must match
    assert drover_process("daemon", "start").code == 0
    doc = drover.run("sessions.message", id=pane.address, text="exactly once")
    assert set(doc) == KEYS and doc["ok"] is False and doc.exit_code == 5, doc
    (error,) = doc["errors"]
    assert error["code"] == "connection_lost" and "may or may not have arrived" in error["message"]
    msg_id = error["message"].split("while sending ")[1].split(":")[0]
    stays(lambda: pane.messages() == [], 1.0, what="nothing delivered, and nothing resent by the library")
    monkeypatch.delenv("DROVER_FAULT")
    monkeypatch.setenv("DROVER_DAEMON", "0")
    assert [m["id"] for m in drover.run("messages.list", pending=True)["data"]["messages"]] == [msg_id]
    assert drover.run("messages.retry", id=msg_id)["data"]["outcome"] == "delivered"
    wait_for(pane.messages, what="the retried message")
    stays(lambda: [m.count("exactly once") for m in pane.messages()] == [1], 1.0, what="one copy")


def test_a_pooled_connection_the_host_dropped_is_replaced_before_the_next_call(sshfleet: SSHFleet) -> None:
    """sshd closes the client's kept connection between two calls (a host restarted, a NAT timeout): the pool
    forgets it as soon as it is lost, and the next call connects again instead of failing on the corpse."""
    mark = sshfleet.log_mark()
    with drover.Client() as client:
        assert client.run("sessions.list", hosts=["h1"]).ok
        helpers = wait_for(lambda: fleet_helpers(sshfleet, "h1"), what="the helpers kept on h1")
        (session,) = {sshd_of(pid) for pid in helpers}  # all on the one connection
        os.kill(session, signal.SIGTERM)  # the sshd process serving that one connection
        wait_for(lambda: not connected(client, "h1"), what="the client to notice the lost connection")
        again = client.run("sessions.list", hosts=["h1"])
        assert again.ok, again
        assert client.connections() == {"h1": 2}
    assert sshfleet.connections(since=mark) == {"h1": 2, "h2": 0, "h3": 0}


def connected(client: drover.Client, host: str) -> bool:
    pool = client._core.pool
    assert pool is not None
    return any(row["connected"] for row in pool.status() if row["host"] == host)


def sshd_of(pid: int) -> int:
    """The sshd process (`sshd: USER@notty`) a helper runs under: one per connection."""
    while pid > 1:
        stat = Path(f"/proc/{pid}/stat").read_text()
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if (
            Path(f"/proc/{parent}/cmdline").read_bytes().startswith(b"sshd: ")
            and b"@" in Path(f"/proc/{parent}/cmdline").read_bytes()
        ):
            return parent
        pid = parent
    raise AssertionError("no sshd session process above the helper")


def test_read_gives_a_demo_agents_briefs_and_replies(tmux: Tmux) -> None:
    pane = tmux.agent("replier", "default", "--reply")
    assert drover.run("sessions.message", id=pane.address, text="line one\nline two", actor="boss").ok
    wait_for(lambda: pane.events("reply"), what="the reply")
    peer = drover.run("sessions.read", id=pane.address, roles=["peer"])
    assert peer.ok, peer
    assert [(e["role"], e["text"], e["from"]) for e in peer["data"]["events"]] == [
        ("peer", "line one\nline two", "drover (boss)")
    ]
    assert peer["data"]["engine"] == "demo" and peer["data"]["path"] == str(pane.log)
    answer = drover.run("sessions.read", id=pane.address, roles=["assistant"])
    assert [e["text"] for e in answer["data"]["events"]] == ["done: line one line two"]
    assert drover.run("sessions.read", id=pane.address, last=5)["data"]["matched"] == 2
    # A log that is gone is no transcript: said so, not an empty one.
    assert pane.log is not None
    pane.log.unlink()
    gone = drover.run("sessions.read", id=pane.address)
    assert gone["ok"] is False and gone["errors"][0]["code"] == "no_transcript", gone
    assert "keeps no log drover can read" in gone["errors"][0]["message"]


def test_the_environment_read_for_the_daemon_leaves_the_umask_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """drover.run asks for the daemon's environment on its own thread: finding the umask must never set it, even
    for an instant, or a file the script's other threads create then would get the wrong mode."""
    from drover import paths

    calls: list[int] = []
    real = os.umask

    def watched(mask: int) -> int:
        calls.append(mask)
        return real(mask)

    monkeypatch.setattr(os, "umask", watched)
    for mask in (0o022, 0o027):
        old = real(mask)
        try:
            assert paths.environment()[paths.UMASK] == f"{mask:04o}"
        finally:
            real(old)
    assert calls == []


def test_close_ends_the_calls_other_threads_are_in_with_a_clear_error(tmux: Tmux) -> None:
    """Client.close() and drover.close() while other threads wait inside a call: every such call ends, raising
    the documented RuntimeError, never left waiting on a loop that no longer runs."""
    pane = tmux.agent("close-busy")
    os.kill(pane.pid, signal.SIGUSR2)  # busy until told otherwise: a wait that would run for ten minutes
    wait_for(lambda: "esc to interrupt" in pane.screen(), what="busy")
    client = drover.Client()
    callers: list[tuple[str, Any]] = [("client", client.run)] * 3 + [("shared", drover.run)] * 2
    ended: dict[int, BaseException | Any] = {}

    def call(i: int, run: Any) -> None:
        try:
            ended[i] = run("sessions.wait", id=pane.address, timeout_s=600)
        except BaseException as exc:  # noqa: BLE001 - what the call raised is what is checked
            ended[i] = exc

    threads = [threading.Thread(target=call, args=(i, run), daemon=True) for i, (_, run) in enumerate(callers)]
    for t in threads:
        t.start()
    wait_for(lambda: len(waiters()) == len(threads), what="every wait at work")
    client.close()
    wait_for(lambda: not any(t.is_alive() for t in threads[:3]), what="the client's calls to end at its close")
    assert all(t.is_alive() for t in threads[3:])  # the shared client's calls are another client's
    drover.close()
    wait_for(lambda: not any(t.is_alive() for t in threads), what="drover.run's calls to end at drover.close")
    for i in range(len(threads)):
        assert isinstance(ended[i], RuntimeError) and "closed while the call ran" in str(ended[i]), ended[i]
    wait_for(lambda: not waiters(), what="the stopped waits to let go of the pane")
    # Closed, not broken: drover.run opens a new client; the closed one says it is closed.
    assert drover.run("sessions.status", id=pane.address)["data"]["session"]["state"] == "working"
    with pytest.raises(RuntimeError, match=r"this drover\.Client is closed"):
        client.run("sessions.status", id=pane.address)


def test_close_while_another_threads_first_run_is_importing_the_library() -> None:
    """drover.close() in the very moment another thread's first drover.run imports drover.api: the close waits
    for that import rather than finding a module without close() yet (AttributeError)."""
    script = (
        "import threading, time, drover\n"
        "t = threading.Thread(target=lambda: drover.run('messages.list'), daemon=True)\n"
        "t.start()\n"
        "for _ in range(50):\n"
        "    time.sleep(0.01)\n"
        "    drover.close()\n"
        "t.join(60)\n"
        "print('done')\n"
    )
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 0 and proc.stdout == "done\n", proc
        assert "AttributeError" not in proc.stderr, proc.stderr


@pytest.mark.usefixtures("persistent")
def test_a_request_json_cannot_carry_gets_the_same_answer_with_or_without_a_daemon() -> None:
    """A set, bytes, an odd object, a huge or NaN number, a lone surrogate: a direct run answers each with a
    document; with a daemon running, the same call must too (run here, as JSON would fail or change it) --
    never a raised TypeError/ValueError, never another error code."""
    first = drover_process("ls", "--json", timeout=60)  # starts the daemon
    assert first.code == 0, first
    served = running()["served"]
    odd = object()
    requests: list[tuple[str, dict[str, Any]]] = [
        ("sessions.list", {"hosts": {"local"}}),
        ("guard.check", {"engine": "demo", "screen": b"\xe2\x9d\xaf bytes"}),
        ("sessions.list", {"hosts": [odd]}),
        ("sessions.read", {"id": "nobody", "last": 10**5000}),
        ("sessions.read", {"id": "nobody", "last": float("nan")}),
        ("guard.check", {"engine": "demo", "screen": "a\ud800b"}),
        ("sessions.list", {"hosts": ("local",)}),
        ("guard.check", {"engine": "demo", "screen": "plain", 7: "a key JSON would turn into a string"}),  # type: ignore[dict-item]
    ]
    with drover.Client(daemon=False) as own:
        for name, request in requests:
            here = own.run(name, request)
            assert set(here) == KEYS, here
            through = drover.run(name, request)
            assert through == here and through.exit_code == here.exit_code, (name, request)
    assert status()["served"] == served  # none of them went to the daemon
    # A request that travels unchanged still goes there.
    assert drover.run("guard.check", engine="demo", screen="plain")["data"]["engine"] == "demo"
    assert status()["served"] == served + 1


def test_a_plain_script_exits_without_asyncio_complaining(sshfleet: SSHFleet) -> None:
    """`import drover; drover.run(...)` against an SSH host, then exit: the weakref finalizer ran before the atexit
    close and left its closing task to die with the loop ("Task was destroyed but it is pending!")."""
    env = {**os.environ, "HOME": str(sshfleet.client_home), "DROVER_FLEET": str(sshfleet.fleet_file)}  # type: ignore[attr-defined]
    script = "import drover\nprint(drover.run('sessions.list', hosts=['h1']).ok)\n"
    for _ in range(4):
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
        assert proc.returncode == 0 and proc.stdout == "True\n", proc
        assert "Task was destroyed" not in proc.stderr and "never awaited" not in proc.stderr, proc.stderr


def test_a_call_whose_connection_drover_dropped_says_so_not_that_the_helper_died(sshfleet: SSHFleet, isolated: Path) -> None:
    """A host that takes requests and never answers: a list runs out of time, and dropping its connection ends a
    spawn waiting on the same one.  That spawn's error says drover closed the connection, and why -- not "the
    helper died during spawn: exit status None", which blames the host."""
    hang = isolated / "hang.sh"
    hang.write_text("#!/bin/sh\nexec sleep 300\n")
    hang.chmod(0o755)
    fleet = Path(sshfleet.fleet_file)  # type: ignore[attr-defined]
    fleet.write_text(
        sshfleet.fleet_toml(f'[hosts.stuck]\nssh = "h2"\npython = "{hang}"\nrequest_timeout = 3.0\n')
        + '\n[spawn.demo]\ncommand = "sleep 600"\n',
        encoding="utf-8",
    )

    async def both() -> tuple[Any, Any]:
        async with drover.AsyncClient(fleet=fleet, daemon=False) as client:
            spawn = asyncio.ensure_future(client.run("sessions.spawn", host="stuck", engine="demo", cwd="/tmp", brief="x"))
            await asyncio.sleep(0)
            listed = await client.run("sessions.list", hosts=["stuck"])
            return listed, await spawn

    listed, spawned = asyncio.run(both())
    assert listed["errors"][0]["code"] == "timeout", listed
    error = spawned["errors"][0]
    assert error["code"] == "connection_lost" and "helper died" not in error["message"], error
    assert "drover closed the connection while spawn waited" in error["message"] and "ran out of time" in error["message"]
