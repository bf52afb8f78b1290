"""The remote side as it travels: the bundle, its bootstrap under every login shell, old and new interpreters,
framed answers, and the step that failed named when something before the helper goes wrong."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from drover.remote import protocol as P
from drover.transport import bundle
from drover.transport.helper_channel import read_answer
from tests.conftest import remote_agent, wait_for
from tests.support.sshfleet import SSHFleet

PYENV = Path("/root/.pyenv/versions")
SHELLS = ["sh", "bash", "zsh", "fish", "tcsh"]


def pyenv_python(version: str) -> str | None:
    """A real interpreter of that version (pyenv's builds, or one on PATH), or None."""
    found = shutil.which(f"python{version}")
    if found and ".pyenv/shims" not in found:
        return found
    for path in sorted(PYENV.glob(f"{version}.*/bin/python{version}")):
        if os.access(path, os.X_OK):
            return str(path)
    return None


def run_bundle(argv: list[str], *requests: dict[str, Any]) -> tuple[int, list[dict[str, Any]], bytes]:
    """Feed the bundle and request lines to a bootstrap command, as sshd would; (exit, answers, raw stdout)."""
    lines = b"".join(json.dumps({"helper": P.PROTOCOL, "args": {}, **r}).encode() + b"\n" for r in requests)
    proc = subprocess.run(argv, input=bundle.preamble() + lines, capture_output=True, timeout=60)
    answers = []
    for frame in proc.stdout.split(P.ANSWER_MARK)[1:]:  # one frame per request, in order
        answer, _noise = read_answer(P.ANSWER_MARK + frame)
        if answer is not None:
            answers.append(answer)
    return proc.returncode, answers, proc.stdout + proc.stderr


# -- the bootstrap -------------------------------------------------------------------------------------------------


def test_bootstrap_is_one_line_with_nothing_a_shell_would_reinterpret() -> None:
    command = bundle.command("python3")
    for bad in ("'", "\\", "!", "\n", "\r"):
        assert bad not in bundle.BOOTSTRAP, bad
    assert command.count("'") == 2 and command.endswith("'")
    with pytest.raises(ValueError, match="only letters"):
        bundle.command("python3; rm -rf ~")


@pytest.mark.parametrize("shell", SHELLS)
def test_every_login_shell_runs_the_same_command(shell: str) -> None:
    """sshd runs `$SHELL -c COMMAND`: the command must reach python unchanged in each of them."""
    path = shutil.which(shell)
    if path is None:
        pytest.fail(f"{shell} is not installed: the README's test command installs it")
    code, answers, raw = run_bundle([path, "-c", bundle.command("python3")], {"op": "hello"}, {"op": "classify"})
    assert code == 0, raw
    assert [a["ok"] for a in answers] == [True, True], raw
    assert answers[0]["bundle"] == bundle.bundle_hash() and answers[0]["helper"] == P.PROTOCOL


def test_bundle_is_smaller_than_the_source_it_carries() -> None:
    blob, digest = bundle.build()
    sources = sum(len(p.read_bytes()) for p in bundle.REMOTE_DIR.glob("*.py"))
    assert len(blob) < sources / 2 and len(digest) == 16


# -- interpreters ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["3.6", "3.8", "3.13"])
def test_bundle_runs_under_old_and_new_pythons(version: str, tmux: Any) -> None:
    python = pyenv_python(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine (pyenv's builds are at {PYENV})")
    pane = tmux.agent("old-py")
    code, answers, raw = run_bundle(
        [python, "-E", "-s", "-c", bundle.BOOTSTRAP],
        {"op": "hello"},
        {"op": "list"},
        {"op": "deliver", "args": {"target": pane.id, "text": f"hello from {version}", "actor": "py"}},
    )
    assert code == 0, raw
    hello, listing, delivered = answers
    assert hello["data"]["python"].startswith(version)
    assert [s["name"] for s in listing["data"]["sessions"]] == ["old-py"]
    assert delivered["data"]["outcome"] == "delivered", delivered
    wait_for(lambda: any(f"hello from {version}" in m for m in pane.messages()), what="the message in the pane")


def test_python_too_old_says_so_before_anything_else() -> None:
    python = pyenv_python("2.7")
    if python is None:
        pytest.skip("no Python 2.7 on this machine to play a too-old remote")
    proc = subprocess.run(["sh", "-c", bundle.command(python)], input=bundle.preamble(), capture_output=True, timeout=30)
    assert proc.returncode == P.EXIT_TOO_OLD and proc.stdout == b"", proc.stderr


# -- framing ---------------------------------------------------------------------------------------------------------


def test_answer_survives_noise_before_it_and_a_cut_answer_is_no_answer() -> None:
    body = json.dumps({"helper": P.PROTOCOL, "ok": True, "data": 1}).encode()
    framed = P.ANSWER_MARK + str(len(body)).encode() + b"\n" + body + b"\n"
    answer, noise = read_answer(b'Welcome to box-a!\n{"fake": true}\n' + framed)
    assert answer == {"helper": P.PROTOCOL, "ok": True, "data": 1} and noise.startswith(b"Welcome")
    assert read_answer(framed[:-10])[0] is None
    assert read_answer(b'{"helper": 2, "ok": true}')[0] is None  # unframed JSON is not an answer


# -- over SSH: real users with real login shells, old interpreters, broken rc files -----------------------------------


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("creating test users with their own login shells needs root (CI runs as root)")


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish", "tcsh"])
def test_ls_and_fleet_check_for_users_with_each_login_shell(shell: str, sshfleet: SSHFleet, cli: Any) -> None:
    _need_root()
    user = sshfleet.shell_user(shell)
    sshfleet.fleet_file.write_text(  # type: ignore[attr-defined]
        sshfleet.fleet_toml(f'[hosts.{shell}-box]\nssh = "h1"\nuser = "{user}"\n'), encoding="utf-8"
    )
    res = cli("ls", "--host", f"{shell}-box", "--json")
    assert res.code == 0, res.err
    row = cli("fleet", "check", "--host", f"{shell}-box", "--json").json()["data"]["hosts"][0]
    assert row["ok"] and row["shell"] is True and row["user"] == user, row


def _write_rc(user: str, name: str, text: str) -> Path:
    import pwd

    entry = pwd.getpwnam(user)
    path = Path(entry.pw_dir) / name
    path.write_text(text)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def test_login_shell_that_fails_is_named_not_unreachable(sshfleet: SSHFleet, cli: Any) -> None:
    _need_root()
    user = sshfleet.shell_user("bash")
    rc = _write_rc(user, ".bashrc", "echo 'bashrc: cannot load the module system' >&2\nexit 3\n")
    try:
        sshfleet.fleet_file.write_text(  # type: ignore[attr-defined]
            sshfleet.fleet_toml(f'[hosts.broken]\nssh = "h1"\nuser = "{user}"\n'), encoding="utf-8"
        )
        row = cli("fleet", "check", "--host", "broken", "--json").json()["data"]["hosts"][0]
        assert (row["reachable"], row["host_key"], row["auth"], row["shell"]) == (True, True, True, False), row
        assert row["error"]["code"] == P.SHELL_FAILED and "cannot load the module system" in row["error"]["message"]
        res = cli("ls", "--host", "broken")
        assert res.code == 5 and "login shell" in res.err
    finally:
        rc.unlink()


def test_login_shell_that_prints_is_a_warning_and_the_answer_still_counts(sshfleet: SSHFleet, cli: Any) -> None:
    _need_root()
    user = sshfleet.shell_user("bash")
    rc = _write_rc(user, ".bashrc", 'echo "Welcome to the cluster, $USER!"\necho \'{"ok": false}\'\n')
    try:
        sshfleet.fleet_file.write_text(  # type: ignore[attr-defined]
            sshfleet.fleet_toml(f'[hosts.chatty]\nssh = "h1"\nuser = "{user}"\n'), encoding="utf-8"
        )
        res = cli("ls", "--host", "chatty", "--json")
        assert res.code == 0, res.err
        warnings = " ".join(w["message"] for w in res.json()["data"]["warnings"])
        assert "login shell on chatty printed" in warnings and "Welcome to the cluster" in warnings
    finally:
        rc.unlink()


def test_python_36_host_over_ssh_lists_and_delivers(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    python = pyenv_python("3.6")
    if python is None:
        pytest.skip(f"no Python 3.6 on this machine (pyenv's builds are at {PYENV})")
    pane = remote_agent(sshfleet, "h2", "agent", isolated)
    sshfleet.fleet_file.write_text(  # type: ignore[attr-defined]
        sshfleet.fleet_toml(f'[hosts.py36]\nssh = "h2"\npython = "{python}"\n'), encoding="utf-8"
    )
    row = cli("fleet", "check", "--host", "py36", "--json").json()["data"]["hosts"][0]
    assert row["ok"] and row["python"].startswith("3.6"), row
    res = cli("--actor", "old", "send", "py36:agent", "from a 3.6 helper", "--json")
    assert res.code == 0 and res.json()["data"]["outcome"] == "delivered", res.out + res.err
    wait_for(lambda: any("from a 3.6 helper" in m for m in pane.messages()), what="the message on h2")


def test_python_27_host_over_ssh_is_too_old(sshfleet: SSHFleet, cli: Any) -> None:
    python = pyenv_python("2.7")
    if python is None:
        pytest.skip("no Python 2.7 on this machine to play a too-old remote")
    sshfleet.fleet_file.write_text(  # type: ignore[attr-defined]
        sshfleet.fleet_toml(f'[hosts.py27]\nssh = "h2"\npython = "{python}"\n'), encoding="utf-8"
    )
    res = cli("ls", "--host", "py27", "--json")
    assert res.code == 5
    error = res.json()["errors"][0]
    assert error["code"] == P.PYTHON_TOO_OLD and "older than 3.6" in error["message"]


def test_a_damaged_bundle_is_caught_by_its_hash(sshfleet: SSHFleet, monkeypatch: pytest.MonkeyPatch, cli: Any) -> None:
    monkeypatch.setattr(bundle, "bundle_hash", lambda: "0000000000000000")
    res = cli("ls", "--host", "h1", "--json")
    assert res.code == 5 and res.json()["errors"][0]["code"] == P.BUNDLE_MISMATCH


if __name__ == "__main__":  # pragma: no cover - handy when poking at one interpreter by hand
    print(run_bundle([sys.argv[1], "-E", "-s", "-c", bundle.BOOTSTRAP], {"op": "hello"}))
