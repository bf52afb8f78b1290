"""drover/paths.py, the one home for drover's paths and its duration grammar (issue 17): the home, the fleet file
and the daemon's files are derived there only, and every duration -- the fleet's `every`, `log --since` -- is
read by the same grammar."""

from __future__ import annotations

import ast
import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import drover
from drover import fleet as fleet_mod
from drover import paths
from drover.daemon import autostart
from drover.errors import InvalidRequest
from drover.ops.messages import since_ts
from drover.transport.host_keys import drover_known_hosts
from drover.truth import default_home
from tests.conftest import ROOT
from tests.support.sources import tree

# -- the duration grammar ----------------------------------------------------------------------------------------
ACCEPTED = [
    ("90s", 90.0),
    ("15m", 900.0),
    ("1h", 3600.0),
    ("2d", 172800.0),
    ("1h30m", 5400.0),  # the fleet took it; `log --since` refused it
    ("1h 30m", 5400.0),
    (" 1 h 30 m ", 5400.0),
    ("1H30M", 5400.0),  # the fleet took any case; `log --since` refused it
    ("1.5h", 5400.0),
    ("1d2h3m4s", 93784.0),
    ("90", 90.0),  # plain seconds, as --timeout takes them
    ("2.5", 2.5),
    ("0s", 0.0),  # `read --since 0s` is now: the grammar parses it, each use bounds it
    ("0", 0.0),
]
REJECTED = [
    "",
    "   ",
    "m",
    "h1",
    "15 minutes",
    "-5m",
    "+5m",
    "1h30",
    "1w",
    ".5m",
    "1.h",
    "1,5h",
    "1e3",
    "inf",
    "nan",
    "1h-30m",
    "yesterday",
    "10 m s",
    "1h\x00",
]


@pytest.mark.parametrize(("text", "seconds"), ACCEPTED)
def test_the_one_grammar_accepts_every_form_any_old_parser_took(text: str, seconds: float) -> None:
    assert paths.parse_duration(text) == seconds


@pytest.mark.parametrize("text", REJECTED)
def test_garbage_is_refused_with_one_message(text: str) -> None:
    with pytest.raises(ValueError) as info:
        paths.parse_duration(text)
    assert str(info.value) == f"{text!r} is not a duration: write it like 90s, 15m, 1h30m, 2d or a number of seconds"
    with pytest.raises(ValueError, match="is not a duration"):
        paths.duration_s(text)


def test_a_bounded_duration_is_above_zero_and_at_most_366_days() -> None:
    assert paths.duration_s("1h30m") == 5400.0 and paths.duration_s("90") == 90.0
    assert paths.duration_s("366d") == paths.MAX_DURATION_S
    for zero in ("0s", "0", "0h0m"):
        with pytest.raises(ValueError, match="no time at all"):
            paths.duration_s(zero)
    for long in ("366d1s", "9" * 400, "1" + "0" * 400 + "s"):
        with pytest.raises(ValueError, match="at most 366d"):
            paths.duration_s(long)


def test_the_fleet_and_log_since_read_durations_alike(tmp_path: Path) -> None:
    body = '[[nudge]]\ntarget = "local:b"\ntext = "x"\nevery = "{}"\n'
    for text, seconds in ACCEPTED:
        if seconds == 0:
            continue
        fleet = fleet_mod.parse(body.format(text), tmp_path / "fleet.toml")  # a plain "90" was refused here
        assert fleet_mod.duration_s(fleet.nudge[0].every) == seconds
        before = time.time()
        cutoff = since_ts(text)
        assert before - seconds <= cutoff <= time.time() - seconds
    for text in REJECTED:
        with pytest.raises(InvalidRequest, match="neither a duration"):
            since_ts(text)


def test_every_length_of_time_in_the_fleet_file_takes_the_grammar(tmp_path: Path) -> None:
    """A hostile tester's finding: `every`/`retry` took "90s" while `connect_timeout`, `settle_s`, ... refused it,
    and `every = 90` (a number) was refused while `every = "90"` was taken."""
    text = """[defaults]
connect_timeout = "1m30s"
request_timeout = 45
settle_s = "2s"
receipt_wait_s = "1.5"
daemon_idle_s = "10m"

[limits]
duplicate_window_s = "1m"

[hosts.box]
ssh = "box"
connect_timeout = "20s"

[engines.claude]
paste_hold_s = "0.5s"

[spawn.claude]
command = "claude"
ready_timeout_s = "2m"

[[nudge]]
target = "local:b"
text = "x"
every = 90
retry = 30
"""
    fleet = fleet_mod.parse(text, tmp_path / "fleet.toml")
    d = fleet.defaults
    assert (d.connect_timeout, d.request_timeout, d.settle_s, d.receipt_wait_s) == (90.0, 45.0, 2.0, 1.5)
    assert (fleet.limits.duplicate_window_s, d.daemon_idle_s) == (60.0, 600.0)
    assert fleet.hosts["box"].connect_timeout == 20.0
    assert fleet.engines["claude"].paste_hold_s == 0.5
    assert fleet.spawn["claude"].ready_timeout_s == 120.0
    assert (fleet_mod.duration_s(fleet.nudge[0].every), fleet_mod.duration_s(fleet.nudge[0].retry)) == (90.0, 30.0)
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    assert autostart.fleet_idle(["--fleet", str(path), "ls"]) == 600.0
    for bad in ('"soon"', '"-5s"', "true", '"90 s later"'):
        with pytest.raises(fleet_mod.FleetInvalid):
            fleet_mod.parse(f"[defaults]\nconnect_timeout = {bad}\n", tmp_path / "fleet.toml")


@pytest.mark.parametrize("text", ["١٠m", "１０m", "١٠"])
def test_only_ascii_digits_make_a_duration(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        paths.parse_duration(text)


def test_since_takes_an_iso_time_before_a_number_of_seconds() -> None:
    # A bare 20200101 was an ISO date before plain seconds were a duration; it stays one.
    assert since_ts("20200101") == datetime(2020, 1, 1).timestamp()
    assert since_ts("2020-01-01T00:00:00Z") == datetime.fromisoformat("2020-01-01T00:00:00+00:00").timestamp()
    before = time.time()
    assert before - 3600 <= since_ts("3600") <= time.time() - 3600
    before = time.time()
    assert before <= since_ts("0s") <= time.time()  # `read --since 0s`: from now on


def _accepted(ts: float, text: str) -> dict[str, Any]:
    msg_id = f"msg_{int(ts * 1000):012x}{text.encode().hex()[:10]:0>10}"
    return {
        "v": 1,
        "event": "accepted",
        "id": msg_id,
        "time": drover.truth.now_iso(ts),
        "ts": ts,
        "actor": "alice",
        "host": "local",
        "target": "t",
        "text_chars": len(text),
        "text": text,
        "options": {},
    }


def test_log_since_1h30m_is_accepted_and_filters(isolated: Path, cli: Any) -> None:
    now = time.time()
    events = [_accepted(now - 3 * 3600, "three hours"), _accepted(now - 2 * 3600, "two hours"), _accepted(now - 3600, "one hour")]
    home = isolated / "home"
    home.mkdir(mode=0o700)
    (home / "truth.jsonl").write_text("".join(json.dumps(ev) + "\n" for ev in events), encoding="utf-8")
    os.chmod(home / "truth.jsonl", 0o600)

    def texts(since: str) -> list[str]:
        res = cli("log", "--json", "--since", since)
        assert res.code == 0, res.err
        return [m["text"] for m in res.json()["data"]["messages"]]

    assert texts("1h30m") == ["one hour"]
    assert texts("2h 30m") == ["two hours", "one hour"]
    assert texts("1H30M") == ["one hour"]
    assert texts("5400") == ["one hour"]
    assert texts("4h") == ["three hours", "two hours", "one hour"]
    res = cli("log", "--since", "1h30")
    assert res.code == 2 and "neither a duration (90s, 15m, 1h30m, 2d or a number of seconds)" in res.err


# -- the paths -----------------------------------------------------------------------------------------------------
def test_the_home_the_config_and_the_fleet_come_from_one_place(tmp_path: Path) -> None:
    home = str(tmp_path / "u")
    bare = {"HOME": home}
    assert paths.home(bare) == f"{home}/.local/state/drover"
    assert paths.home({**bare, "XDG_STATE_HOME": "/st"}) == "/st/drover"
    assert paths.home({**bare, "XDG_STATE_HOME": "/st", "DROVER_HOME": "/dh"}) == "/dh"
    assert paths.home({"DROVER_HOME": "~/dh"}) == os.path.expanduser("~/dh")
    assert paths.home({**bare, "XDG_STATE_HOME": "", "DROVER_HOME": ""}) == f"{home}/.local/state/drover"  # empty: unset
    assert paths.config_dir(bare) == f"{home}/.config/drover"
    assert paths.default_fleet({**bare, "XDG_CONFIG_HOME": "/cf"}) == "/cf/drover/fleet.toml"
    assert paths.known_hosts({**bare, "XDG_CONFIG_HOME": "/cf"}) == "/cf/drover/known_hosts"
    assert paths.named_fleet(bare) is None and paths.named_fleet({**bare, "DROVER_FLEET": ""}) is None
    assert paths.fleet_file({**bare, "DROVER_FLEET": "rel.toml"}) == "rel.toml"  # relative to the caller's cwd
    assert paths.fleet_file({**bare, "XDG_CONFIG_HOME": ""}) == f"{home}/.config/drover/fleet.toml"
    for off in ("0", "off", "no", "false"):
        assert not paths.daemon_enabled({"DROVER_DAEMON": off})
    assert paths.daemon_enabled({}) and paths.daemon_enabled({"DROVER_DAEMON": "1"})


def test_every_consumer_finds_the_same_files(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's guess at a command's fleet file, the fleet loader, the truth file, the front's help cache and
    the known_hosts file all follow the same variables (they were derived separately)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(isolated / "cfg"))
    assert autostart.fleet_of([]) == str(fleet_mod.find_path()[0]) == str(isolated / "cfg" / "drover" / "fleet.toml")
    assert str(drover_known_hosts()) == str(isolated / "cfg" / "drover" / "known_hosts")
    monkeypatch.setenv("DROVER_FLEET", str(isolated / "named.toml"))
    assert autostart.fleet_of([]) == str(fleet_mod.find_path()[0]) == str(isolated / "named.toml")
    assert autostart.fleet_of(["--fleet", "x.toml"]) == "x.toml"
    from drover import front

    assert front._home() == str(default_home()) == str(isolated / "home")
    monkeypatch.delenv("DROVER_HOME")
    monkeypatch.setenv("XDG_STATE_HOME", str(isolated / "state"))
    assert front._home() == str(default_home()) == str(isolated / "state" / "drover")


def test_the_daemons_files_sit_beside_its_socket() -> None:
    sock = paths.socket_path()
    assert os.path.basename(sock).startswith("d-") and sock.endswith(".sock")
    assert paths.daemon_lock(sock) == sock[:-5] + ".lock" and paths.daemon_log(sock) == sock[:-5] + ".log"


def test_a_daemons_identity_names_the_drover_package_itself() -> None:
    # Moved from drover/daemon/paths.py, one folder up: the checkout a daemon runs must still be drover/ itself.
    assert paths.identity({})[""].split("\0")[2] == os.path.dirname(os.path.abspath(drover.__file__))


# -- nobody else reads the variables -------------------------------------------------------------------------------
OWNED = ("DROVER_HOME", "DROVER_FLEET", "DROVER_DAEMON")


def env_reads(source: str | ast.AST) -> list[str]:
    """The variables paths.py owns that `source` names as a whole string (os.environ.get("XDG_..."), env[...],
    os.getenv, "DROVER_HOME" in os.environ): any such string is a derivation of drover's paths outside paths.py."""
    return [
        node.value
        for node in ast.walk(ast.parse(source) if isinstance(source, str) else source)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value in OWNED or node.value.startswith("XDG_"))
    ]


def test_the_check_catches_a_new_reader() -> None:
    assert env_reads('import os\nh = os.environ.get("DROVER_HOME") or "x"\n') == ["DROVER_HOME"]
    assert env_reads('import os\nb = os.getenv("XDG_STATE_HOME", "")\n') == ["XDG_STATE_HOME"]
    assert env_reads('import os\nf = os.environ["DROVER_FLEET"]\n') == ["DROVER_FLEET"]
    assert env_reads('import os\nd = os.environ.get("DROVER_DAEMON", "") != "0"\n') == ["DROVER_DAEMON"]
    assert env_reads('import os\ni = os.environ.get("DROVER_DAEMON_IDLE_S")\n') == []  # another variable
    assert env_reads('"""Set DROVER_HOME or XDG_STATE_HOME."""\nhint = "point DROVER_HOME elsewhere"\n') == []


def test_no_module_but_paths_reads_the_home_and_fleet_variables() -> None:
    package = ROOT / "drover"
    readers = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel == "paths.py" or rel.startswith("remote/"):  # the remote side runs on the host, in its own env
            continue
        found = env_reads(tree(path))
        if found:
            readers[rel] = found
    assert readers == {}, f"derive these through drover/paths.py: {readers}"


def daemon_file_names(source: str | ast.AST) -> list[str]:
    """The daemon's file names `source` spells out: its socket's suffix, or a lock or log named by its suffix alone
    (path[:-5] + ".lock", f"{path[:-5]}.log"), which only paths.daemon_lock and paths.daemon_log may derive."""
    return [
        node.value
        for node in ast.walk(ast.parse(source) if isinstance(source, str) else source)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (".sock" in node.value or node.value.startswith((".lock", ".log")))
    ]


def test_the_daemon_file_check_catches_a_new_derivation() -> None:
    assert sorted(daemon_file_names('fd = open(path[: -len(".sock")] + ".lock")\n')) == [".lock", ".sock"]
    assert daemon_file_names('msg = f"see {path[:-5]}.log"\n') == [".log"]
    assert daemon_file_names('lock = "nudge-run.lock"\nlog = "the .lock of the truth file"\n') == []


def test_no_module_of_the_daemon_derives_its_files() -> None:
    package = ROOT / "drover"
    sources = [*sorted((package / "daemon").glob("*.py")), *sorted((package / "cli").glob("*.py")), package / "front.py"]
    found = {p.relative_to(package).as_posix(): daemon_file_names(tree(p)) for p in sources}
    assert {rel: names for rel, names in found.items() if names} == {}, "derive these through drover/paths.py"
