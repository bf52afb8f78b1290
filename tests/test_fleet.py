"""The fleet inventory: where it is found, how it is validated, and `drover fleet show | add | remove`."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from drover import fleet as fleet_mod
from drover.errors import ConfigError, FleetInvalid, UnknownHost
from tests.conftest import ROOT, drover_process


def test_no_file_means_the_builtin_fleet_with_local(isolated: Path) -> None:
    fleet, path = fleet_mod.load()
    assert path is None
    assert fleet.host_names() == ["local"]
    assert fleet.limits.max_chars == 1_048_576 and fleet.defaults.concurrency == 64
    with pytest.raises(UnknownHost, match="known hosts: local"):
        fleet.host("box-a")


def test_search_order(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = isolated / "config" / "drover" / "fleet.toml"
    default.parent.mkdir(parents=True)
    default.write_text('[hosts.from-default]\nssh = "a"\n', encoding="utf-8")
    env = isolated / "env.toml"
    env.write_text('[hosts.from-env]\nssh = "b"\n', encoding="utf-8")
    explicit = isolated / "explicit.toml"
    explicit.write_text('[hosts.from-flag]\nssh = "c"\n', encoding="utf-8")
    assert "from-default" in fleet_mod.load()[0].hosts
    monkeypatch.setenv("DROVER_FLEET", str(env))
    assert "from-env" in fleet_mod.load()[0].hosts
    assert "from-flag" in fleet_mod.load(explicit)[0].hosts


def test_the_example_file_is_valid_and_documents_every_key() -> None:
    text = (ROOT / "fleet.example.toml").read_text(encoding="utf-8")
    fleet = fleet_mod.parse(text, ROOT / "fleet.example.toml")
    assert fleet.hosts
    for model in (fleet_mod.HostConfig, fleet_mod.Limits, fleet_mod.Defaults, fleet_mod.EngineProfile):
        for key in model.model_fields:
            assert f"{key} =" in text, f"fleet.example.toml does not document {model.__name__}.{key}"


def test_every_problem_is_reported_with_its_line(tmp_path: Path) -> None:
    text = "\n".join(
        [
            "[defaults]",
            "concurrency = 0",
            "",
            "[hosts.good]",
            'ssh = "good.example"',
            "",
            "[hosts.bad]",
            "port = 70000",
            'tags = "not-a-list"',
            "",
            "[engines.claude]",
            'dialog = ["(unclosed"]',
        ]
    )
    with pytest.raises(FleetInvalid) as info:
        fleet_mod.parse(text, tmp_path / "fleet.toml")
    problems = info.value.problems
    assert any(p.startswith("fleet.toml:2: defaults.concurrency") for p in problems)
    assert any(p.startswith("fleet.toml:8: hosts.bad.port") for p in problems)
    assert any(p.startswith("fleet.toml:9: hosts.bad.tags") for p in problems)
    assert any(p.startswith("fleet.toml:12: engines.claude.dialog") and "not a valid regular expression" in p for p in problems)
    assert len(problems) == 4


def test_an_engines_live_skip_block_is_two_patterns(tmp_path: Path) -> None:
    ok = fleet_mod.parse('[engines.codex]\nlive_skip_block = ["^head$", "^tail$"]\nplaceholder_faint = false\n', tmp_path / "f")
    assert ok.engines["codex"].overrides() == {"live_skip_block": ["^head$", "^tail$"], "placeholder_faint": False}
    with pytest.raises(FleetInvalid, match="two patterns"):
        fleet_mod.parse('[engines.codex]\nlive_skip_block = ["^head$"]\n', tmp_path / "f")
    with pytest.raises(FleetInvalid, match="not a valid regular expression"):
        fleet_mod.parse('[engines.codex]\nlive_skip_block = ["(", "x"]\n', tmp_path / "f")


def test_host_names_are_checked(tmp_path: Path) -> None:
    with pytest.raises(FleetInvalid, match="no ':'"):
        fleet_mod.parse('[hosts."box:a"]\nssh = "x"\n', tmp_path / "f.toml")
    with pytest.raises(FleetInvalid, match="cannot have an ssh target"):
        fleet_mod.parse('[hosts.local]\nssh = "x"\n', tmp_path / "f.toml")


def test_fleet_add_show_remove(cli: Any, isolated: Path) -> None:
    path = isolated / "config" / "drover" / "fleet.toml"
    res = cli("fleet", "add", "box-a", "--ssh", "a.example", "--user", "dev", "--port", "2222", "--tag", "gpu", "--tag", "eu")
    assert res.code == 0, res.err
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    assert data["hosts"]["box-a"] == {"ssh": "a.example", "user": "dev", "port": 2222, "tags": ["gpu", "eu"]}
    assert cli("fleet", "add", "box-b").code == 0
    again = cli("fleet", "add", "box-a")
    assert again.code == 2 and "already in" in again.err
    shown = cli("fleet", "show")
    assert "box-a" in shown.out and "a.example" in shown.out and "gpu,eu" in shown.out and "local" in shown.out
    js = cli("fleet", "show", "--json").json()
    assert js["op"] == "fleet.show" and js["ok"] is True
    assert js["data"]["path"] == str(path) and js["data"]["hosts"] == ["local", "box-a", "box-b"]
    assert js["data"]["fleet"]["hosts"]["box-b"]["ssh"] == "box-b"
    bad = cli("fleet", "add", "box-c", "--port", "0")
    assert bad.code == 7 and "hosts.box-c.port" in bad.err and "untouched" in bad.err
    assert "box-c" not in path.read_text(encoding="utf-8")
    assert cli("fleet", "remove", "box-a").code == 0
    assert "box-a" not in tomllib.loads(path.read_text(encoding="utf-8"))["hosts"]
    missing = cli("fleet", "remove", "box-a")
    assert missing.code == 6 and "not in" in missing.err


def test_fleet_init_writes_every_key_commented_out_and_never_over_a_fleet(cli: Any, isolated: Path) -> None:
    path = isolated / "config" / "drover" / "fleet.toml"
    res = cli("fleet", "init")
    assert res.code == 0 and str(path) in res.out, res.err
    text = path.read_text(encoding="utf-8")
    # Every key of the shipped example, each one commented out: a valid fleet of just `local`.
    example = (ROOT / "drover" / "fleet.example.toml").read_text(encoding="utf-8")
    settings = [line for line in example.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert settings and all(f"# {line}" in text for line in settings)
    assert fleet_mod.parse(text, path).host_names() == ["local"]
    assert cli("fleet", "show", "--json").json()["data"]["hosts"] == ["local"]
    # Uncommenting a host turns it on.
    path.write_text(text.replace("# [hosts.box-a]", "[hosts.box-a]", 1), encoding="utf-8")
    assert "box-a" in cli("fleet", "show", "--json").json()["data"]["hosts"]
    # Never over an existing file unless asked; the file is left as it was.
    before = path.read_text(encoding="utf-8")
    again = cli("fleet", "init")
    assert again.code == 2 and "exists already" in again.err and "--force" in again.err
    assert path.read_text(encoding="utf-8") == before
    assert cli("fleet", "init", "--force").code == 0 and path.read_text(encoding="utf-8") == text
    printed = cli("fleet", "init", "--print")
    assert printed.code == 0 and printed.out == text


def test_an_unknown_key_points_at_a_command_that_shows_the_keys(cli: Any, isolated: Path, tmp_path: Path) -> None:
    bad = tmp_path / "fleet.toml"
    bad.write_text("[defaults]\nconect_timeout = 3\n", encoding="utf-8")
    with pytest.raises(FleetInvalid) as exc:
        fleet_mod.load(bad)
    assert "`drover fleet init --print`" in str(exc.value.problems)
    assert "connect_timeout" in cli("fleet", "init", "--print").out


def test_the_installed_package_ships_the_example(tmp_path: Path) -> None:
    """A wheel carries fleet.example.toml, so `drover fleet init` works outside a clone."""
    import zipfile

    out = tmp_path / "wheel"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-800:]
    (wheel,) = out.glob("drover-*.whl")
    assert "drover/fleet.example.toml" in zipfile.ZipFile(wheel).namelist()


def test_unreadable_fleet_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        fleet_mod.load(tmp_path / "nope.toml")


COMMENTED = """\
# Our fleet. Edited by hand and by `drover fleet add`: keep this comment.
[defaults]
actor = "coordinator"   # who we are

# the GPU box in Frankfurt
[hosts.box-a]
ssh = "a.example"  # via the VPN
tags = ["gpu"]

# the build box: do not remove without asking Sam
[hosts.box-b]
ssh = "b.example"

[limits]
max_chars = 5000  # short messages only
"""


def test_comments_and_layout_survive_add_and_remove(cli: Any, isolated: Path) -> None:
    path = isolated / "fleet.toml"
    path.write_text(COMMENTED, encoding="utf-8")
    assert cli("--fleet", str(path), "fleet", "add", "box-c", "--ssh", "c.example", "--port", "2200").code == 0
    text = path.read_text(encoding="utf-8")
    # everything that was there is still there, byte for byte, and the new host reads back right
    before_limits, limits = COMMENTED.split("[limits]")
    assert text.startswith(before_limits) and text.endswith("[limits]" + limits)
    assert tomllib.loads(text)["hosts"]["box-c"] == {"ssh": "c.example", "port": 2200}
    assert "\n\n[hosts.box-c]\n" in text and "\n\n[limits]\n" in text  # laid out like its neighbours

    assert cli("fleet", "remove", "box-a", "--fleet", str(path)).code == 0
    text = path.read_text(encoding="utf-8")
    assert "# Our fleet. Edited by hand" in text and "# who we are" in text and "# short messages only" in text
    # the comment above box-a went with it; the comment above box-b still sits above box-b
    assert "GPU box" not in text and "via the VPN" not in text
    assert "# the build box: do not remove without asking Sam\n[hosts.box-b]\n" in text
    assert sorted(tomllib.loads(text)["hosts"]) == ["box-b", "box-c"]


def test_replace_edits_the_host_in_place(cli: Any, isolated: Path) -> None:
    path = isolated / "fleet.toml"
    path.write_text(COMMENTED, encoding="utf-8")
    res = cli("--fleet", str(path), "fleet", "add", "box-a", "--ssh", "a2.example", "--user", "dev", "--replace")
    assert res.code == 0, res.err
    text = path.read_text(encoding="utf-8")
    assert tomllib.loads(text)["hosts"]["box-a"] == {"ssh": "a2.example", "user": "dev"}
    assert "# the GPU box in Frankfurt\n[hosts.box-a]\n" in text and "# the build box" in text


@pytest.mark.parametrize(
    ("layout", "comment_stays"),
    [
        ('hosts = { box-a = { ssh = "a" } }  # all on one line\n', True),
        ('[hosts]\nbox-a = { ssh = "a" }  # inline entries\n', False),
        ('hosts.box-a.ssh = "a"  # dotted keys\n[limits]\nmax_chars = 10\n', False),
        ('[hosts]\nbox-a.ssh = "a"  # dotted under [hosts]\n', False),
    ],
)
def test_other_layouts_are_edited_too(cli: Any, isolated: Path, layout: str, comment_stays: bool) -> None:
    path = isolated / "fleet.toml"
    path.write_text(layout, encoding="utf-8")
    comment = "#" + layout.split("#")[1].split("\n")[0]
    add = cli("--fleet", str(path), "fleet", "add", "box-b", "--tag", "x")
    assert add.code == 0, add.err
    text = path.read_text(encoding="utf-8")
    assert comment in text
    assert tomllib.loads(text)["hosts"] == {"box-a": {"ssh": "a"}, "box-b": {"ssh": "box-b", "tags": ["x"]}}
    assert cli("--fleet", str(path), "fleet", "remove", "box-a").code == 0
    text = path.read_text(encoding="utf-8")
    assert tomllib.loads(text)["hosts"] == {"box-b": {"ssh": "box-b", "tags": ["x"]}}
    assert (comment in text) is comment_stays  # a comment on box-a's own line goes with it, unless the line stays
    if "[limits]" in layout:
        assert tomllib.loads(text)["limits"] == {"max_chars": 10}


def test_concurrent_adds_from_six_processes_all_land(isolated: Path) -> None:
    path = isolated / "config" / "drover" / "fleet.toml"
    path.parent.mkdir(parents=True)
    path.write_text("# shared fleet\n", encoding="utf-8")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "drover", "fleet", "add", f"box-{i}", "--ssh", f"{i}.example"],
            cwd=str(ROOT),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(6)
    ]
    results = [(p.wait(timeout=60), p.communicate()) for p in procs]
    assert all(code == 0 for code, _ in results), results
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# shared fleet\n")
    assert sorted(tomllib.loads(text)["hosts"]) == [f"box-{i}" for i in range(6)]
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []  # no temp file left behind


def test_a_symlinked_fleet_file_is_edited_where_it_points(cli: Any, isolated: Path) -> None:
    real = isolated / "dotfiles" / "fleet.toml"
    real.parent.mkdir()
    real.write_text("# in my dotfiles repo\n", encoding="utf-8")
    real.chmod(0o640)
    link = isolated / "config" / "drover" / "fleet.toml"
    link.parent.mkdir(parents=True)
    link.symlink_to(real)
    assert cli("fleet", "add", "box-a").code == 0
    assert cli("fleet", "add", "box-b").code == 0
    assert cli("fleet", "remove", "box-a").code == 0
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text(encoding="utf-8").startswith("# in my dotfiles repo\n")
    assert list(tomllib.loads(real.read_text(encoding="utf-8"))["hosts"]) == ["box-b"]
    assert stat.S_IMODE(real.stat().st_mode) == 0o640  # the file keeps its mode


def test_a_bad_edit_leaves_the_file_untouched(cli: Any, isolated: Path) -> None:
    path = isolated / "fleet.toml"
    path.write_text(COMMENTED, encoding="utf-8")
    before = path.read_bytes()
    for args in (["box-c", "--port", "70000"], ["bad:name"], ["local"]):
        res = cli("--fleet", str(path), "fleet", "add", *args)
        assert res.code == 7, (args, res.err)
        assert "Traceback" not in res.err and "the file is untouched" in res.err
        assert path.read_bytes() == before
    res = cli("--fleet", str(path), "fleet", "add", "box-c", "--port", "70000", "--json")
    doc = res.json()
    assert res.code == 7 and doc["ok"] is False and doc["errors"][0]["code"] == "fleet_invalid"
    assert any("hosts.box-c.port" in p for p in doc["errors"][0]["problems"])
    assert path.read_bytes() == before


def test_removing_an_unknown_host(cli: Any, isolated: Path) -> None:
    path = isolated / "fleet.toml"
    path.write_text(COMMENTED, encoding="utf-8")
    res = cli("--fleet", str(path), "fleet", "remove", "box-z")
    assert res.code == 6 and "host 'box-z' is not in" in res.err and "box-a, box-b" in res.err
    assert path.read_text(encoding="utf-8") == COMMENTED
    assert cli("fleet", "remove", "box-z").code == 6  # no fleet file at all: nothing to remove either


def test_fleet_ops_answer_the_standard_document(cli: Any, isolated: Path) -> None:
    path = isolated / "config" / "drover" / "fleet.toml"
    res = cli("op", "fleet.add", '{"name": "box-a", "tags": ["gpu"], "accept_new": true}')
    assert res.code == 0, res.err
    doc = res.json()
    assert list(doc) == ["drover", "op", "ok", "data", "errors"] and doc["ok"] is True
    assert doc["data"]["created"] is True and doc["data"]["path"] == str(path)
    assert doc["data"]["entry"] == {"ssh": "box-a", "tags": ["gpu"], "accept_new": True}
    shown = cli("op", "fleet.show").json()["data"]
    assert shown["hosts"] == ["local", "box-a"] and shown["fleet"]["hosts"]["box-a"]["accept_new"] is True
    assert cli("op", "fleet.remove", '{"name": "box-a"}').json()["data"]["hosts"] == ["local"]
    assert cli("op", "fleet.add", '{"name": "box-a", "prot": 22}').code == 2  # a misspelt field is not ignored


def test_a_fleet_file_that_is_not_utf8(cli: Any, isolated: Path) -> None:
    path = isolated / "config" / "drover" / "fleet.toml"
    path.parent.mkdir(parents=True)
    path.write_bytes(b'[hosts.box-a]\nssh = "caf\xe9"\n')
    for args in (["ls"], ["send", "box-a:x", "hi"], ["fleet", "show"], ["fleet", "add", "box-b"], ["status", "%1"]):
        res = cli(*args)
        assert res.code == 7, (args, res.err)
        lines = [line for line in res.err.splitlines() if line.strip()]
        assert len(lines) == 1 and "fleet.toml:2: not valid UTF-8" in lines[0], res.err
    assert drover_process("ls").code == 7


class NoisyTransport:
    """A transport whose login shell printed something before the helper's answer (what ssh.py notices)."""

    host = "local"

    def __init__(self) -> None:
        self.warnings: list[str] = []

    async def call(self, op: str, args: dict[str, Any], *, timeout: float) -> Any:
        self.warnings.append("the login shell printed 6 bytes before the helper's answer: b'hello\\n'")
        return {"python": "3.11.2", "tmux": "tmux 3.3a", "engines": {}, "user": "dev", "warnings": []}

    async def close(self) -> None:
        pass


def test_fleet_check_shows_the_shell_step_and_the_warnings(cli: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from drover.cli import render
    from drover.ops import Context, run

    ctx = Context()
    ctx._transports["local"] = NoisyTransport()
    doc = run("fleet.check", {}, ctx)
    assert doc.exit_code == 0, doc.errors
    (row,) = doc.data["hosts"]
    assert row["shell"] is True and row["warnings"] == ["the login shell printed 6 bytes before the helper's answer: b'hello\\n'"]
    capsys.readouterr()
    render.fleet_check(render.clean(doc.data))
    out, err = capsys.readouterr()
    header = out.splitlines()[0].split()
    assert header[:6] == ["HOST", "REACH", "KEY", "AUTH", "SHELL", "PYTHON"], header
    assert out.splitlines()[1].split()[:6] == ["local", "yes", "yes", "yes", "yes", "3.11.2"]
    assert "warning: local: the login shell printed 6 bytes" in err
    # a host whose login shell failed: SHELL is NO, PYTHON was never reached
    failed = {
        "hosts": [
            {
                "host": "box-a",
                "ok": False,
                "reachable": True,
                "host_key": True,
                "auth": True,
                "shell": False,
                "python": None,
                "error": {"code": "shell_failed", "message": "the login shell failed"},
            }
        ]
    }
    render.fleet_check(failed)
    out, err = capsys.readouterr()
    assert out.splitlines()[1].split()[:6] == ["box-a", "yes", "yes", "yes", "NO", "-"]


@pytest.mark.parametrize(
    "body, where, words",
    [
        # A duration past any clock: every later `drover nudge run` crashed on it.
        ('[[nudge]]\ntarget = "a:b"\ntext = "x"\nevery = "999999999999d"\n', "fleet.toml:4: nudge.0.every", "at most 366d"),
        (
            '[[nudge]]\ntarget = "a:b"\ntext = "x"\nevery = "1h"\nretry = "1' + "0" * 400 + 's"\n',
            "fleet.toml:5: nudge.0.retry",
            "366d",
        ),
        ("[defaults]\nsettle_s = 1e12\n", "fleet.toml:2: defaults.settle_s", "less than or equal"),
        ("[defaults]\ndaemon_idle_s = inf\n", "fleet.toml:2: defaults.daemon_idle_s", "less than or equal"),
        ("[limits]\nduplicate_window_s = 1e300\n", "fleet.toml:2: limits.duplicate_window_s", "less than or equal"),
        ("[hosts.a]\nconnect_timeout = inf\n", "fleet.toml:2: hosts.a.connect_timeout", "less than or equal"),
        ("[hosts.a]\nrequest_timeout = 4e7\n", "fleet.toml:2: hosts.a.request_timeout", "less than or equal"),
        # A relative trusted folder resolved against drover's own directory: from /, every folder was pre-trusted.
        ('[hosts.a]\ntrusted = [""]\n', "fleet.toml:2: hosts.a.trusted", "not an absolute path"),
        ('[hosts.a]\ntrusted = ["/ok", "relative"]\n', "fleet.toml:2: hosts.a.trusted", "'relative' is not an absolute"),
        ('[hosts.a]\ntrusted = ["~user/x"]\n', "fleet.toml:2: hosts.a.trusted", "not an absolute path"),
        ('[hosts.a]\ntrusted = ["/w/nl\\ndir"]\n', "fleet.toml:2: hosts.a.trusted", "control character"),
        (
            '[[nudge]]\ntarget = "a:b"\ntext = "x"\nevery = "1h"\ncreate_if_missing = true\nengine = "claude"\ncwd = "webapp"\n',
            "fleet.toml:7: nudge.0.cwd",
            "not an absolute path",
        ),
        # `$` matches before a final newline: these passed as valid names and paths.
        ('[hosts."box\\n"]\nssh = "a"\n', "hosts", "host name 'box\\n'"),
        ('[hosts.a]\npython = "python3\\n"\n', "fleet.toml:2: hosts.a.python", "only letters"),
        ('[hosts.a]\nspawn_server = "srv\\n"\n', "fleet.toml:2: hosts.a.spawn_server", "pattern"),
    ],
)
def test_values_past_what_drover_can_use_are_refused_with_their_line(tmp_path: Path, body: str, where: str, words: str) -> None:
    with pytest.raises(FleetInvalid) as info:
        fleet_mod.parse(body, tmp_path / "fleet.toml")
    assert len(info.value.problems) == 1, info.value.problems
    assert where in info.value.problems[0] and words in info.value.problems[0], info.value.problems


def test_the_longest_durations_and_home_relative_folders_are_still_fine(tmp_path: Path) -> None:
    body = (
        '[defaults]\nrequest_timeout = 31622400\n[hosts.a]\ntrusted = ["/", "~", "~/work"]\n'
        '[[nudge]]\ntarget = "a:b"\ntext = "x"\nevery = "366d"\nretry = "365d23h59m60s"\n'
        'create_if_missing = true\nengine = "claude"\ncwd = "~/webapp"\n'
    )
    fleet = fleet_mod.parse(body, tmp_path / "fleet.toml")
    assert fleet.hosts["a"].trusted == ["/", "~", "~/work"] and fleet.nudge[0].cwd == "~/webapp"
    assert fleet_mod.duration_s(fleet.nudge[0].every) == fleet_mod.MAX_DURATION_S


def test_a_nudge_entry_naming_an_engine_drover_cannot_start_is_refused(tmp_path: Path) -> None:
    entry = '[[nudge]]\ntarget = "a:{n}"\ntext = "x"\nevery = "1h"\ncreate_if_missing = true\nengine = "{e}"\ncwd = "/w"\n'
    body = entry.format(n="ok", e="codex") + entry.format(n="typo", e="cluade")
    with pytest.raises(FleetInvalid) as info:
        fleet_mod.parse(body, tmp_path / "fleet.toml")
    [problem] = info.value.problems
    assert "[[nudge]] entry 2 ('a:typo'): engine 'cluade' is not one drover spawn can start: claude, codex" in problem
    # An engine of the fleet's own is one it can start.
    fleet = fleet_mod.parse('[spawn.cluade]\ncommand = "cluade"\n' + body, tmp_path / "fleet.toml")
    assert [e.engine for e in fleet.nudge] == ["codex", "cluade"]
