"""Headless Claude Code sessions (docs/lanes.md): the real Claude Code offline, held on an SSH test host by drover's
holder -- spawned, briefed, sent to while idle and while busy, read, waited on, its holder killed -9 and the session
resumed, a send retried exactly once, claude killed under a live holder; and a holder socket planted by another
user, or a link to one, refused with nothing sent."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from drover.remote import headless
from tests.conftest import drover_process, helper_pids, remote_agent, stays, wait_for
from tests.support.sshfleet import SSHFleet

HERE = Path(__file__).resolve().parent / "support"


def launcher(lab: Any) -> Path:
    """`sh LAUNCHER NAME ARGS...`: this lab's Claude offline, with the arguments drover's holder appends (the
    stream-json flags, --session-id / --resume); its fake API reads ROOT/NAME.control.json."""
    script = lab.root / "launch-headless.sh"
    api = (
        f'{sys.executable} {HERE / "fake_anthropic.py"} --port 8765 --log {lab.root}/"$0".requests.jsonl '
        f'--control {lab.root}/"$0".control.json'
    )
    env = (
        f"env -u CLAUDE_CONFIG_DIR -u TMUX_PANE HOME={lab.home} ANTHROPIC_API_KEY=sk-ant-dummy "
        "ANTHROPIC_BASE_URL=http://127.0.0.1:8765 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 "
        "DISABLE_ERROR_REPORTING=1 IS_SANDBOX=1"
    )
    inner = f'ip link set lo up && ({api} >/dev/null 2>&1 &) && sleep 0.3 && exec {env} {lab.binary} --name "$0" "$@"'
    script.write_text(f'#!/bin/sh\nn=$1; shift\nexec unshare -n sh -c \'{inner}\' "$n" "$@"\n')
    return script


def procs_under(root: Path) -> list[int]:
    """Processes whose command line names `root` (the lab's fake APIs, launchers, claude): ours, to end."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(root).encode() in (entry / "cmdline").read_bytes():
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


@pytest.fixture
def hl(claude_binary: Path, sshfleet: SSHFleet, isolated: Path) -> Iterator[Any]:
    from tests.support.claudelab import ClaudeLab

    lab = ClaudeLab(Path(tempfile.mkdtemp(prefix="drh-")), claude_binary, home=sshfleet.host_home("h1"))
    script = launcher(lab)
    base = sshfleet.fleet_toml()
    Path(sshfleet.fleet_file).write_text(  # type: ignore[attr-defined]
        base + f'\n[spawn.claude]\ncommand = "sh {script} {{name}}"\nready_timeout_s = 60\n', encoding="utf-8"
    )
    state = sshfleet.host_home("h1") / ".local" / "state" / "drover" / "headless"
    yield lab, state
    sids = set()
    for folder in state.glob("hl-*") if state.exists() else []:
        info = headless._json(str(folder / "holder.json")) or {}
        sids.add((headless._json(str(folder / "spec.json")) or {}).get("session_id"))
        if headless._alive(info.get("pid")):
            os.kill(int(info["pid"]), signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)
    for pid in procs_under(lab.root):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    # The registry records its killed claudes left on h1 (the next test on that host expects none of its own).
    for rec in (lab.config / "sessions").glob("*.json"):
        if (headless._json(str(rec)) or {}).get("sessionId") in sids:
            rec.unlink()
    shutil.rmtree(lab.root, ignore_errors=True)


def stream(folder: Path) -> list[dict[str, Any]]:
    path = folder / "stream.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def replays(folder: Path, needle: str) -> list[dict[str, Any]]:
    return [e for e in stream(folder) if e.get("isReplay") and needle in json.dumps(e.get("message"))]


def claude_pid(sid: str) -> int | None:
    """The claude process of this session: its argv names the session id (after --session-id= or --resume=)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"/claude") and any(a.endswith(sid.encode()) and a.startswith(b"--") for a in argv):
                return int(entry.name)
    return None


@pytest.mark.slow
def test_a_headless_claude_on_an_ssh_host_does_everything_a_session_does(
    hl: Any, sshfleet: SSHFleet, cli: Any, isolated: Path
) -> None:
    lab, state = hl
    name = f"hl-{os.getpid()}"
    folder = state / name
    cwd = lab.root / "w0"  # trusted in the lab's ~/.claude.json
    cwd.mkdir()
    (lab.root / f"{name}.control.json").write_text(json.dumps({"reply": "on it"}))
    remote_agent(sshfleet, "h1", "agent", isolated)  # a tmux session beside it

    res = cli("spawn", "h1", "--engine", "claude", "--headless", "--cwd", str(cwd), "--name", name,
              "--brief", "review the schema change", "--json")  # fmt: skip
    assert res.code == 0, res.err + res.out
    data = res.json()["data"]
    sid = data["id"]
    assert (data["state"], data["identity"], data["headless"], data["pane"]) == ("ready", f"claude:{sid}", True, None)
    brief = data["brief"]
    assert (brief["outcome"], brief["lane"], brief["verified"]) == ("delivered", "headless", True), brief
    assert oct((folder).stat().st_mode & 0o777) == "0o700" and oct((folder / "sock").stat().st_mode & 0o777) == "0o600"
    # Detached: the holder leads a session of its own and is no helper's child (it outlives the SSH connection).
    holder_pid = json.loads((folder / "holder.json").read_text())["pid"]
    fields = Path(f"/proc/{holder_pid}/stat").read_text().rsplit(")", 1)[1].split()
    assert int(fields[3]) == holder_pid and int(fields[1]) not in helper_pids("h1"), fields
    # The brief is the stream's own user line (its echo), enveloped, its uuid drover's.
    echoed = wait_for(lambda: replays(folder, "review the schema change"), what="the brief's echo")
    assert echoed[0]["uuid"] == brief["uuid"] and "cross-session-message" in json.dumps(echoed[0])

    listed = cli("ls", "--host", "h1", "--json").json()["data"]["sessions"]
    rows = {s["name"]: s for s in listed}
    assert rows[name]["engine"] == "claude" and rows[name]["lanes"] == ["headless"] and rows[name]["id"] == sid
    assert "agent" in rows and rows["agent"]["lanes"] == ["tmux"]

    waited = cli("wait", f"h1:{name}", "--timeout", "60", "--json")
    assert waited.code == 0, waited.err + waited.out
    both = cli("wait", f"h1:{name}", "h1:agent", "--all", "--timeout", "60", "--json")  # one request (wait_many)
    assert both.code == 0, both.err + both.out
    assert "holder's stream" in both.out
    status = cli("status", f"h1:{name}", "--json").json()["data"]
    assert status["session"]["state"] == "idle", status

    # Idle: delivered, no busy note.  Then a turn held by the fake model: busy, and a send into it says so.
    idle = cli("send", f"h1:{name}", "first idle message", "--json").json()["data"]
    assert (idle["outcome"], idle["verified"]) == ("delivered", True) and "detail" not in idle, idle
    verified = cli("verify", idle["id"], "--json")
    assert verified.code == 0 and "acknowledged" in verified.out, verified.out
    pasted = cli("send", f"h1:{name}", "no paste for you", "--via", "tmux", "--json").json()["data"]
    assert (pasted["outcome"], pasted["code"]) == ("refused", "native_lane"), pasted
    wait_for(lambda: cli("status", f"h1:{name}", "--json").json()["data"]["session"]["state"] == "idle", what="idle")
    (lab.root / f"{name}.control.json").write_text(json.dumps({"reply": "held reply", "hold": True}))
    long = cli("send", f"h1:{name}", "start a long turn", "--json").json()["data"]
    assert long["outcome"] == "delivered", long
    busy = cli("status", f"h1:{name}", "--json").json()["data"]["session"]
    assert busy["state"] == "working", busy
    mid = cli("send", f"h1:{name}", "message while busy", "--json").json()["data"]
    # Only in claude's in-memory queue: queued, not verified until a turn takes it.
    assert (mid["outcome"], mid["verified"]) == ("queuedBehindTurn", False), mid
    assert "next tool-call boundary" in mid["detail"]
    (lab.root / f"{name}.control.json").write_text(json.dumps({"reply": "released"}))
    assert cli("wait", f"h1:{name}", "--timeout", "60").code == 0
    wait_for(lambda: replays(folder, "message while busy"), what="the busy message taken")
    taken = cli("verify", mid["id"], "--json").json()["data"]["messages"][0]
    assert taken["verified"] is True, taken
    results = [e for e in stream(folder) if e.get("type") == "result"]
    assert len(results) >= 4  # brief, idle, long, the one sent while busy

    read = cli("read", f"h1:{name}", "--json")
    assert read.code == 0, read.err
    texts = json.dumps(read.json()["data"])
    assert "message while busy" in texts and "released" in texts

    # retry exactly once: the sender dies after the host delivered it, before its outcome is recorded.
    died = drover_process("send", f"h1:{name}", "retry me once", env={"DROVER_FAULT": "before_outcome"})
    assert died.code != 0
    wait_for(lambda: replays(folder, "retry me once"), what="the crashed send's line")
    msg = json.loads(cli("log", "--json", "-n", "1").out)["data"]["messages"][0]
    first = cli("retry", msg["id"], "--json")
    assert first.code == 0, first.err + first.out
    assert "not sent again" in first.json()["data"]["detail"]
    second = cli("retry", msg["id"], "--json").json()["data"]
    assert "nothing to do" in second["detail"]
    assert len(replays(folder, "retry me once")) == 1

    # The holder killed: claude reads EOF and ends; ls says exited; a send fails clearly; a resume holds it again.
    holder = json.loads((folder / "holder.json").read_text())
    os.kill(holder["pid"], signal.SIGKILL)
    wait_for(lambda: claude_pid(sid) is None, what="claude ending at EOF")
    row = wait_for(
        lambda: next(s for s in cli("ls", "--host", "h1", "--json").json()["data"]["sessions"] if s["name"] == name),
        what="the row",
    )
    assert row["state"] == "exited", row
    watched = cli("watch", "run", "--json")  # recorded: the spawned session is gone without a terminal signal
    assert [e["session"]["identity"] for e in watched.json()["data"]["exited"]] == [f"claude:{sid}"], watched.out
    gone = cli("send", f"h1:{name}", "into the void")
    assert gone.code != 0 and "Traceback" not in gone.err
    resumed = cli("spawn", "h1", "--engine", "claude", "--headless", "--resume", name, "--json")
    assert resumed.code == 0, resumed.err + resumed.out
    assert resumed.json()["data"]["id"] == sid
    again = cli("send", f"h1:{name}", "after the resume", "--json").json()["data"]
    assert (again["outcome"], again["verified"]) == ("delivered", True), again
    assert cli("wait", f"h1:{name}", "--timeout", "60").code == 0
    transcript = list((sshfleet.host_home("h1") / ".claude" / "projects").glob(f"*/{sid}.jsonl"))
    assert len(transcript) == 1 and "after the resume" in transcript[0].read_text()

    # claude killed under a live holder: recorded, sends fail with a clear line, ls shows it exited.
    pid = wait_for(lambda: claude_pid(sid), what="the resumed claude")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: (folder / "exit.json").exists(), what="the holder recording the exit")
    failed = cli("send", f"h1:{name}", "to a dead claude")
    assert failed.code != 0 and "claude has exited" in failed.err and "Traceback" not in failed.err, failed.err
    row = next(s for s in cli("ls", "--host", "h1", "--json").json()["data"]["sessions"] if s["name"] == name)
    assert row["state"] == "exited" and "claude exited" in row["reason"], row
    # Resumed again: the lingering holder (its claude dead) is told to go, and a new one holds the same session.
    lingering = json.loads((folder / "holder.json").read_text())["pid"]
    assert cli("spawn", "h1", "--engine", "claude", "--headless", "--resume", name, "--brief", "carry on").code == 0
    assert not headless._alive(lingering)
    wait_for(lambda: replays(folder, "carry on"), what="the brief after the second resume")


# -- hostile: what is at the socket is not the session's own holder --------------------------------------------------


def planted(home: Path, name: str) -> Path:
    """A headless session's directory as drover would make it, with no holder yet."""
    base = home / "headless"
    base.mkdir(parents=True, mode=0o700, exist_ok=True)
    os.chmod(base, 0o700)
    folder = base / name
    folder.mkdir(mode=0o700)
    spec = {"name": name, "session_id": str(uuid.uuid4()), "cwd": "/", "argv": ["true"]}
    (folder / "spec.json").write_text(json.dumps(spec))
    return folder


class Listener:
    """A Unix socket that records whatever it is sent (a stranger's listener, planted where a holder's would be)."""

    def __init__(self, path: Path) -> None:
        self.got: list[bytes] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(2)
            try:
                data = conn.recv(65536)
                if data:
                    self.got.append(data)
                conn.sendall(b'{"ok": true, "alive": true, "ack": "queued"}\n')
            except OSError:
                pass
            conn.close()


def test_a_planted_holder_socket_is_refused_and_nothing_is_sent(isolated: Path, cli: Any) -> None:
    home = Path(os.environ["DROVER_HOME"])
    # 1. The socket is a link to a stranger's listener.
    folder = planted(home, "linked")
    elsewhere = Path(tempfile.mkdtemp(prefix="drx-"))
    stranger = Listener(elsewhere / "s")
    (folder / "sock").symlink_to(elsewhere / "s")
    (folder / "holder.json").write_text(json.dumps({"pid": os.getpid()}))
    res = cli("send", "local:linked", "secret plans")
    assert res.code != 0 and "symbolic link" in res.err and "nothing was sent" in res.err, res.err
    # 2. A socket in the directory that belongs to another user.
    other = planted(home, "foreign")
    foreign = Listener(other / "sock")
    os.chown(other / "sock", 65534, 65534)
    (other / "holder.json").write_text(json.dumps({"pid": os.getpid()}))
    res = cli("send", "local:foreign", "secret plans")
    assert res.code != 0 and "belongs to uid 65534" in res.err, res.err
    # 3. Ours and 0600, but the listener is not the holder the directory names (SO_PEERCRED).
    third = planted(home, "impostor")
    impostor = Listener(third / "sock")
    os.chmod(third / "sock", 0o600)
    (third / "holder.json").write_text(json.dumps({"pid": 1}))
    res = cli("send", "local:impostor", "secret plans")
    assert res.code != 0 and "not the session's holder" in res.err, res.err
    # 4. A session directory others may enter is not read at all.
    open_dir = planted(home, "opendir")
    os.chmod(open_dir, 0o755)
    # 5. A session directory that is a link to one elsewhere (however well it looks there) is not read either.
    target = planted(Path(tempfile.mkdtemp(prefix="drl-")), "aside")
    (home / "headless" / "linkdir").symlink_to(target)
    listed = cli("ls", "--host", "local", "--json").json()
    names = [s["name"] for s in listed["data"]["sessions"]]
    assert "opendir" not in names and "aside" not in names and "linked" in names, names
    assert "linkdir is a symbolic link" in json.dumps(listed), json.dumps(listed)[-1500:]
    stays(lambda: stranger.got == [] and foreign.got == [] and impostor.got == [], what="nothing sent to any listener")
    shutil.rmtree(elsewhere, ignore_errors=True)
    shutil.rmtree(target.parent.parent, ignore_errors=True)


@pytest.mark.slow
def test_a_headless_claude_that_dies_at_once_is_one_line_and_leaves_nothing(
    isolated: Path, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = isolated / "broken-claude.sh"
    script.write_text("#!/bin/sh\necho 'claude: no API key here' >&2\nexit 3\n")
    fleet = isolated / "fleet.toml"
    fleet.write_text(f'[spawn.claude]\ncommand = "sh {script}"\nready_timeout_s = 30\n', encoding="utf-8")
    monkeypatch.setenv("DROVER_FLEET", str(fleet))
    res = cli("spawn", "local", "--engine", "claude", "--headless", "--cwd", str(isolated), "--name", "hl-broken",
              "--brief", "hello")  # fmt: skip
    assert res.code != 0 and "Traceback" not in res.err, res.err
    assert "claude exited at once (exit status 3)" in res.err and "no API key here" in res.err, res.err
    assert not (Path(os.environ["DROVER_HOME"]) / "headless" / "hl-broken").exists()


# -- Codex through `codex app-server`, held the same way ---------------------------------------------------------------


@pytest.fixture
def codex_lab() -> Iterator[Any]:
    from tests.support import codexlab

    path, why = codexlab.ensure_binary()
    if path is None:
        pytest.skip(f"the real Codex CLI cannot run here: {why}")
    root = Path(tempfile.mkdtemp(prefix="drk-"))
    lab = codexlab.CodexLab(root, path)
    yield lab
    if lab.fake is not None:
        lab.fake.kill()
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_a_headless_codex_thread_is_started_steered_and_resumed(
    codex_lab: Any, isolated: Path, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.codexlab import _ns_prefix

    lab = codex_lab
    cwd = lab.root / "w"
    cwd.mkdir()
    lab.write_config([cwd])
    lab.set_control(reply="codex heard: {input}")
    ns = " ".join(_ns_prefix(lab.fake.pid))
    command = f"{ns} env HOME={lab.home} CODEX_HOME={lab.codex_home} OPENAI_API_KEY=sk-dummy {lab.binary}"
    fleet = isolated / "fleet.toml"
    fleet.write_text(f'[spawn.codex]\ncommand = "{command}"\nready_timeout_s = 60\n', encoding="utf-8")
    monkeypatch.setenv("DROVER_FLEET", str(fleet))
    monkeypatch.setenv("CODEX_HOME", str(lab.codex_home))  # where the local helper reads rollouts
    folder = Path(os.environ["DROVER_HOME"]) / "headless" / "hx"
    try:
        res = cli("spawn", "local", "--engine", "codex", "--headless", "--cwd", str(cwd), "--name", "hx",
                  "--brief", "map the repo", "--json")  # fmt: skip
        assert res.code == 0, res.err + res.out
        data = res.json()["data"]
        thread = data["id"]
        assert data["identity"] == f"codex:{thread}" and data["brief"]["lane"] == "headless", data
        assert data["brief"]["verified"] is True, data["brief"]
        assert cli("wait", "local:hx", "--timeout", "60").code == 0
        rows = {s["name"]: s for s in cli("ls", "--host", "local", "--json").json()["data"]["sessions"]}
        assert (rows["hx"]["engine"], rows["hx"]["lanes"], rows["hx"]["state"]) == ("codex", ["headless"], "idle")
        # Busy: a held turn is steered, and the outcome says so.
        lab.set_control(reply="codex heard: {input}", hold=True)
        assert cli("send", "local:hx", "a long task").code == 0
        wait_for(lambda: cli("status", "local:hx", "--json").json()["data"]["session"]["state"] == "working", what="busy")
        steered = cli("send", "local:hx", "also this", "--json").json()["data"]
        assert (steered["outcome"], steered["verified"]) == ("delivered", True) and "turn/steer" in steered["detail"], steered
        assert "(steered)" in steered["verification"], steered
        lab.set_control(reply="codex heard: {input}")
        assert cli("wait", "local:hx", "--timeout", "60").code == 0
        text = json.dumps(cli("read", "local:hx", "--json").json()["data"])
        assert "map the repo" in text and "also this" in text, text[-2000:]
        # Its holder killed: the app-server reads EOF and ends; resumed on the same thread.
        os.kill(json.loads((folder / "holder.json").read_text())["pid"], signal.SIGKILL)
        wait_for(
            lambda: (
                next(s for s in cli("ls", "--host", "local", "--json").json()["data"]["sessions"] if s["name"] == "hx")["state"]
                == "exited"
            ),
            what="exited",
        )
        again = cli("spawn", "local", "--engine", "codex", "--headless", "--resume", "hx", "--json")
        assert again.code == 0 and again.json()["data"]["id"] == thread, again.err + again.out
        after = cli("send", "local:hx", "after the resume", "--json").json()["data"]
        assert (after["outcome"], after["verified"]) == ("delivered", True), after
        assert cli("wait", "local:hx", "--timeout", "60").code == 0
        assert "after the resume" in json.dumps(cli("read", "local:hx", "--json").json()["data"])
    finally:
        info = headless._json(str(folder / "holder.json")) or {}
        if headless._alive(info.get("pid")):
            os.kill(int(info["pid"]), signal.SIGKILL)
        for pid in procs_under(lab.root):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
