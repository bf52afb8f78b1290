"""Command adapters (`adapter:NAME`, drover/adapters.py): real processes from tiny scripts written here, run with the
text on stdin and the message in the environment; their exit status is the outcome, their stdout the record's
untrusted reply.  A hang is killed with its whole process group; a retry runs it again under the same id."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for

Cli = Callable[..., Any]


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert "Traceback" not in err and lines[0].startswith("drover: ")
    return lines[0]


def toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string


def fleet(tmp: Path, monkeypatch: pytest.MonkeyPatch, adapters: dict[str, dict[str, Any]]) -> Path:
    """A fleet.toml with these [adapters.NAME] tables, made the fleet of the test."""
    out = []
    for name, table in adapters.items():
        out.append(f"[adapters.{name}]")
        for key, value in table.items():
            if isinstance(value, dict):
                out.append(f"{key} = {{ " + ", ".join(f"{k} = {toml_str(v)}" for k, v in value.items()) + " }")
            elif isinstance(value, list):
                out.append(f"{key} = [" + ", ".join(toml_str(v) for v in value) + "]")
            elif isinstance(value, str):
                out.append(f"{key} = {toml_str(value)}")
            else:
                out.append(f"{key} = {value}")
    path = tmp / "fleet.toml"
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    monkeypatch.setenv("DROVER_FLEET", str(path))
    return path


def script(tmp: Path, name: str, body: str) -> dict[str, Any]:
    """An adapter table running `body` as a Python script (the interpreter as command: no shebang to trust)."""
    path = tmp / f"{name}.py"
    path.write_text(body, encoding="utf-8")
    return {"command": sys.executable, "args": [str(path)]}


def last_message(cli: Cli) -> dict[str, Any]:
    messages = cli("log", "--json").json()["data"]["messages"]
    return dict(messages[-1])


def truth_outcomes(home: Path, msg_id: str) -> list[dict[str, Any]]:
    lines = (home / "truth.jsonl").read_text(encoding="utf-8").splitlines()
    events = [json.loads(line) for line in lines]
    return [e for e in events if e.get("event") == "outcome" and e.get("id") == msg_id]


EXITING = """
import sys
sys.stdin.buffer.read()
sys.stdout.write("reply from the gateway\\n")
sys.stderr.write("some noise\\nthe last word\\n")
sys.exit({code})
"""


@pytest.mark.parametrize(
    ("code", "outcome", "error_code", "exit_code"),
    [
        (0, "delivered", None, 0),
        (4, "refused", "adapter_refused", 4),
        (3, "held", "held", 3),
        (7, "failed", "adapter_failed", 5),
    ],
)
def test_the_exit_status_is_the_outcome(
    cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch, code: int, outcome: str, error_code: str | None, exit_code: int
) -> None:
    fleet(isolated, monkeypatch, {"gw": script(isolated, "gw", EXITING.format(code=code))})
    res = cli("send", "adapter:gw", "hello", "--json")
    assert res.code == exit_code, res.out
    data = res.json()["data"]
    assert (data["outcome"], data.get("code"), data["lane"], data["exit"]) == (outcome, error_code, "adapter", code)
    assert data["stdout"] == "reply from the gateway\n" and data["untrusted"] is True
    assert 'stderr (the adapter\'s, untrusted): "the last word"' in data["detail"]
    assert data["stderr_tail"] == "the last word"
    assert data.get("verified") is (True if code == 0 else None)
    assert data.get("verification") == ("the adapter's own word: it exited 0" if code == 0 else None)
    assert not data.get("indeterminate")  # the adapter said what happened: nothing is uncertain
    m = last_message(cli)
    assert (m["id"], m["host"], m["target"], m["outcome"], m["code"]) == (data["id"], "adapter", "gw", outcome, error_code)
    assert (m["verified"], m["verification"]) == (data.get("verified"), data.get("verification"))
    # The reply is in the record, as data: marked untrusted.
    said = {"exit": code, "stdout": "reply from the gateway\n", "stderr_tail": "the last word", "untrusted": True}
    assert m["reply"] == said
    if code == 3:  # held, as the board knows held messages
        held = cli("board", "--json").json()["data"]["held"]
        assert [h["id"] for h in held] == [data["id"]]


def test_a_crash_by_signal_is_failed_with_the_signal_named(cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet(isolated, monkeypatch, {"seg": {"command": "/bin/sh", "args": ["-c", "cat >/dev/null; echo partial; kill -SEGV $$"]}})
    res = cli("send", "adapter:seg", "hello", "--json")
    assert res.code == 5, res.out
    data = res.json()["data"]
    assert (data["outcome"], data["code"], data["signal"]) == ("failed", "adapter_crashed", "SIGSEGV")
    assert "killed by SIGSEGV" in data["detail"] and data["indeterminate"] is True
    assert data["stdout"] == "partial\n" and "exit" not in data
    assert last_message(cli)["indeterminate"] is True


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, only not yet reaped


@pytest.mark.slow  # it waits out the adapter's timeout
def test_a_hang_is_killed_at_its_timeout_with_its_process_group(
    cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = isolated / "pids"
    # The adapter starts a child of its own, says both pids, and hangs; neither may outlive the timeout.
    hang = f"sleep 600 & echo $$ $! > {pids}; echo started; wait"
    # Long enough for a loaded machine to start the shell and let it write its pids before it is killed.
    fleet(isolated, monkeypatch, {"hang": {"command": "/bin/sh", "args": ["-c", hang], "timeout": 3}})
    res = cli("send", "adapter:hang", "hello", "--json")
    assert res.code == 5, res.out
    data = res.json()["data"]
    assert (data["outcome"], data["code"], data["indeterminate"]) == ("failed", "adapter_timeout", True)
    assert "past its timeout of 3s and was killed with its process group" in data["detail"]
    assert data["stdout"] == "started\n" and data["signal"] == "SIGKILL"
    shell, child = (int(p) for p in pids.read_text().split())
    wait_for(lambda: not alive(shell) and not alive(child), what="the adapter and its child gone")


HOSTILE = "a; rm -rf / && $(touch PWNED) `touch PWNED2` | tee x > y\n'\"\\ $HOME * ?\nlast line without newline \u00e9\u65e5"

RECORDING = """
import json, os, sys
data = sys.stdin.buffer.read()
out = os.environ["OUT"]
with open(out + ".stdin", "ab") as f:
    f.write(data)
keys = ("DROVER_MESSAGE_ID", "DROVER_ACTOR", "DROVER_TARGET", "DROVER_ATTEMPT", "EXTRA")
with open(out + ".runs", "a") as f:
    f.write(json.dumps({"env": {k: os.environ.get(k) for k in keys}, "argv": sys.argv[1:], "cwd": os.getcwd()}) + "\\n")
runs = sum(1 for _ in open(out + ".runs"))
print("run", runs)
sys.exit(int(os.environ.get("FAIL_FIRST", "0")) if runs == 1 else 0)
"""


def test_hostile_text_arrives_byte_exact_and_is_never_interpreted(
    cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = isolated / "work"
    work.mkdir()
    out = isolated / "rec"
    table = script(isolated, "rec", RECORDING)
    table["args"] += ["$(touch PWNED3)", "; echo hi", "*"]
    table.update(cwd=str(work), env={"OUT": str(out), "EXTRA": "x y $z"})
    fleet(isolated, monkeypatch, {"rec": table})
    res = cli("send", "adapter:rec", HOSTILE, "--actor", "me@here", "--json")
    assert res.code == 0, res.out
    assert Path(f"{out}.stdin").read_bytes() == HOSTILE.encode("utf-8")
    run = json.loads(Path(f"{out}.runs").read_text())
    assert run["argv"] == ["$(touch PWNED3)", "; echo hi", "*"]  # each argument as written: no shell, no glob
    assert run["cwd"] == str(work)
    assert sorted(p.name for p in work.iterdir()) == []  # nothing was run, nothing was written
    assert not any(isolated.glob("PWNED*")) and not any(Path.cwd().glob("PWNED*"))
    msg_id = res.json()["data"]["id"]
    assert run["env"] == {
        "DROVER_MESSAGE_ID": msg_id,
        "DROVER_ACTOR": "me@here",
        "DROVER_TARGET": "adapter:rec",
        "DROVER_ATTEMPT": "1",
        "EXTRA": "x y $z",
    }


def test_a_retry_runs_it_again_under_the_same_id(cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = isolated / "rec"
    table = script(isolated, "rec", RECORDING)
    table["env"] = {"OUT": str(out), "FAIL_FIRST": "9"}
    fleet(isolated, monkeypatch, {"rec": table})
    first = cli("send", "adapter:rec", "once, idempotently", "--json")
    assert first.code == 5, first.out
    assert first.json()["data"]["code"] == "adapter_failed"
    msg_id = first.json()["data"]["id"]
    again = cli("retry", msg_id, "--json")
    assert again.code == 0, again.out
    data = again.json()["data"]
    assert (data["id"], data["outcome"], data["verified"], data["stdout"]) == (msg_id, "delivered", True, "run 2\n")
    runs = [json.loads(line) for line in Path(f"{out}.runs").read_text().splitlines()]
    assert [(r["env"]["DROVER_MESSAGE_ID"], r["env"]["DROVER_ATTEMPT"]) for r in runs] == [(msg_id, "1"), (msg_id, "2")]
    assert Path(f"{out}.stdin").read_bytes() == b"once, idempotently" * 2
    assert [e["outcome"] for e in truth_outcomes(isolated / "home", msg_id)] == ["failed", "delivered"]
    # Delivered and verified by the adapter's own word: a second retry runs nothing.
    done = cli("retry", msg_id, "--json")
    assert done.code == 0 and done.json()["data"]["detail"] == "the adapter's exit 0 (recorded) says it arrived: nothing to do"
    assert len(Path(f"{out}.runs").read_text().splitlines()) == 2


def test_stdout_is_kept_bounded_and_marked_truncated(cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = "import sys\nsys.stdout.write('x' * 200000 + 'END')\n"
    fleet(isolated, monkeypatch, {"big": script(isolated, "big", big)})
    res = cli("send", "adapter:big", "hello", "--json")
    assert res.code == 0, res.out
    data = res.json()["data"]
    assert data["stdout"] == "x" * 65536 and data["stdout_truncated"] is True and data["stdout_bytes"] == 200003
    assert last_message(cli)["reply"]["stdout_truncated"] is True


def test_an_adapter_that_never_reads_stdin_is_not_a_deadlock(cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet(isolated, monkeypatch, {"deaf": {"command": "/bin/sh", "args": ["-c", "echo ignored"]}})
    res = cli("send", "adapter:deaf", "y" * 1_000_000, "--json")  # more than any pipe buffer holds
    assert res.code == 0, res.out
    assert res.json()["data"]["stdout"] == "ignored\n"


def test_an_unknown_adapter_names_the_fleets_adapters(cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet(isolated, monkeypatch, {"pager": {"command": "/bin/true"}, "chat": {"command": "/bin/true"}})
    res = cli("send", "adapter:pagr", "hello")
    assert res.code == 6
    line = one_line(res.err)
    assert "no adapter 'pagr' in the fleet" in line and "the fleet's adapters: chat, pager" in line


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ({"command": "/nonexistent/gateway"}, "command '/nonexistent/gateway' does not exist"),
        ({"command": "no-such-gateway-xyz"}, "command 'no-such-gateway-xyz' is not on PATH"),
        ({"command": "/bin/true", "cwd": "/nonexistent/dir"}, "its cwd '/nonexistent/dir' is not a directory"),
    ],
)
def test_a_missing_command_is_a_clear_failure(
    cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch, table: dict[str, Any], said: str
) -> None:
    fleet(isolated, monkeypatch, {"gw": table})
    res = cli("send", "adapter:gw", "hello")
    assert res.code == 5
    line = one_line(res.err)
    assert said in line and "fix [adapters.gw] in fleet.toml" in line
    m = last_message(cli)
    assert (m["outcome"], m["code"], m["indeterminate"]) == ("failed", "adapter_missing", None)


def test_a_command_that_cannot_be_executed_is_a_clear_failure(cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = isolated / "not-executable"
    plain.write_text("echo hi\n")
    bad_interp = isolated / "bad-interp"
    bad_interp.write_text("#!/nonexistent/interpreter\n")
    bad_interp.chmod(0o755)
    fleet(isolated, monkeypatch, {"plain": {"command": str(plain)}, "interp": {"command": str(bad_interp)}})
    res = cli("send", "adapter:plain", "hello")
    assert res.code == 5 and "is not executable" in one_line(res.err)
    res = cli("send", "adapter:interp", "hello")
    assert res.code == 5 and "could not be started" in one_line(res.err)
    assert last_message(cli)["code"] == "adapter_missing"


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ('[adapters."a:b"]\ncommand = "/bin/true"\n', "adapter name 'a:b' must be letters"),
        ('[adapters.x]\ncommand = "/bin/true"\nenv = { DROVER_MESSAGE_ID = "1" }\n', "DROVER_MESSAGE_ID is set by drover"),
        ('[adapters.x]\ncommand = "/bin/true"\ntimeout = 0\n', "timeout"),
        ('[adapters.x]\nargs = ["a"]\n', "command"),
        ('[adapters.x]\ncommand = "bin/gw"\n', "'bin/gw' must be absolute or ~/..."),
        ('[adapters.x]\ncommand = "gw"\ncwd = "work"\n', "'work' must be absolute or ~/..."),
        ('[adapters.x]\ncommand = "/bin/true"\nshell = true\n', "shell"),
    ],
)
def test_a_bad_adapter_table_is_a_config_error(cli: Cli, isolated: Path, table: str, said: str) -> None:
    path = isolated / "fleet.toml"
    path.write_text(table, encoding="utf-8")
    res = cli("--fleet", str(path), "send", "adapter:x", "hello")
    assert res.code == 7, res.err
    assert said in one_line(res.err)


def test_fleet_show_lists_the_adapters(cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet(isolated, monkeypatch, {"pager": {"command": "/usr/bin/pager-gw", "args": ["--to", "on call"], "timeout": 5}})
    res = cli("fleet", "show")
    assert res.code == 0, res.err
    assert "adapter:pager  /usr/bin/pager-gw --to 'on call'  (timeout 5s)" in res.out
    doc = cli("fleet", "show", "--json").json()["data"]["fleet"]["adapters"]
    assert doc == {"pager": {"command": "/usr/bin/pager-gw", "args": ["--to", "on call"], "timeout": 5.0, "env": {}, "cwd": None}}


def test_the_adapter_gets_drovers_environment(cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = isolated / "env"
    body = f"import os\nopen({str(out)!r}, 'w').write(os.environ.get('FROM_DROVER', '-'))\n"
    monkeypatch.setenv("FROM_DROVER", "inherited")
    fleet(isolated, monkeypatch, {"e": script(isolated, "e", body)})
    assert cli("send", "adapter:e", "hello").code == 0
    assert out.read_text() == "inherited"
    assert os.environ.get("DROVER_MESSAGE_ID") is None  # set for the adapter, never in drover's own environment


def test_the_example_fleet_documents_every_adapter_key() -> None:
    from drover import fleet as fleet_mod
    from drover.fleet_adapters import AdapterConfig

    root = Path(__file__).resolve().parent.parent
    text = (root / "fleet.example.toml").read_text(encoding="utf-8")
    assert text == (root / "drover" / "fleet.example.toml").read_text(encoding="utf-8")
    parsed = fleet_mod.parse(text, root / "fleet.example.toml")
    assert parsed.adapters["pager"].args == ["--team", "infra"] and parsed.adapters["pager"].timeout == 30.0
    for key in AdapterConfig.model_fields:
        assert f"\n{key} =" in text, f"fleet.example.toml does not document [adapters.NAME] {key}"


def test_a_cancelled_send_leaves_nothing_of_the_adapter_running(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (the send's task cancelled) while the adapter runs: its process group is killed before drover goes."""
    import asyncio

    from drover import adapters
    from drover.ops.core import Context

    pids = isolated / "pids"
    hang = f"sleep 600 & echo $$ $! > {pids}.tmp; mv {pids}.tmp {pids}; wait"
    path = fleet(isolated, monkeypatch, {"hang": {"command": "/bin/sh", "args": ["-c", hang], "timeout": 600}})

    async def main() -> None:
        ctx = Context(fleet_path=str(path))
        task = asyncio.ensure_future(adapters.deliver(ctx, "hang", msg_id="msg_x", text="t", actor="a", attempt=1))
        for _ in range(3000):  # a minute, generously: the shell writes its pids at once
            if pids.exists() or task.done():
                break
            await asyncio.sleep(0.02)
        assert pids.exists() and not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    shell, child = (int(p) for p in pids.read_text().split())
    wait_for(lambda: not alive(shell) and not alive(child), what="the adapter and its child gone")


def test_a_send_cancelled_while_its_adapter_is_being_started_ends(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled at once, while asyncio still sets up the adapter's pipes (the hang that asyncio's own clean-up of a
    half-made process had: it waits for pipes the adapter's child holds), the send ends and leaves nothing running."""
    import asyncio

    from drover import adapters
    from drover.ops.core import Context

    pids = isolated / "pids"
    hang = f"sleep 600 & echo $$ $! > {pids}.tmp; mv {pids}.tmp {pids}; wait"
    path = fleet(isolated, monkeypatch, {"hang": {"command": "/bin/sh", "args": ["-c", hang], "timeout": 600}})
    left: list[int] = []

    async def main() -> None:
        ctx = Context(fleet_path=str(path))
        for turns in (0, 1, 2, 3, 5, 8):  # the cancel lands at different steps of the start
            pids.unlink(missing_ok=True)
            task = asyncio.ensure_future(adapters.deliver(ctx, "hang", msg_id="msg_x", text="t", actor="a", attempt=1))
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            done, _pending = await asyncio.wait([task], timeout=120)  # a hang is a failure, not a stuck suite
            assert done, f"the send cancelled after {turns} turns of the loop never ended"
            if pids.exists():
                left.extend(int(p) for p in pids.read_text().split())

    asyncio.run(main())
    wait_for(lambda: not any(alive(pid) for pid in left), what="every adapter and its child gone")


@pytest.mark.slow  # the two seconds drover gives a held pipe after the adapter's exit, and a timeout
@pytest.mark.parametrize(("tail", "outcome"), [("echo hi", "delivered"), ("echo hi; wait", "failed")])
def test_a_process_left_outside_the_group_holds_up_nothing(
    cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch, tail: str, outcome: str
) -> None:
    """A process the adapter started in a session of its own (`setsid`) keeps its pipes open as long as it lives:
    the outcome is the adapter's own exit (or its timeout), not that process's end, and it leaves no traceback."""
    pids = isolated / "pids"
    body = f"setsid sleep 600 & echo $! > {pids}.tmp; mv {pids}.tmp {pids}; {tail}"
    fleet(isolated, monkeypatch, {"bg": {"command": "/bin/sh", "args": ["-c", body], "timeout": 3}})
    try:
        res = cli("send", "adapter:bg", "hello", "--json")
        assert "Traceback" not in res.err and "Event loop is closed" not in res.err
        data = res.json()["data"]
        assert (data["outcome"], data["stdout"]) == (outcome, "hi\n")
        if outcome == "failed":
            assert data["code"] == "adapter_timeout"
        straggler = int(pids.read_text())
        assert alive(straggler)  # out of the adapter's group, so out of drover's reach: only not waited for
    finally:
        if pids.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pids.read_text()), signal.SIGKILL)


# The adapter writes its own pid and DROVER_ATTEMPT, then sleeps: a send that is still running when drover dies.
SLEEPER = """
import os, sys, time
sys.stdin.buffer.read()
out = os.environ["OUT"]
with open(out + ".runs", "a") as f:
    f.write(f"{os.getpid()} {os.environ['DROVER_ATTEMPT']}\\n")
if os.environ["DROVER_ATTEMPT"] == "1":
    time.sleep(600)
"""


def _drover_killed_mid_send(isolated: Path, monkeypatch: pytest.MonkeyPatch, prelude: str) -> tuple[int, str]:
    """`drover send` in a process of its own, killed -9 once the adapter runs: the adapter's pid and the message id."""
    import subprocess

    out = isolated / "sleeper"
    table = script(isolated, "sleeper", SLEEPER)
    table.update(env={"OUT": str(out)}, timeout=600)
    fleet(isolated, monkeypatch, {"slow": table})
    code = f"{prelude}\nimport sys\nfrom drover.cli.main import main\nsys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "send", "adapter:slow", "hi"], stdout=subprocess.DEVNULL)
    runs = Path(f"{out}.runs")
    wait_for(lambda: runs.exists() and runs.read_text().endswith("\n"), what="the adapter started")
    proc.kill()
    proc.wait(timeout=60)
    pid = int(runs.read_text().split()[0])
    lines = (isolated / "home" / "truth.jsonl").read_text(encoding="utf-8").splitlines()
    return pid, str(json.loads(lines[-1])["id"])


def test_a_retry_while_a_killed_drovers_adapter_still_runs_is_busy(
    cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where drover cannot tie the adapter's life to its own (not Linux): the adapter outlives a drover killed -9.
    unbound = "import drover.adapters as a; a._die_with_parent = lambda p: None"
    pid, msg_id = _drover_killed_mid_send(isolated, monkeypatch, unbound)
    try:
        assert alive(pid)
        res = cli("retry", msg_id)
        assert res.code == 4, res.out
        line = one_line(res.err)
        assert f"attempt 1 of adapter 'slow' is still running (pid {pid})" in line
        assert "killed at its timeout only if the drover that started it lives" in line
        assert len((isolated / "sleeper.runs").read_text().splitlines()) == 1  # no second copy
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), what="the adapter gone")
    again = cli("retry", msg_id, "--json")
    assert again.code == 0, again.out
    # Attempt 2: the killed drover recorded no outcome, but the run it started is counted.
    assert [line.split()[1] for line in (isolated / "sleeper.runs").read_text().splitlines()] == ["1", "2"]
    state = isolated / "home" / "adapter-runs" / f"{msg_id}.json"
    assert state.stat().st_mode & 0o777 == 0o600


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_adapter_dies_with_a_drover_killed_mid_send(cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pid, msg_id = _drover_killed_mid_send(isolated, monkeypatch, "")
    wait_for(lambda: not alive(pid), what="the adapter killed with its drover")
    again = cli("retry", msg_id, "--json")
    assert again.code == 0, again.out
    assert [line.split()[1] for line in (isolated / "sleeper.runs").read_text().splitlines()] == ["1", "2"]


def test_a_retry_to_an_adapter_since_removed_is_unknown_endpoint(
    cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet(isolated, monkeypatch, {"old": {"command": "/bin/false"}})
    msg_id = cli("send", "adapter:old", "hello", "--json").json()["data"]["id"]
    fleet(isolated, monkeypatch, {"new": {"command": "/bin/true"}})
    res = cli("retry", msg_id)
    assert res.code == 6, res.out + res.err
    line = one_line(res.err)
    assert "no adapter 'old' in the fleet" in line and "the fleet's adapters: new" in line


def test_verify_says_an_adapter(cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet(isolated, monkeypatch, {"gw": {"command": "/bin/false"}})
    msg_id = cli("send", "adapter:gw", "hello", "--json").json()["data"]["id"]
    res = cli("verify", msg_id, "--json")
    assert "an adapter keeps no record" in res.out and "a adapter" not in res.out


@pytest.mark.parametrize(("code", "word"), [(3, "held"), (4, "refused")])
def test_a_retry_of_what_the_adapter_decided_runs_nothing(
    cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch, code: int, word: str
) -> None:
    out = isolated / "runs"
    fleet(isolated, monkeypatch, {"gw": {"command": "/bin/sh", "args": ["-c", f"echo x >> {out}; exit {code}"]}})
    msg_id = cli("send", "adapter:gw", "hello", "--json").json()["data"]["id"]
    res = cli("retry", msg_id)
    assert res.code == 4, res.out + res.err
    assert f"the adapter {word} it: the receiver decided" in one_line(res.err)
    assert out.read_text().splitlines() == ["x"]


def test_an_actor_with_a_control_character_is_refused(cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = isolated / "runs"
    fleet(isolated, monkeypatch, {"gw": {"command": "/bin/sh", "args": ["-c", f"echo x >> {out}"]}})
    res = cli("send", "adapter:gw", "hello", "--actor", "me\nforged line")
    assert res.code == 2, res.out + res.err
    assert "holds a control character" in one_line(res.err)
    assert not out.exists()


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a script's `cmd &` starts it


@pytest.mark.parametrize(
    ("sig", "sigint_ignored", "times"),
    [
        (signal.SIGTERM, False, 1),
        (signal.SIGHUP, False, 1),
        (signal.SIGTERM, True, 1),
        (signal.SIGTERM, True, 2),
        (signal.SIGTERM, True, "late"),
    ],
    ids=["sigterm", "sighup", "sigterm-sigint-ignored", "sigterm-twice", "sigterm-again-while-exiting"],
)
def test_drover_terminated_mid_send_records_it_and_kills_the_adapters_group(
    cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals, sigint_ignored: bool, times: int | str
) -> None:
    """`kill` (or a closed terminal) while the adapter runs is Ctrl-C: exit 130, `interrupted` recorded, and the
    adapter's whole group killed by drover itself (the death signal is unbound here: it is not what does it) --
    also in a background job, whose SIGINT is ignored, and for a second signal on the first's heels."""
    import subprocess

    pids = isolated / "pids"
    hang = f"cat >/dev/null; sleep 600 & echo $$ $! > {pids}.tmp; mv {pids}.tmp {pids}; wait"
    fleet(isolated, monkeypatch, {"hang": {"command": "/bin/sh", "args": ["-c", hang], "timeout": 600}})
    unbound = "import drover.adapters as a; a._die_with_parent = lambda p: None"
    code = f"{unbound}\nimport sys\nfrom drover.cli.main import main\nsys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "send", "adapter:hang", "hi"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_ignore_sigint if sigint_ignored else None,
    )
    shell = child = 0
    try:
        wait_for(pids.exists, what="the adapter started")
        shell, child = (int(p) for p in pids.read_text().split())
        if times == "late":  # the second once drover said it was interrupted: on its way out, it still exits 130
            proc.send_signal(sig)
            assert proc.stderr is not None
            first = proc.stderr.readline()
            proc.send_signal(sig)
            _out, rest = proc.communicate(timeout=60)
            err = first + rest
        else:
            for _ in range(int(times)):
                proc.send_signal(sig)
            _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert b"Traceback" not in err and b"interrupted" in err
        wait_for(lambda: not alive(shell) and not alive(child), what="the adapter and its child gone")
        msg_id = last_message(cli)["id"]
        (recorded,) = truth_outcomes(isolated / "home", msg_id)
        assert (recorded["code"], recorded["indeterminate"]) == ("interrupted", True)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in (shell, child):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.mark.slow  # waits out a timeout on the clock
def test_timeout_stands_for_the_adapters_own(cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet(isolated, monkeypatch, {"slow": {"command": "/bin/sh", "args": ["-c", "cat >/dev/null; sleep 600"], "timeout": 600}})
    res = cli("send", "adapter:slow", "hello", "--timeout", "1", "--json")
    assert res.code == 5, res.out
    data = res.json()["data"]
    assert data["code"] == "adapter_timeout" and "its timeout of 1s" in data["detail"]


# In the drover that runs it: its pipes get all the time in the world, and a file says when drover saw it exit.
DECIDED_PRELUDE = """
import drover.adapters as a
a._die_with_parent = lambda p: None
a.PIPE_GRACE_S = 600
_real = a._exited
async def _exited(proc, seconds):
    done = await _real(proc, seconds)
    if done:
        open({mark!r}, "w").close()
    return done
a._exited = _exited
"""


def test_stopped_after_the_adapter_exited_records_what_it_decided(
    cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM while drover still reads the pipes of an adapter that has exited 0 (a process it left holds them):
    the record says delivered, not interrupted, so `retry` does not run it a second time."""
    import subprocess

    mark, pids, runs = isolated / "exited", isolated / "pids", isolated / "runs"
    body = f"cat >/dev/null; echo run >> {runs}; setsid sleep 600 & echo $! > {pids}; echo took it"
    fleet(isolated, monkeypatch, {"gw": {"command": "/bin/sh", "args": ["-c", body], "timeout": 600}})
    code = DECIDED_PRELUDE.format(mark=str(mark)) + "import sys\nfrom drover.cli.main import main\nsys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "send", "adapter:gw", "hi"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        wait_for(mark.exists, what="drover saw the adapter exit")
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and b"Traceback" not in err, err
        msg_id = last_message(cli)["id"]
        (recorded,) = truth_outcomes(isolated / "home", msg_id)
        assert (recorded["outcome"], recorded["exit"], recorded["stdout"]) == ("delivered", 0, "took it\n")
        again = cli("retry", msg_id, "--json")
        assert again.code == 0, again.out
        assert runs.read_text().splitlines() == ["run"]  # not run again
        reply = cli("log", "--json").json()["data"]["messages"][-1]["reply"]
        assert reply["exit"] == 0 and reply["untrusted"] is True
    finally:
        if proc.poll() is None:
            proc.kill()
        if pids.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pids.read_text()), signal.SIGKILL)


def test_the_stderr_tail_is_in_the_logs_reply_and_shows_invisible_characters(
    cli: Cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = "import sys; sys.stdin.read(); sys.stderr.write('bad\\u202egate\\u200b\\n'); sys.exit(5)"
    fleet(isolated, monkeypatch, {"gw": script(isolated, "gw", body)})
    res = cli("send", "adapter:gw", "hello", "--json")
    assert res.code == 5, res.out
    reply = cli("log", "--json").json()["data"]["messages"][-1]["reply"]
    assert reply["stderr_tail"] == "bad[U+202E]gate[U+200B]" and reply["exit"] == 5
