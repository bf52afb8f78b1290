"""The fleet file where it should not be: devices, FIFOs, read-only and immutable places, values that cannot work.

Everything here is refused with one line and a documented exit code, with nothing touched: never an internal
error, never a hang, never a device turned into a regular file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import stat
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from drover import fleet as fleet_mod
from drover import fleet_editor
from drover.errors import ConfigError, FleetInvalid
from tests.conftest import ROOT, CliResult, wait_for


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert "Traceback" not in err and "internal error" not in err
    assert lines[0].startswith("drover: ")
    return lines[0]


def _small() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # reading /dev/zero must not take the machine down


def process(*args: str, timeout: float = 30) -> CliResult:
    """`python -m drover ARGS` in its own small process: a hang or a runaway read fails the test, not the suite."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "drover", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=str(ROOT),
            preexec_fn=_small,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"drover {' '.join(args)} hung for {timeout}s")
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def mknod_null(path: Path) -> None:
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError as exc:
        pytest.skip(f"mknod is not permitted here: {exc}")


EVERY_USE = (["fleet", "show"], ["ls"], ["fleet", "add", "a"], ["fleet", "remove", "a"], ["send", "a:x", "hi"])


# -- 1. not a regular file --------------------------------------------------------------------------------------


def test_a_fifo_is_refused_for_reading_and_editing_and_never_read(tmp_path: Path) -> None:
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    link = tmp_path / "link.toml"
    link.symlink_to(fifo)
    for path, uses in ((fifo, EVERY_USE), (link, EVERY_USE[::2])):
        for args in uses:
            res = process(*args, "--fleet", str(path), timeout=20)
            assert res.code == 7, (path, args, res.err)
            assert "not a regular file" in one_line(res.err) and "FIFO" in res.err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "link.toml"]  # no lock file, no temp file


def test_a_character_device_is_refused_and_stays_a_device(cli: Any, tmp_path: Path) -> None:
    dev = tmp_path / "mynull"
    mknod_null(dev)
    for args in EVERY_USE:
        res = cli(*args, "--fleet", str(dev))
        assert res.code == 7, (args, res.err)
        assert "not a regular file" in one_line(res.err) and "character device" in res.err
    res = cli("op", "fleet.add", '{"name": "a"}', "--fleet", str(dev))
    assert res.code == 7 and res.json()["errors"][0]["code"] == "config"
    st = os.stat(dev)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    assert [p.name for p in tmp_path.iterdir()] == ["mynull"]  # nothing created beside it


def test_dev_zero_and_a_directory_are_refused_at_once(cli: Any, tmp_path: Path) -> None:
    started = time.monotonic()
    res = process("fleet", "show", "--fleet", "/dev/zero", timeout=20)
    assert res.code == 7 and "not a regular file" in one_line(res.err)
    assert time.monotonic() - started < 10
    res = cli("fleet", "show", "--fleet", str(tmp_path))
    assert res.code == 7 and "not a regular file (a directory)" in one_line(res.err)
    res = cli("fleet", "add", "a", "--fleet", str(tmp_path))
    assert res.code == 7 and "not a regular file (a directory)" in one_line(res.err)
    assert list(tmp_path.iterdir()) == []


def test_the_library_refuses_a_fifo_too(tmp_path: Path) -> None:
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        fleet_mod.load(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        fleet_editor.edit(fifo, lambda text, p: text)


# -- 2. values that can never work ------------------------------------------------------------------------------


@pytest.mark.parametrize("python", ["/opt/my python/python3", "py'thon", "python3;touch /tmp/pwned", "$HOME/py", "~bob/py", ""])
def test_an_interpreter_path_the_bootstrap_cannot_run_is_refused(cli: Any, isolated: Path, python: str) -> None:
    path = isolated / "fleet.toml"
    path.write_text("# mine\n", encoding="utf-8")
    res = cli("fleet", "add", "sp", "--ssh", "h1", "--python", python, "--fleet", str(path))
    assert res.code == 7, res.err
    assert "hosts.sp.python" in res.err and "the file is untouched" in res.err
    assert path.read_text(encoding="utf-8") == "# mine\n"
    assert not Path("/tmp/pwned").exists()


@pytest.mark.parametrize("python", ["python3", "/usr/bin/python3.11", "~/venv/bin/python3", "/opt/py-3.12+x/bin/python"])
def test_interpreter_paths_the_bootstrap_runs_are_accepted(cli: Any, isolated: Path, python: str) -> None:
    path = isolated / "fleet.toml"
    res = cli("fleet", "add", "sp", "--python", python, "--fleet", str(path))
    assert res.code == 0, res.err
    assert tomllib.loads(path.read_text(encoding="utf-8"))["hosts"]["sp"]["python"] == python


def test_a_user_in_the_ssh_target_is_refused_with_a_hint(cli: Any, isolated: Path) -> None:
    path = isolated / "fleet.toml"
    res = cli("fleet", "add", "box", "--ssh", "dev@box.example", "--fleet", str(path))
    assert res.code == 7 and "hosts.box.ssh" in res.err and "--user" in res.err
    assert not path.exists()


def test_a_hand_written_bad_value_is_reported_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    text = '[hosts.a]\nssh = "a.example"\n\n[hosts.b]\nssh = "dev@b.example"\npython = "/opt/my python/python3"\n'
    with pytest.raises(FleetInvalid) as info:
        fleet_mod.parse(text, path)
    problems = info.value.problems
    assert any(p.startswith("fleet.toml:5: hosts.b.ssh:") and "user" in p for p in problems), problems
    assert any(p.startswith("fleet.toml:6: hosts.b.python:") for p in problems), problems


# -- 3. places that cannot be written ---------------------------------------------------------------------------


def cannot_write(res: CliResult) -> None:
    assert res.code == 7, res.err
    line = one_line(res.err)
    assert "cannot write" in line and "untouched" in line


def test_a_path_under_a_regular_file_and_proc_are_cannot_write(cli: Any, tmp_path: Path) -> None:
    plain = tmp_path / "hostname"
    plain.write_text("box\n", encoding="utf-8")
    cannot_write(cli("fleet", "add", "b", "--fleet", str(plain / "fleet.toml")))
    assert plain.read_text(encoding="utf-8") == "box\n"
    cannot_write(cli("fleet", "add", "b", "--fleet", "/proc/version"))
    res = cli("op", "fleet.add", '{"name": "b"}', "--fleet", "/proc/version")
    doc = res.json()
    assert res.code == 7 and doc["ok"] is False and doc["errors"][0]["code"] == "config"
    assert "cannot write" in doc["errors"][0]["message"]


@contextlib.contextmanager
def read_only_mount(where: Path) -> Iterator[Path]:
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN)")
    try:
        (where / "fleet.toml").write_text('[hosts.a]\nssh = "a.example"\n', encoding="utf-8")
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True, capture_output=True)
        yield where / "fleet.toml"
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)


def test_a_fleet_on_a_read_only_mount(cli: Any, tmp_path: Path) -> None:
    with read_only_mount(tmp_path / "ro") as path:
        cannot_write(cli("fleet", "add", "b", "--fleet", str(path)))
        cannot_write(cli("fleet", "remove", "a", "--fleet", str(path)))
        res = cli("op", "fleet.add", '{"name": "b"}', "--fleet", str(path))
        assert res.code == 7 and "cannot write" in res.json()["errors"][0]["message"]
        assert cli("fleet", "show", "--fleet", str(path)).code == 0  # reading it is fine


def test_an_immutable_fleet_file(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text("# frozen\n", encoding="utf-8")
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
        pytest.skip("chattr +i is not supported here")
    try:
        cannot_write(cli("fleet", "add", "b", "--fleet", str(path)))
        res = cli("op", "fleet.add", '{"name": "b"}', "--fleet", str(path))
        assert res.code == 7 and "cannot write" in res.json()["errors"][0]["message"]
    finally:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    assert path.read_text(encoding="utf-8") == "# frozen\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


# -- 4. the demo with a broken fleet ----------------------------------------------------------------------------


def test_the_demo_with_a_broken_fleet_fails_at_once(cli: Any, tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[hosts.a\n", encoding="utf-8")
    started = time.monotonic()
    res = cli("demo", "--fleet", str(broken))
    assert res.code == 7 and "not valid TOML" in one_line(res.err)
    assert time.monotonic() - started < 5


# -- 8. the lock, a missing file, an empty --fleet --------------------------------------------------------------


def test_concurrent_adds_to_a_missing_file_create_it_once(isolated: Path) -> None:
    path = isolated / "config" / "drover" / "fleet.toml"
    path.parent.mkdir(parents=True)
    lock = os.open(path.parent / ".fleet.toml.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # both adds start while the file is missing, then wait for the lock
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "drover", "op", "fleet.add", f'{{"name": "box-{i}"}}'],
                cwd=str(ROOT),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(2)
        ]
        waiting = {str(p.pid) for p in procs}

        def both_wait() -> bool:
            blocked = [line.split() for line in Path("/proc/locks").read_text().splitlines() if "->" in line]
            return waiting <= {fields[5] for fields in blocked if len(fields) > 5}

        wait_for(both_wait, timeout=30, what="both adds waiting on the lock")
    finally:
        os.close(lock)
    results = [(p.wait(timeout=60), p.communicate()) for p in procs]
    assert all(code == 0 for code, _ in results), results
    created = [json.loads(out)["data"]["created"] for _code, (out, _err) in results]
    assert sorted(created) == [False, True], created
    assert sorted(tomllib.loads(path.read_text(encoding="utf-8"))["hosts"]) == ["box-0", "box-1"]


def test_removing_from_a_missing_file_creates_nothing(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "sub" / "fleet.toml"
    res = cli("fleet", "remove", "a", "--fleet", str(path))
    assert res.code == 6 and "'a' is not in" in one_line(res.err)
    assert list(tmp_path.iterdir()) == []


def test_an_empty_fleet_option_is_a_usage_error(cli: Any, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = isolated / "env.toml"
    env.write_text('[hosts.from-env]\nssh = "e"\n', encoding="utf-8")
    monkeypatch.setenv("DROVER_FLEET", str(env))
    for args in (["fleet", "show"], ["fleet", "add", "x"], ["ls"]):
        res = cli(*args, "--fleet", "")
        assert res.code == 2, (args, res.err)
        assert "--fleet" in one_line(res.err)
    assert "x" not in env.read_text(encoding="utf-8")


# -- what no fleet file holds: a NUL, nesting past any fleet's shape ----------------------------------------------
@pytest.mark.parametrize(
    "body, line, words",
    [
        ('[hosts.a]\nssh = "a\\u0000b"\n', 2, "hosts.a.ssh: holds a NUL character"),
        ('[hosts.a]\nssh = "a"\ntags = ["x", "y\\u0000"]\n', 3, "hosts.a.tags.1: holds a NUL character"),
        ('[hosts."a\\u0000b"]\nssh = "a"\n', 1, "holds a NUL character"),
        ("[hosts.a]\nssh = 'a'\ntags = " + "[" * 40 + "]" * 40 + "\n", 3, "nested more than 16 deep"),
        ("[hosts.a]\nssh = 'a'\ntags = " + "[" * 5000 + "]" * 5000 + "\n", 3, "nested more than 16 deep"),
        ('# a comment [[[[\n[hosts.a]\nssh = "[[["\nx = ' + "{y = " * 3000 + "1" + "}" * 3000 + "\n", 4, "nested more"),
    ],
)
def test_a_nul_or_deep_nesting_is_a_config_error_with_its_line(tmp_path: Path, body: str, line: int, words: str) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(body, encoding="utf-8")
    for command in (["fleet", "show"], ["ls"], ["send", "a:x", "hi"], ["fleet", "add", "b", "--ssh", "b.example"]):
        res = process("--fleet", str(path), *command)
        assert res.code == 7, (command, res.err)
        said = one_line(res.err)
        assert f"fleet.toml:{line}:" in said and words in said, said
    assert path.read_text(encoding="utf-8") == body  # the edit refused it too, and left it alone
    with pytest.raises(FleetInvalid):
        fleet_mod.load(path)
