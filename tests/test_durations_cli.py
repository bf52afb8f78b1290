"""Every duration the command line takes reads drover's one grammar (drover/paths.py, issue 17): --timeout (the
shared option and wait's, wait-file's), nudge --wait, daemon start --idle, the daemon's own --idle and
$DROVER_DAEMON_IDLE_S.  Plain numbers of seconds still work; anything else is a usage error (exit 2, as typer's
own for a number that was not one) with the grammar's one message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer

from drover import paths
from drover.daemon import autostart, server

GRAMMAR = "is not a duration: write it like 90s, 15m, 1h30m, 2d or a number of seconds"


@pytest.fixture
def calls(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any, Any]]:
    """The op each command runs, with its payload and the Context's per-host timeout, instead of running it."""
    import drover.ops.core  # the CLI's run (drover/cli/app.py) calls the core's, after loading only its op

    seen: list[tuple[str, Any, Any]] = []

    def run(name: str, payload: Any, ctx: Any) -> Any:
        seen.append((name, payload, ctx.timeout_s))
        raise typer.Exit(0)

    monkeypatch.setattr(drover.ops.core, "run", run)
    return seen


@pytest.mark.parametrize(
    "args",
    [
        ("ls",),
        ("status", "local:x"),
        ("send", "local:x", "hi"),
        ("read", "local:x"),
        ("fleet", "check"),
        ("broadcast", "hi", "--all"),
    ],
)
def test_the_shared_timeout_takes_the_grammar(calls: list[tuple[str, Any, Any]], cli: Any, args: tuple[str, ...]) -> None:
    res = cli(*args, "--timeout", "1m30s")
    assert res.code == 0, res.err
    assert [timeout for _, _, timeout in calls] == [90.0]
    calls.clear()
    res = cli(*args, "--timeout", "45")  # a plain number of seconds, as before
    assert res.code == 0, res.err
    assert [timeout for _, _, timeout in calls] == [45.0]


@pytest.mark.parametrize(
    ("args", "op", "field"),
    [
        (("wait", "local:x"), "sessions.wait", "timeout_s"),
        (("wait-file", "local", "/tmp/x"), "files.wait", "timeout_s"),
        (("nudge", "run", "--wait"), "nudge.run", "lock_wait_s"),
    ],
)
def test_how_long_a_command_waits_takes_the_grammar(
    calls: list[tuple[str, Any, Any]], cli: Any, args: tuple[str, ...], op: str, field: str
) -> None:
    flag = () if args[-1] == "--wait" else ("--timeout",)
    res = cli(*args, *flag, "1h 30m")
    assert res.code == 0, res.err
    assert [(name, payload[field]) for name, payload, _ in calls] == [(op, 5400.0)]
    calls.clear()
    assert cli(*args, *flag, "2.5").code == 0
    assert [payload[field] for _, payload, _ in calls] == [2.5]


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("ls",), "--timeout"),
        (("status", "local:x"), "--timeout"),
        (("fleet", "check"), "--timeout"),
        (("wait", "local:x"), "--timeout"),
        (("wait-file", "local", "/tmp/x"), "--timeout"),
        (("nudge", "run"), "--wait"),
        (("daemon", "start"), "--idle"),
    ],
)
@pytest.mark.parametrize("garbage", ["10 minutes", "1h30", "-5m", "inf", "1e3", "soon"])
def test_garbage_is_a_usage_error_with_the_grammars_message(
    calls: list[tuple[str, Any, Any]], cli: Any, args: tuple[str, ...], flag: str, garbage: str
) -> None:
    res = cli(*args, flag, garbage)
    assert res.code == 2, res
    assert f"Invalid value for '{flag}': {garbage!r} {GRAMMAR}" in res.err
    assert calls == []


def test_a_duration_out_of_range_is_refused_as_before(calls: list[tuple[str, Any, Any]], cli: Any) -> None:
    for value in ("0s", "0", "367d", "9" * 400):
        res = cli("ls", "--timeout", value)
        assert res.code == 2 and "give a duration above zero and at most 366d" in res.err, res
    for value in ("0s", "367d"):
        res = cli("daemon", "start", "--idle", value)
        assert res.code == 2 and "--idle must be above zero and at most 366d" in res.err, res
    assert calls == []


def test_daemon_start_hands_its_idle_to_the_daemon(isolated: Path, monkeypatch: pytest.MonkeyPatch, cli: Any) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(isolated))
    started: list[float | None] = []

    def spawn(path: str, idle: float | None = None) -> int:
        started.append(idle)
        raise typer.Exit(0)

    monkeypatch.setattr(autostart, "spawn", spawn)
    assert cli("daemon", "start", "--idle", "30m").code == 0
    assert cli("daemon", "start", "--idle", "1800").code == 0
    assert started == [1800.0, 1800.0]


def test_the_help_shows_the_forms(cli: Any) -> None:
    for args in (("ls",), ("wait",), ("wait-file",), ("nudge",), ("daemon", "start")):
        res = cli(*args, "--help")
        assert res.code == 0 and "DURATION" in res.out and "1h30m" in res.out, (args, res.out)


# -- the daemon's own --idle and DROVER_DAEMON_IDLE_S --------------------------------------------------------------
def test_the_daemon_reads_its_idle_by_the_grammar(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        server.main(["--socket", "/nonexistent/d.sock", "--idle", "10 minutes"], lambda argv, env: 0)
    assert info.value.code == 2
    assert f"argument --idle: '10 minutes' {GRAMMAR}" in capsys.readouterr().err
    monkeypatch.setenv("DROVER_DAEMON_IDLE_S", "10m")
    assert server.idle_setting(None) == 600.0
    monkeypatch.setenv("DROVER_DAEMON_IDLE_S", "90")
    assert server.idle_setting(None) == 90.0
    assert server.idle_setting(5.0) == 5.0


def test_garbage_in_the_idle_variable_is_as_if_unset(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DROVER_DAEMON_IDLE_S", "")
    unset = server.idle_setting(None)
    for garbage in ("soon", "10 minutes", "inf", "nan", "-5"):
        monkeypatch.setenv("DROVER_DAEMON_IDLE_S", garbage)
        assert server.idle_setting(None) == unset


@pytest.mark.parametrize("seconds", [600.0, 1800.5, 1e-05, 0.1, paths.MAX_DURATION_S])
def test_the_idle_a_daemon_is_handed_reads_back(seconds: float) -> None:
    # `--idle 1e-05` was a float for argparse; the grammar reads no exponent, so it is written out.
    assert paths.parse_duration(paths.seconds_text(seconds)) == seconds


def test_a_fleet_idle_past_what_drover_takes_is_not_handed_on(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # TOML reads `inf`; the daemon's --idle, read by the grammar, would refuse it and no daemon would start.
    monkeypatch.delenv("DROVER_DAEMON_IDLE_S", raising=False)
    fleet = isolated / "fleet.toml"
    for value, handed in (("1800", 1800.0), ("0.5", 0.5), ("inf", None), ("nan", None), ("0", None), ("31622401", None)):
        fleet.write_text(f"[defaults]\ndaemon_idle_s = {value}\n", encoding="utf-8")
        assert autostart.fleet_idle(["--fleet", str(fleet)]) == handed, value
