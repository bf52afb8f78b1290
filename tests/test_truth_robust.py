"""The truth file survives crashes and neighbours: torn and malformed lines, a full disk, a read-only home,
planted symlinks, other users' files, loose modes, and oversize texts -- on real files, with real processes."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import drover
from drover.errors import ExitCode, TruthDiskFull, TruthUnsafe, TruthUnwritable
from drover.truth import HEAD_CHARS, TruthFile
from tests.conftest import Tmux, drover_process, stays, wait_for

NOBODY = 65534


def home_of(isolated: Path) -> Path:
    return isolated / "home"


def record(home: Path, text: str = "an earlier message", target: str = "somewhere") -> str:
    """One whole message (accepted + delivered) written the way drover writes it."""
    truth = TruthFile(home)
    msg_id, _ = truth.accept(actor="earlier", host="local", target=target, text=text, options={})
    assert truth.outcome(msg_id, {"outcome": "delivered", "lane": "tmux", "detail": "pasted"}) is None
    return msg_id


def lines(home: Path) -> list[str]:
    return (home / "truth.jsonl").read_text(encoding="utf-8").split("\n")


def bodies(pane: Any) -> list[str]:
    """What arrived in the demo agent, without drover's envelope."""
    return [m.split("\n")[1] if m.startswith("<cross-session-message") else m for m in pane.messages()]


def fill_disk(path: Path) -> None:
    """Write zeros to `path` until the file system is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Mount small tmpfs file systems (mode 0700, so a home on them is private); unmounted at teardown."""
    mounts: list[Path] = []

    def mount(size: str = "64k") -> Path:
        where = tmp_path / f"fs{len(mounts)}"
        where.mkdir()
        if not shutil.which("mount"):
            pytest.skip("no mount(8) here: the disk-full and read-only tests need a small tmpfs")
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            pytest.skip(f"mounting a tmpfs is not permitted here ({proc.stderr.strip()}): these tests need root")
        mounts.append(where)
        return where

    yield mount
    for where in reversed(mounts):
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


# -- torn and malformed lines --------------------------------------------------------------------------------------
TORN = '{"v":1,"event":"accepted","id":"msg_0000torn","time":"2026-01-01T00:00:00.000Z","ts":17'
MALFORMED = [
    "[1,2,3]",
    '{"v":1,"event":"accepted","id":"msg_00000000nullts","ts":null,"actor":"x","host":"local","target":"t","text":"n"}',
    '"just a string"',
    "not json at all",
    '{"v":1,"event":"outcome","id":"msg_00000000typed","ts":1.5,"outcome":7}',
    '{"v":1,"event":"accepted","id":42,"ts":1.5}',
    '{"v":1,"event":"accepted","id":"msg_0000000000badtype","ts":1.5,"text":["a"]}',
    '{"v":1,"event":"accepted","id":"msg_000000000000nan","ts":NaN}',
    '{"v":1,"event":"accepted","id":"msg_00000000000huge","ts":1e999}',
    "[" * 100_000 + "]" * 100_000,
]


def test_torn_and_malformed_lines_then_a_send_and_log(tmux: Tmux, isolated: Path, cli: Any) -> None:
    """A crash mid-write leaves a line without its newline: the next send starts a new line, and every reader --
    the limits in the send, log, log --pending, log show -- skips the bad lines with one counted warning."""
    pane = tmux.agent("survivor")
    home = home_of(isolated)
    assert cli("--actor", "alice", "send", pane.address, "before the crash").code == 0
    path = home / "truth.jsonl"
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n".join(MALFORMED) + "\n" + TORN)  # the file now ends mid-line, as after a crash
    size = path.stat().st_size

    res = drover_process("--actor", "bob", "send", pane.address, "after the crash", "--json")
    assert res.code == 0, res.err
    assert res.json()["data"]["outcome"] == "delivered"
    assert "skipped" in res.err and "malformed" in res.err  # the limits read the tail and said so, once
    wait_for(lambda: bodies(pane) == ["before the crash", "after the crash"], what="both messages")

    raw = path.read_bytes()
    assert raw[:size].endswith(TORN.encode())  # the fragment stays where it was...
    assert raw[size : size + 1] == b"\n"  # ...and the next event starts on a line of its own
    after = raw[size + 1 :].decode().splitlines()
    assert [json.loads(line)["event"] for line in after] == ["accepted", "outcome"]

    res = cli("log", "--json")
    assert res.code == 0, res.err
    data = res.json()["data"]
    assert [(m["actor"], m["text"], m["outcome"]) for m in data["messages"]] == [
        ("alice", "before the crash", "delivered"),
        ("bob", "after the crash", "delivered"),
    ]
    count = len(MALFORMED) + 1
    assert data["warnings"] == [
        {
            "code": "truth_lines_skipped",
            "message": data["warnings"][0]["message"],
            "count": count,
            "path": str(path),
        }
    ]
    assert f"skipped {count} malformed lines" in data["warnings"][0]["message"]
    assert data["total"] == 2 and data["complete"] is True

    pending = cli("log", "--pending", "--json").json()["data"]
    assert pending["messages"] == [] and pending["warnings"][0]["count"] == count

    bob = data["messages"][1]["id"]
    shown = cli("log", "show", bob, "--json")
    assert shown.code == 0 and shown.json()["data"]["message"]["text"] == "after the crash"
    assert cli("log", "show", "msg_0000torn").code == ExitCode.TARGET  # the torn message is not a message

    # A person reading the log sees one warning line, not one per bad line.
    human = drover_process("log")
    assert human.code == 0 and "after the crash" in human.out
    assert human.err.count("warning") == 1 and f"skipped {count} malformed lines" in human.err


def test_a_complete_event_missing_only_its_newline_is_kept(isolated: Path) -> None:
    home = home_of(isolated)
    first = record(home, "one")
    path = home / "truth.jsonl"
    path.write_bytes(path.read_bytes()[:-1])  # the crash took only the newline
    second = record(home, "two")
    truth = TruthFile(home)
    found = truth.query(10)
    assert [m.id for m in found.messages] == [first, second] and found.stats.skipped == 0
    assert all(json.loads(line) for line in lines(home) if line)


def test_the_limits_ignore_malformed_lines(isolated: Path) -> None:
    """The duplicate and burst limits count from the file: a line with a null time or of the wrong shape in the
    window neither crashes them nor counts as a message."""
    from drover import limits
    from drover.fleet import Limits

    home = home_of(isolated)
    lim = Limits(bucket_size=2, bucket_refill_per_s=0.001, duplicate_window_s=30)
    truth = TruthFile(home)

    def send(text: str) -> dict[str, Any] | None:
        def check(recent: list[dict[str, Any]]) -> dict[str, Any] | None:
            return limits.check(lim, "local", "t", text, time.time(), recent)

        _id, refusal = truth.accept(
            actor="a", host="local", target="t", text=text, options={}, check=check, window_s=limits.window_s(lim)
        )
        return refusal

    assert send("one") is None
    with open(home / "truth.jsonl", "a", encoding="utf-8") as f:
        now = time.time()
        f.write("\n".join(MALFORMED) + "\n")
        f.write(json.dumps({"event": "accepted", "id": "msg_x", "ts": now, "host": "local", "target": 5}) + "\n")
        f.write(json.dumps({"event": "accepted", "id": None, "ts": now, "host": "local", "target": "t"}) + "\n")
        f.write(TORN)
    refusal = send("one")
    assert refusal is not None and refusal["code"] == "duplicate"
    assert send("two") is None  # the malformed "messages" to t spent no token
    refusal = send("three")
    assert refusal is not None and refusal["code"] == "rate_limited"


# -- full disk, read-only home ------------------------------------------------------------------------------------
def test_full_disk_before_sending_refuses_to_send_and_leaves_the_file_as_it_was(
    tmux: Tmux, tmpfs: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    pane = tmux.agent("diskfull")
    home = tmpfs() / "home"
    monkeypatch.setenv("DROVER_HOME", str(home))
    record(home)
    fill_disk(home.parent / "filler")
    before = (home / "truth.jsonl").read_bytes()

    big = "a text longer than a page, so its line needs a page the disk does not have. " * 80
    res = drover_process("send", pane.address, big, "--json")
    assert res.code == ExitCode.CONFIG == 7, res.err
    doc = res.json()
    assert doc["ok"] is False and doc["data"] is None
    error = doc["errors"][0]
    assert error["code"] == "truth_disk_full" and error["errno"] == "ENOSPC"
    assert "nothing was sent" in error["message"] and "No space left on device" in error["message"]
    assert (home / "truth.jsonl").read_bytes() == before  # the half-written line was taken back
    stays(lambda: pane.messages() == [], what="nothing delivered")

    human = drover_process("send", pane.address, big)
    assert human.code == 7 and "nothing was sent" in human.err and "free some space" in human.err

    listed = drover_process("log", "--json")  # reading a full disk is fine
    assert listed.code == 0 and [m["text"] for m in listed.json()["data"]["messages"]] == ["an earlier message"]


# The demo agent, with a neighbour that fills the disk the moment the paste starts to arrive -- after drover wrote
# the accepted event, before it writes the outcome.  Its path contains drover/demo_agent, so drover sees the demo
# engine in the pane.
PANE_FILLS_THE_DISK = textwrap.dedent(
    """
    import fcntl, os, sys, time
    truth, filler, done = sys.argv[1:4]
    real_read = os.read
    fired = []

    def fill_the_disk():
        # A neighbour appends to the record until its last page is full (so the next line needs a new page)...
        fd = os.open(truth, os.O_WRONLY | os.O_APPEND)
        fcntl.flock(fd, fcntl.LOCK_EX)
        slack = -os.fstat(fd).st_size % 4096
        if slack >= 64:
            head = '{"event":"neighbour","ts":%r,"pad":"' % time.time()
            os.write(fd, (head + "x" * (slack - len(head) - 3) + '"}\\n').encode())
        # ...and the disk fills up.
        out = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(out, b"\\0" * 4096)
        except OSError:
            pass
        os.close(fd)
        open(done, "w").close()

    def read(fd, n):
        data = real_read(fd, n)
        if fd == 0 and data and not fired:
            fired.append(True)
            fill_the_disk()
        return data

    os.read = read
    from drover import demo_agent
    sys.exit(demo_agent.main(sys.argv[4:]))
    """
)


def test_full_disk_after_delivery_keeps_the_outcome(
    tmux: Tmux, isolated: Path, tmpfs: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outcome line cannot be written once the text has gone: the send still reports what happened (exit 0,
    delivered), says the record could not be written, and the record shows the message as pending."""
    home = tmpfs() / "home"
    monkeypatch.setenv("DROVER_HOME", str(home))
    record(home)
    fleet = isolated / "fleet.toml"
    fleet.write_text("[defaults]\nsettle_s = 0.5\n", encoding="utf-8")
    monkeypatch.setenv("DROVER_FLEET", str(fleet))
    script = isolated / "drover" / "demo_agent_fills_the_disk.py"
    script.parent.mkdir()
    script.write_text(PANE_FILLS_THE_DISK, encoding="utf-8")
    done = isolated / "disk-is-full"
    log = isolated / "filler-agent.jsonl"
    args = f"{home / 'truth.jsonl'} {home.parent / 'filler'} {done} --log {log} --name filler"
    pane = tmux.start("filler", f"{sys.executable} {script} {args}")
    pane.log = log
    pane.wait_idle()

    res = drover_process("--actor", "carol", "send", pane.address, "the text that fills the disk", "--json")
    assert done.exists(), (res.code, res.out, res.err)
    assert res.code == 0, res.err
    data = res.json()["data"]
    assert data["outcome"] == "delivered" and data["lane"] == "tmux"
    assert f"the outcome of {data['id']} could not be recorded" in res.err and "No space left" in res.err
    assert "the record shows the message as pending" in res.err
    wait_for(lambda: bodies(pane) == ["the text that fills the disk"], what="the message")

    human = drover_process("--actor", "carol", "send", pane.address, "a second text")
    assert human.code == 7 and "nothing was sent" in human.err  # and now nothing more can be accepted

    pending = drover_process("log", "--pending", "--json")
    assert pending.code == 0, pending.err
    assert [(m["id"], m["pending"]) for m in pending.json()["data"]["messages"]] == [(data["id"], True)]


def test_a_file_size_limit_is_a_full_disk(isolated: Path) -> None:
    """Under RLIMIT_FSIZE the write stops part-way with EFBIG (Python ignores SIGXFSZ): the same clear refusal,
    and the part that was written is taken back."""
    import resource

    home = home_of(isolated)
    record(home)
    path = home / "truth.jsonl"
    before = path.read_bytes()
    limit = len(before) + 100  # room for a fragment of the next line, not for the line

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run(
        [sys.executable, "-m", "drover", "send", "anyone", "a message longer than the hundred bytes left " * 3, "--json"],
        capture_output=True,
        text=True,
        preexec_fn=small_files,
        timeout=60,
        cwd=str(Path(drover.__file__).parents[1]),
    )
    assert proc.returncode == 7, proc.stderr
    error = json.loads(proc.stdout)["errors"][0]
    assert error["code"] == "truth_disk_full" and error["errno"] == "EFBIG"
    assert path.read_bytes() == before


def test_outcome_write_failure_returns_a_warning(tmpfs: Callable[..., Path]) -> None:
    home = tmpfs() / "home"
    truth = TruthFile(home)
    msg_id, _ = truth.accept(actor="a", host="local", target="t", text="x", options={})
    path = home / "truth.jsonl"
    with open(path, "a", encoding="utf-8") as f:  # bring the file to a page boundary
        slack = -path.stat().st_size % 4096
        head = f'{{"event":"neighbour","ts":{time.time()!r},"pad":"'
        f.write(head + "x" * (slack - len(head) - 3) + '"}\n')
    assert path.stat().st_size % 4096 == 0
    fill_disk(home.parent / "filler")
    before = path.read_bytes()
    warning = truth.outcome(msg_id, {"outcome": "delivered", "lane": "tmux", "detail": "pasted " * 200})
    assert warning is not None and warning["code"] == "truth_disk_full" and warning["id"] == msg_id
    assert path.read_bytes() == before
    with pytest.raises(TruthDiskFull):
        truth.append({"event": "x", "ts": time.time()})


def test_read_only_home(tmux: Tmux, tmpfs: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    pane = tmux.agent("readonly")
    fs = tmpfs()
    home = fs / "home"
    monkeypatch.setenv("DROVER_HOME", str(home))
    first = record(home)
    subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)

    res = drover_process("send", pane.address, "into a read-only home", "--json")
    assert res.code == 7, res.err
    error = res.json()["errors"][0]
    assert error["code"] == "truth_unwritable" and error["errno"] == "EROFS"
    assert "nothing was sent" in error["message"] and "Read-only file system" in error["message"]
    stays(lambda: pane.messages() == [], what="nothing delivered")

    listed = drover_process("log", "--json")
    assert listed.code == 0 and [m["id"] for m in listed.json()["data"]["messages"]] == [first]
    with pytest.raises(TruthUnwritable):
        TruthFile(home).append({"event": "x", "ts": time.time()})


def test_a_home_that_cannot_be_created(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = isolated / "a-file"
    blocker.write_text("not a directory", encoding="utf-8")
    monkeypatch.setenv("DROVER_HOME", str(blocker / "home"))
    doc = drover.run("sessions.message", {"id": "anyone", "text": "hello"})
    assert doc.exit_code == 7 and doc.errors[0]["code"] == "truth_unwritable"
    assert "nothing was sent" in doc.errors[0]["message"]


# -- neighbours: symlinks, other users, loose modes ---------------------------------------------------------------
def test_a_planted_symlink_is_refused_and_its_target_untouched(tmux: Tmux, isolated: Path) -> None:
    pane = tmux.agent("planted")
    home = home_of(isolated)
    home.mkdir(mode=0o700)
    elsewhere = isolated / "elsewhere"
    elsewhere.write_text("someone's file\n", encoding="utf-8")
    os.chmod(elsewhere, 0o600)
    (home / "truth.jsonl").symlink_to(elsewhere)
    before = elsewhere.stat()

    res = drover_process("send", pane.address, "must not land in elsewhere", "--json")
    assert res.code == 7, res.err
    error = res.json()["errors"][0]
    assert error["code"] == "truth_unsafe" and "is a symlink" in error["message"]
    assert elsewhere.read_text(encoding="utf-8") == "someone's file\n"
    assert elsewhere.stat().st_mtime_ns == before.st_mtime_ns and elsewhere.stat().st_size == before.st_size
    stays(lambda: pane.messages() == [], what="nothing delivered")

    listed = drover_process("log", "--json")  # a reader does not follow it either
    assert listed.code == 7 and listed.json()["errors"][0]["code"] == "truth_unsafe"

    # A dangling link: drover does not create the file it points to.
    (home / "truth.jsonl").unlink()
    (home / "truth.jsonl").symlink_to(isolated / "would-be-created")
    assert drover_process("send", pane.address, "no", "--json").code == 7
    assert not (isolated / "would-be-created").exists()


def test_a_home_symlink_is_followed_only_if_it_is_yours(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = isolated / "real-home"
    real.mkdir(mode=0o700)
    link = isolated / "linked-home"
    link.symlink_to(real)
    monkeypatch.setenv("DROVER_HOME", str(link))
    msg = record(link)  # yours: followed
    assert (real / "truth.jsonl").exists()
    assert [m["id"] for m in drover.run("messages.list", {}).data["messages"]] == [msg]

    os.lchown(link, NOBODY, NOBODY)  # planted by someone else: refused, for writers and readers
    with pytest.raises(TruthUnsafe, match="symlink made by uid 65534"):
        record(link)
    doc = drover.run("messages.list", {})
    assert doc.exit_code == 7 and doc.errors[0]["code"] == "truth_unsafe"


def test_a_file_owned_by_another_user_is_refused(tmux: Tmux, isolated: Path) -> None:
    pane = tmux.agent("foreign")
    home = home_of(isolated)
    record(home)
    path = home / "truth.jsonl"
    os.chown(path, NOBODY, NOBODY)
    before = path.read_bytes()
    res = drover_process("send", pane.address, "not into their file", "--json")
    assert res.code == 7
    error = res.json()["errors"][0]
    assert error["code"] == "truth_unsafe" and "belongs to uid 65534" in error["message"]
    assert path.read_bytes() == before
    stays(lambda: pane.messages() == [], what="nothing delivered")
    doc = drover.run("messages.list", {})
    assert doc.exit_code == 7 and "belongs to uid 65534" in doc.errors[0]["message"]


def test_a_home_owned_by_another_user_is_refused(isolated: Path) -> None:
    home = home_of(isolated)
    home.mkdir(mode=0o700)
    os.chown(home, NOBODY, NOBODY)
    with pytest.raises(TruthUnsafe, match="directory belongs to uid 65534"):
        record(home)
    assert not (home / "truth.jsonl").exists()


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_group_or_world_writable_file_is_refused(isolated: Path, mode: int) -> None:
    home = home_of(isolated)
    record(home)
    os.chmod(home / "truth.jsonl", mode)
    doc = drover.run("sessions.message", {"id": "anyone", "text": "hello"})
    assert doc.exit_code == 7
    assert doc.errors[0]["code"] == "truth_unsafe" and "writable by group or others" in doc.errors[0]["message"]
    assert "chmod 600" in doc.errors[0]["hint"]
    doc = drover.run("messages.list", {})
    assert doc.exit_code == 7 and doc.errors[0]["code"] == "truth_unsafe"


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o1777])
def test_a_group_or_world_writable_home_is_refused(isolated: Path, mode: int) -> None:
    home = home_of(isolated)
    record(home)
    os.chmod(home, mode)
    with pytest.raises(TruthUnsafe, match="writable by group or others"):
        record(home)
    doc = drover.run("messages.get", {"id": "msg_"})
    assert doc.exit_code == 7 and "chmod 700" in doc.errors[0]["hint"]


def test_a_fifo_in_place_of_the_file_does_not_hang(isolated: Path) -> None:
    home = home_of(isolated)
    home.mkdir(mode=0o700)
    os.mkfifo(home / "truth.jsonl", 0o600)
    with pytest.raises(TruthUnsafe, match="not a regular file"):
        TruthFile(home).query(5)
    with pytest.raises(TruthUnsafe, match="not a regular file"):
        record(home)


def test_new_files_are_private(isolated: Path) -> None:
    home = home_of(isolated)
    old = os.umask(0)
    try:
        record(home)
    finally:
        os.umask(old)
    assert stat.S_IMODE((home / "truth.jsonl").stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


# -- oversize refusals --------------------------------------------------------------------------------------------
def test_an_oversize_refusal_stores_hash_head_and_length_only(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = isolated / "fleet.toml"
    fleet.write_text("[limits]\nmax_chars = 5000\n", encoding="utf-8")
    monkeypatch.setenv("DROVER_FLEET", str(fleet))
    text = "".join(f"line {n}: {'é' * 40}\n" for n in range(2000))  # ~100,000 characters
    for _ in range(3):
        doc = drover.run("sessions.message", {"id": "anyone", "text": text})
        assert doc.exit_code == ExitCode.REFUSED and doc.data["code"] == "too_large"
    raw = (home_of(isolated) / "truth.jsonl").read_text(encoding="utf-8")
    assert len(raw) < 3 * (HEAD_CHARS + 1500)  # three refusals, not three copies of the text
    accepted = [json.loads(line) for line in raw.splitlines() if '"accepted"' in line]
    assert len(accepted) == 3
    for ev in accepted:
        assert ev["text"] == text[:HEAD_CHARS] and ev["text_truncated"] is True
        assert ev["text_chars"] == len(text)
        assert ev["text_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    shown = drover.run("messages.get", {"id": accepted[0]["id"]}).data["message"]
    assert shown["text_chars"] == len(text) and shown["outcome"] == "refused" and shown["code"] == "too_large"


# -- the message locks beside the record, and a record with another name -----------------------------------------
def test_planted_lock_symlinks_are_refused_naming_the_lock_and_nothing_is_left_pending(tmux: Tmux, isolated: Path) -> None:
    pane = tmux.agent("locked")
    home = home_of(isolated)
    record(home)
    locks = home / "locks"
    locks.mkdir(mode=0o700, exist_ok=True)
    victim = isolated / "victim"
    for slot in range(256):  # whichever slot the new message's id falls in
        lock = locks / f"slot-{slot:03d}.lock"
        lock.unlink(missing_ok=True)
        lock.symlink_to(victim)
    before = lines(home)
    res = drover_process("send", pane.address, "must not be left pending", "--json")
    assert res.code == 7, res.err
    error = res.json()["errors"][0]
    assert error["code"] == "truth_unsafe" and "/locks/slot-" in error["message"], error
    assert "truth.jsonl" not in error["message"]  # the lock is named, not the record
    assert lines(home) == before  # refused before its accepted event
    assert drover_process("log", "--pending", "--json").json()["data"]["messages"] == []
    assert not victim.exists()
    stays(lambda: pane.messages() == [], what="nothing delivered")
    # a lock that is a hard link to another file is refused as well
    for lock in locks.iterdir():
        lock.unlink()
    victim.write_text("theirs\n", encoding="utf-8")
    os.chmod(victim, 0o600)
    os.link(victim, locks / "slot-000.lock")
    doc = drover.run("sessions.message", {"id": "locked", "text": "no"})
    assert doc.exit_code == 7 and "slot-000.lock" in doc.errors[0]["message"] and "hard links" in doc.errors[0]["message"]
    assert victim.read_text(encoding="utf-8") == "theirs\n" and lines(home) == before


def test_a_lock_planted_after_the_check_is_recorded_as_the_messages_outcome(
    tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the check and the lock (a race): the message has its accepted event, so it gets its outcome too."""
    pane = tmux.agent("raced")
    home = home_of(isolated)
    record(home)
    (home / "locks").mkdir(mode=0o700)

    def plant(self: TruthFile) -> None:
        for slot in range(256):
            lock = self.home / "locks" / f"slot-{slot:03d}.lock"
            lock.unlink(missing_ok=True)
            lock.symlink_to(isolated / "victim")

    monkeypatch.setattr(TruthFile, "check_locks", plant)
    doc = drover.run("sessions.message", {"id": "raced", "text": "raced"})
    assert doc.exit_code == 5 and doc.data["outcome"] == "failed" and doc.data["code"] == "truth_unsafe", doc.data
    assert "/locks/slot-" in doc.data["detail"]
    assert drover.run("messages.list", {"pending": True}).data["messages"] == []
    [m] = [m for m in drover.run("messages.list", {}).data["messages"] if m["text"] == "raced"]
    assert m["outcome"] == "failed"
    stays(lambda: pane.messages() == [], what="nothing delivered")


def test_a_locks_folder_that_is_a_symlink_or_someone_elses_is_refused(tmux: Tmux, isolated: Path) -> None:
    pane = tmux.agent("folder")
    home = home_of(isolated)
    record(home)
    before = lines(home)
    theirs = isolated / "their-locks"
    theirs.mkdir(mode=0o700)
    (home / "locks").symlink_to(theirs)
    doc = drover.run("sessions.message", {"id": "folder", "text": "not through their folder"})
    assert doc.exit_code == 7 and doc.errors[0]["code"] == "truth_unsafe"
    assert "locks: it is a symlink" in doc.errors[0]["message"], doc.errors
    fleet = isolated / "nudges.toml"  # `nudge run` takes its lock in the same folder: refused the same way
    fleet.write_text('[[nudge]]\ntarget = "local:folder"\ntext = "hi"\nevery = "1h"\n', encoding="utf-8")
    run = drover_process("--fleet", str(fleet), "nudge", "run")
    assert run.code == 7 and "locks: it is a symlink" in run.err, run
    assert list(theirs.iterdir()) == [] and lines(home) == before
    (home / "locks").unlink()
    (home / "locks").mkdir(mode=0o700)
    os.chown(home / "locks", NOBODY, NOBODY)
    doc = drover.run("sessions.message", {"id": "folder", "text": "not in their folder"})
    assert doc.exit_code == 7 and "locks: the directory belongs to uid 65534" in doc.errors[0]["message"], doc.errors
    assert lines(home) == before
    stays(lambda: pane.messages() == [], what="nothing delivered")


def test_a_record_with_another_hard_link_is_refused_like_a_symlink(tmux: Tmux, isolated: Path) -> None:
    pane = tmux.agent("linked")
    home = home_of(isolated)
    record(home)
    os.link(home / "truth.jsonl", isolated / "another-name")
    before = (home / "truth.jsonl").read_bytes()
    res = drover_process("send", pane.address, "not into a file with two names", "--json")
    assert res.code == 7, res.err
    error = res.json()["errors"][0]
    assert error["code"] == "truth_unsafe" and "has 2 hard links" in error["message"], error
    listed = drover_process("log", "--json")  # readers refuse it too, as they refuse a symlink
    assert listed.code == 7 and listed.json()["errors"][0]["code"] == "truth_unsafe"
    assert (home / "truth.jsonl").read_bytes() == before
    stays(lambda: pane.messages() == [], what="nothing delivered")
