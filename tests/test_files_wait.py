"""drover wait-file: block on a host until a file exists or changes -- real inotify, real files, the real SSH fleet."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import drover
from drover.remote import files as remote_files
from drover.remote.protocol import HelperError
from tests.conftest import helper_pids, stays, wait_for
from tests.support.sshfleet import SSHFleet


def later(seconds: float, action: Callable[[], object], after: Callable[[], object] | None = None) -> threading.Thread:
    """Do `action` from another thread while the wait blocks: once `after()` is true (if given), then `seconds` on."""

    def run() -> None:
        if after is not None:
            wait_for(after, timeout=60, what="the wait to be under way")
        time.sleep(seconds)
        action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


class Watching:
    """Knows when the helper (in this process) has taken its baseline and set its watch, so a test changes the file
    after that and not, on a loaded machine, before the wait has even started."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ready = threading.Event()
        original = remote_files._watcher

        def watcher(directory: str, poll: bool) -> Any:
            found = original(directory, poll)
            self.ready.set()
            return found

        monkeypatch.setattr(remote_files, "_watcher", watcher)

    def then(self, action: Callable[[], object]) -> threading.Thread:
        def under_way() -> bool:
            if self.ready.is_set():
                self.ready.clear()
                return True
            return False

        return later(0.1, action, after=under_way)


@pytest.fixture
def watching(monkeypatch: pytest.MonkeyPatch) -> Watching:
    return Watching(monkeypatch)


def atomic_write(path: Path, text: str) -> None:
    """How status files are usually written: a temporary file beside it, renamed into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.rename(tmp, path)


def test_waits_for_a_file_renamed_into_place(tmp_path: Path, watching: Watching) -> None:
    status = tmp_path / "status.json"
    watching.then(lambda: atomic_write(status, '{"state": "done"}'))
    doc = drover.run("files.wait", {"path": str(status), "timeout_s": 20})
    assert doc.exit_code == 0, doc.errors
    data = doc.data
    assert (data["event"], data["how"], data["size"]) == ("created", "inotify", len('{"state": "done"}'))
    assert data["inode"] == status.stat().st_ino and data["mtime_ns"] == status.stat().st_mtime_ns
    again = drover.run("files.wait", {"path": str(status), "timeout_s": 20})
    assert (again.exit_code, again.data["event"]) == (0, "exists")


def test_a_file_written_in_pieces_is_reported_once_its_writer_closes_it(tmp_path: Path, watching: Watching) -> None:
    status = tmp_path / "report.txt"

    def write_slowly() -> None:
        with open(status, "w") as f:
            for i in range(4):
                f.write(f"part {i}\n")
                f.flush()
                time.sleep(0.05)

    watching.then(write_slowly)
    doc = drover.run("files.wait", {"path": str(status), "timeout_s": 20})
    assert doc.data["event"] == "created" and doc.data["size"] == len("part 0\n") * 4, doc.data


def test_changed_sees_an_edit_an_atomic_replace_and_a_touch(tmp_path: Path, watching: Watching) -> None:
    status = tmp_path / "status"
    status.write_text("working")
    watching.then(lambda: status.write_text("finished"))
    doc = drover.run("files.wait", {"path": str(status), "changed": True, "timeout_s": 20})
    assert (doc.data["event"], doc.data["size"]) == ("changed", len("finished")), doc.data
    # Same size, new inode: the rename into place is a change too.
    watching.then(lambda: atomic_write(status, "finishe!"))
    doc = drover.run("files.wait", {"path": str(status), "changed": True, "timeout_s": 20})
    assert doc.data["event"] == "changed" and doc.data["inode"] == status.stat().st_ino
    # A touch changes only the mtime.
    watching.then(lambda: os.utime(status, (1_000_000, 1_000_000)))
    doc = drover.run("files.wait", {"path": str(status), "changed": True, "timeout_s": 20})
    assert doc.data["event"] == "changed" and doc.data["mtime"] == 1_000_000


def test_a_change_between_the_request_and_the_watch_is_not_missed(tmp_path: Path, monkeypatch: Any) -> None:
    """The file changes after the helper took its baseline and before the watch is set: the look that follows the
    watch sees it, so the wait ends at once instead of sleeping until its timeout."""
    status = tmp_path / "status"
    status.write_text("old")
    original = remote_files.Inotify.__init__

    def change_first(self: Any, directory: str) -> None:
        status.write_text("new!")  # lands in the gap: after the baseline, before the watch
        original(self, directory)

    monkeypatch.setattr(remote_files.Inotify, "__init__", change_first)
    started = time.monotonic()
    out = remote_files.wait_file({"path": str(status), "changed": True, "timeout_s": 30}, {})
    assert (out["event"], out["size"], out["how"]) == ("changed", 4, "inotify")
    assert out["waited_s"] < 30 and time.monotonic() - started < 30  # it did not sit out its timeout
    # And a file that appears in that gap, for a wait until it exists.
    fresh = tmp_path / "fresh"

    def create_first(self: Any, directory: str) -> None:
        fresh.write_text("here")
        original(self, directory)

    monkeypatch.setattr(remote_files.Inotify, "__init__", create_first)
    out = remote_files.wait_file({"path": str(fresh), "timeout_s": 30}, {})
    assert (out["event"], out["size"]) == ("created", 4)


def test_a_baseline_from_an_earlier_answer_catches_a_change_between_two_waits(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("v1")
    first = drover.run("files.wait", {"path": str(status), "timeout_s": 5}).data
    atomic_write(status, "v2")  # between the coordinator's two waits
    baseline = {k: first[k] for k in ("device", "inode", "size", "mtime_ns")}
    doc = drover.run("files.wait", {"path": str(status), "changed": True, "baseline": baseline, "timeout_s": 5})
    assert (doc.exit_code, doc.data["event"], doc.data["how"]) == (0, "changed", "inotify"), doc.data
    bad = drover.run("files.wait", {"path": str(status), "changed": True, "baseline": {"inode": "x"}, "timeout_s": 5})
    assert bad.exit_code == 2 and "baseline must hold" in bad.errors[0]["message"]


@pytest.mark.slow  # waits out a real timeout
def test_timeout_is_exit_9_with_one_line(tmp_path: Path, cli: Any) -> None:
    res = cli("wait-file", "local", str(tmp_path / "never"), "--timeout", "0.5")
    assert res.code == 9
    assert res.err.strip() == f"drover: local: {tmp_path / 'never'} did not appear within 0.5s"
    status = tmp_path / "still"
    status.write_text("same")
    res = cli("wait-file", "local", str(status), "--changed", "--timeout", "0.5", "--json")
    assert res.code == 9
    doc = res.json()
    assert doc["data"]["reached"] is False and doc["data"]["exists"] is True and doc["errors"][0]["code"] == "wait_timeout"


def test_the_poll_fallback_sees_the_same_things(tmp_path: Path, cli: Any, watching: Watching) -> None:
    status = tmp_path / "polled"
    watching.then(lambda: atomic_write(status, "done"))
    res = cli("wait-file", "local", str(status), "--poll", "--timeout", "20", "--json")
    assert res.code == 0, res.err
    data = res.json()["data"]
    assert (data["event"], data["how"]) == ("created", "poll (asked for)")
    watching.then(lambda: status.write_text("done, really"))
    res = cli("wait-file", "local", str(status), "--poll", "--changed", "--timeout", "20")
    assert res.code == 0 and "polled changed (12 bytes" in res.out


def test_home_relative_and_tilde_paths(tmp_path: Path, monkeypatch: Any, cli: Any) -> None:
    home = tmp_path / "fakehome"
    (home / "jobs").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    (home / "jobs" / "a.done").write_text("ok")
    for path in ("jobs/a.done", "~/jobs/a.done"):
        res = cli("wait-file", "local", path, "--timeout", "2", "--json")
        assert res.code == 0, res.err
        assert res.json()["data"]["path"] == str(home / "jobs" / "a.done")


def test_bad_paths_are_one_clear_line_each(tmp_path: Path, cli: Any) -> None:
    res = cli("wait-file", "local", str(tmp_path / "no-such-dir" / "status"), "--timeout", "5")
    assert res.code == 6
    assert f"the directory {tmp_path / 'no-such-dir'} does not exist on this host" in res.err
    assert len(res.err.strip().splitlines()) == 1
    (tmp_path / "plain").write_text("a file, not a directory")
    res = cli("wait-file", "local", str(tmp_path / "plain" / "status"), "--timeout", "5")
    assert res.code == 6 and "is not a directory" in res.err
    assert cli("wait-file", "local", "", "--timeout", "5").code == 2
    assert cli("wait-file", "local", "x", "--changed", "--exists").code == 2
    res = cli("wait-file", "local", "~no-such-user-here/status", "--timeout", "5")
    assert res.code == 6 and "no such user" in res.err
    res = cli("wait-file", "nosuchhost", "status", "--timeout", "5")
    assert res.code == 6 and "unknown host 'nosuchhost'" in res.err
    res = cli("op", "files.wait", json.dumps({"path": "x", "timeout_s": -1}))
    assert res.code == 2 and "timeout_s" in res.err


def test_the_directory_removed_while_waiting_ends_the_wait(tmp_path: Path, watching: Watching) -> None:
    folder = tmp_path / "work"
    folder.mkdir()
    watching.then(lambda: folder.rmdir())
    with pytest.raises(HelperError) as caught:
        remote_files.wait_file({"path": str(folder / "status"), "timeout_s": 20}, {})
    assert caught.value.code == "no_such_directory" and "removed while waiting" in caught.value.message


# -- over SSH --------------------------------------------------------------------------------------------------------
def test_over_ssh_a_coordinator_waits_on_a_workers_status_file(sshfleet: SSHFleet, cli: Any) -> None:
    """On h2, relative to h2's own home; the wait outlives the fleet's request timeout (1 s here), as it must."""
    text = sshfleet.fleet_toml().replace("request_timeout = 20.0", "request_timeout = 1.0")
    sshfleet.fleet_file.write_text(text, encoding="utf-8")  # type: ignore[attr-defined]
    workdir = sshfleet.host_home("h2") / "jobs"
    workdir.mkdir(exist_ok=True)
    status = workdir / "worker-7.json"
    # Written 1.5 s after the helper is running on h2: past the 1 s request timeout, and after its first look.
    later(1.5, lambda: atomic_write(status, '{"worker": 7, "state": "done"}'), after=lambda: helper_pids("h2"))
    res = cli("wait-file", "h2", "jobs/worker-7.json", "--timeout", "30", "--json")
    assert res.code == 0, res.err
    data = res.json()["data"]
    assert (data["host"], data["path"], data["event"], data["how"]) == ("h2", str(status), "created", "inotify")
    assert data["waited_s"] > 1.0  # it blocked past the request timeout, on the host
    # Changed, over SSH, with the file replaced atomically while the wait blocks.
    earlier = set(helper_pids("h2"))  # the first wait's helper may still be on its way out
    later(0.5, lambda: atomic_write(status, '{"worker": 7, "state": "merged"}'), after=lambda: set(helper_pids("h2")) - earlier)
    res = cli("wait-file", "h2", "~/jobs/worker-7.json", "--changed", "--timeout", "30")
    assert res.code == 0 and "changed" in res.out, res.err
    # A coordinator's loop: the previous answer as the baseline, so a change before the next wait starts counts.
    atomic_write(status, '{"worker": 7, "state": "archived"}')
    baseline = {k: data[k] for k in ("device", "inode", "size", "mtime_ns")}
    doc = drover.run("files.wait", {"host": "h2", "path": "jobs/worker-7.json", "changed": True, "baseline": baseline})
    assert (doc.exit_code, doc.data["event"], doc.data["size"]) == (0, "changed", len('{"worker": 7, "state": "archived"}'))
    # h3 has no jobs directory at all: said as such, at once.
    res = cli("wait-file", "h3", "jobs/worker-7.json", "--timeout", "30", "--json")
    assert res.code == 6 and res.json()["errors"][0]["code"] == "no_such_directory"


def test_over_ssh_permission_denied_is_said_plainly(sshfleet: SSHFleet, tmp_path: Path, cli: Any) -> None:
    if os.geteuid() != 0:
        pytest.skip("logging in as another user of the test fleet needs root (CI runs as root)")
    user = sshfleet.shell_user("bash")
    secret = Path("/root") / f"drover-private-{os.getpid()}"
    secret.mkdir(mode=0o700, exist_ok=True)
    try:
        text = sshfleet.fleet_toml(f'[hosts.colleague]\nssh = "h1"\nuser = "{user}"\n')
        sshfleet.fleet_file.write_text(text, encoding="utf-8")  # type: ignore[attr-defined]
        res = cli("wait-file", "colleague", str(secret / "status"), "--timeout", "5", "--json")
        assert res.code == 6, res.out
        error = res.json()["errors"][0]
        assert error["code"] == "permission_denied" and error["host"] == "colleague"
        assert "permission denied" in error["message"]
    finally:
        secret.rmdir()


def test_the_shipped_bundle_waits_and_tells_who_waits_under_python_36(tmp_path: Path, tmux: Any) -> None:
    """The helper's oldest Python: inotify through ctypes, and the attention op, as a 3.6 host runs them."""
    from drover.transport import bundle
    from tests.test_remote_package import pyenv_python, run_bundle

    python = pyenv_python("3.6")
    if python is None:
        pytest.skip("no Python 3.6 on this machine (pyenv's builds are at /root/.pyenv/versions)")
    tmux.agent("old-host-agent")
    status = tmp_path / "status"
    later(0.5, lambda: atomic_write(status, "done"), after=lambda: old_helper_running(python))
    code, answers, raw = run_bundle(
        [python, "-E", "-s", "-c", bundle.BOOTSTRAP],
        {"op": "wait_file", "args": {"path": str(status), "timeout_s": 30}},
        {"op": "attention"},
    )
    assert code == 0, raw
    waited, attention = answers
    assert waited["ok"], waited
    assert (waited["data"]["event"], waited["data"]["how"], waited["data"]["size"]) == ("created", "inotify", 4)
    assert attention["ok"], attention
    assert [(s["name"], s["human"]) for s in attention["data"]["sessions"]] == [("old-host-agent", None)]


def old_helper_running(python: str) -> bool:
    """A helper started by `python` (the bundle's bootstrap names itself drover_boot) is running."""
    for pid in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.startswith(python.encode() + b"\0") and b"drover_boot" in cmdline:
            return True
    return False


@pytest.mark.parametrize("poll", [False, True])
@pytest.mark.parametrize("how", ["removed", "moved"])
def test_a_directory_removed_and_made_again_is_waited_in(tmp_path: Path, watching: Watching, poll: bool, how: str) -> None:
    """`rm -rf D; mkdir D; echo x > D/s` and `mv D D.old; mkdir D`: the file is at the path, so the wait says so --
    inotify and poll alike -- rather than "moved or removed"."""
    folder = tmp_path / "work"
    folder.mkdir()

    def again() -> None:
        if how == "removed":
            folder.rmdir()
        else:
            folder.rename(tmp_path / "work.old")
        folder.mkdir()
        (folder / "status").write_text("x")

    watching.then(again)
    data = remote_files.wait_file({"path": str(folder / "status"), "timeout_s": 20, "poll": poll}, {})
    assert (data["event"], data["exists"]) == ("created", True), data


def test_the_directory_removed_ends_a_polled_wait_too(tmp_path: Path, watching: Watching) -> None:
    folder = tmp_path / "work"
    folder.mkdir()
    watching.then(lambda: folder.rmdir())
    with pytest.raises(HelperError) as caught:
        remote_files.wait_file({"path": str(folder / "status"), "timeout_s": 20, "poll": True}, {})
    assert caught.value.code == "no_such_directory" and "removed while waiting" in caught.value.message


def test_dot_dot_after_a_symlink_is_resolved_as_the_os_does(tmp_path: Path, cli: Any) -> None:
    (tmp_path / "real" / "inner").mkdir(parents=True)
    (tmp_path / "wf3").mkdir()
    (tmp_path / "wf3" / "link").symlink_to(tmp_path / "real" / "inner")
    (tmp_path / "real" / "x").write_text("the OS's x")  # wf3/link/.. is real/, not wf3/
    res = cli("wait-file", "local", str(tmp_path / "wf3" / "link" / ".." / "x"), "--timeout", "2", "--json")
    assert res.code == 0, res.err
    assert res.json()["data"]["path"] == str((tmp_path / "real" / "x").resolve())


def test_loops_long_names_and_odd_baselines_are_said_in_words(tmp_path: Path, cli: Any) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    res = cli("wait-file", "local", str(tmp_path / "loop" / "x"), "--timeout", "2")
    assert res.code == 6 and "symbolic links" in res.err and "Errno" not in res.err, res.err
    res = cli("wait-file", "local", str(tmp_path / ("n" * 300)), "--timeout", "2")
    assert res.code == 2 and "too long" in res.err and "Errno" not in res.err, res.err
    res = cli("wait-file", "local", str(tmp_path / ("d" * 300) / "x"), "--timeout", "2")
    assert res.code == 2 and "too long" in res.err, res.err
    res = cli("wait-file", "local", str(tmp_path) + "/a" * 2100 + "/x", "--timeout", "2")
    assert res.code == 2 and "too long" in res.err, res.err
    status = tmp_path / "s"
    status.write_text("x")
    for bad in ("1e400", "1.5", "true", '"NaN"'):
        baseline = f'{{"device": {bad}, "inode": 1, "size": 1, "mtime_ns": 1}}'
        doc = json.dumps({"path": str(status), "changed": True, "timeout_s": 2, "baseline": json.loads(baseline)})
        res = cli("op", "files.wait", doc)
        assert res.code == 2 and "whole numbers" in res.out + res.err, (bad, res.out, res.err)


def test_an_empty_host_is_a_usage_error_and_a_newline_in_a_path_is_shown_not_printed(tmp_path: Path, cli: Any) -> None:
    assert cli("wait-file", "", str(tmp_path / "x"), "--timeout", "1").code == 2
    odd = tmp_path / "two\nlines"
    odd.write_text("x")
    res = cli("wait-file", "local", str(odd), "--timeout", "2")
    assert res.code == 0 and len(res.out.strip().splitlines()) == 1 and "two\u2424lines" in res.out, res.out


@pytest.mark.parametrize("what", ["wait-file", "wait"])
def test_a_wait_whose_caller_was_killed_frees_the_host_at_once(sshfleet: SSHFleet, isolated: Path, what: str) -> None:
    """`kill -9` of a waiting client: the helper on the host sees its caller gone (its stdout's reader closed) and
    ends within a slice, instead of holding a process there until the wait's own timeout (120 s here)."""
    import signal
    import subprocess
    import sys

    from tests.conftest import remote_agent

    if what == "wait-file":
        (sshfleet.host_home("h2") / "jobs").mkdir(exist_ok=True)
        args = ["wait-file", "h2", "jobs/never.json", "--timeout", "120"]
    else:
        remote_agent(sshfleet, "h2", "lasting", isolated)
        args = ["wait", "h2:lasting", "--until", "exited", "--timeout", "120"]
    before = set(helper_pids("h2"))
    client = subprocess.Popen([sys.executable, "-m", "drover", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        waiting = wait_for(lambda: set(helper_pids("h2")) - before, what="the wait's helper to run on h2")
        # Its caller is there: the wait goes on (a wait that took a live caller for gone would end here).
        stays(lambda: client.poll() is None, 0.5, what="the wait, while its client is there")
    finally:
        client.send_signal(signal.SIGKILL)
        client.communicate()
    # Within a slice, and far below the wait's own 120 s: 60 s of bound is for a loaded machine, not the design.
    wait_for(lambda: not (set(helper_pids("h2")) & waiting), timeout=60, what="the helper to leave h2")
