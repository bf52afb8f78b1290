"""bench/run's queue rows: `drover send` to a real idle Codex TUI (0.169, offline, tests/support/codexlab.py) through
its queue lane, cold and through the daemon, next to the very `codex queue --thread ID --message=TEXT` drover runs,
with the thread's own HOME, CODEX_HOME and PATH (drover/remote/codex_queue.py).  Each sample starts once the thread
is idle again (the turn the last message started is over), so every send meets an idle thread.

What the pair measures differently, on purpose: `codex queue` returns once the message is enqueued; drover also
discovers the pane and its thread, reads the thread's status and Codex's queue before it queues, and waits until
the thread's rollout shows its message id (`verified`): the rollout is the only evidence that the message ran."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from measure import Sample, run

from drover.remote import codex
from drover.remote.codex_appserver import AppServerError, call
from tests.support.codexlab import CodexLab, ensure_binary, wait_for


def rows(bench: Any, drover: list[str]) -> None:
    print("queue send to an idle Codex")
    binary, why = ensure_binary()
    if binary is None:
        bench.notes.append(f"queue rows: no Codex binary here ({why})")
        return
    root = bench.root / "cx"  # short: the lab's tmux and app-server sockets live under it
    root.mkdir()
    lab = CodexLab(root, binary)
    link = Path(bench.env["TMUX_TMPDIR"]) / f"tmux-{os.getuid()}" / "codexlab"
    try:
        # drover finds the lab's panes through the bench's TMUX_TMPDIR, as a user's drover finds their tmux server.
        link.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        link.symlink_to(lab.socket)
        measure_lab(bench, lab, drover)
    finally:
        link.unlink(missing_ok=True)
        lab.close()


def thread_of(lab: CodexLab, cwd: Path) -> str:
    """The pane's thread, from the app-server (a fresh TUI's thread is loaded before it has a rollout)."""
    home = str(lab.codex_home)

    def look() -> str | None:
        try:
            listing = call(home, [("thread/loaded/list", {})], 3.0)[0]
        except AppServerError:  # its daemon still starting
            return None
        for tid in (listing.get("result") or {}).get("data") or []:
            thread = codex.read_thread(home, str(tid)) or {}
            if thread.get("cwd") == str(cwd) and not thread.get("ephemeral"):
                return str(tid)
        return None

    return str(wait_for(look, 60, "the Codex pane's thread"))


def measure_lab(bench: Any, lab: CodexLab, drover: list[str]) -> None:
    bindir = lab.root / "bin"  # the `codex` a person's shell finds on the TUI's PATH (node is in /usr/bin)
    bindir.mkdir()
    (bindir / "codex").symlink_to(lab.binary)
    path = f"{bindir}:/usr/bin:/bin"
    s = lab.start("queuebench", path=path)
    tid = s.thread_id = thread_of(lab, s.cwd)
    home = str(lab.codex_home)
    # The command drover's helper runs (codex_queue.deliver): the TUI's HOME, CODEX_HOME and PATH, cwd its home.
    queue_env = {**bench.env, "HOME": str(lab.home), "CODEX_HOME": home, "PATH": path}

    def idle() -> None:
        """Until the thread is idle and its queue empty: the turn the last message started is over."""
        wait_for(
            lambda: codex.status_of(codex.read_thread(home, tid) or {}) == "idle" and not codex.queued(home, tid),
            60,
            "the Codex thread to go idle",
            interval=0.05,
        )

    sent: list[str] = []  # drover's texts, to count in the rollout at the end

    def on_idle(cmd: Callable[[int], list[str]], env: dict[str, str], cwd: str) -> Callable[[int], Sample]:
        def go(i: int) -> Sample:
            idle()
            argv = cmd(i)
            if "send" in argv:
                sent.append(argv[-1])
            return run(argv, env, cwd=cwd)

        return go

    peer_name = "codex queue (same argv, env)"
    peer = on_idle(lambda i: [str(bindir / "codex"), "queue", "--thread", tid, f"--message=codex queue {i}"], queue_env, home)
    cold = on_idle(lambda i: [*drover, "send", "local:queuebench", f"cold queue message {i}"], bench.env, str(bench.root))
    first = cold(-1)  # the thread's first message starts its rollout; not a sample
    if first.code != 0:
        bench.notes.append(f"queue rows: the first drover send failed: {(first.err or first.out).strip()[-300:]}")
        return
    got = bench.rounds({"drover send local:codex (queue)": cold, peer_name: peer})
    bench.rows.append(("send idle Codex, cold", got["drover send local:codex (queue)"], peer_name, got[peer_name], "(info)"))
    if not bench.daemon():
        return
    warm = on_idle(lambda i: [*drover, "send", "local:queuebench", f"warm queue message {i}"], bench.warm_env, str(bench.root))
    warm(-1)  # starts the daemon's helper; not a sample
    got = bench.hidden_cpu(
        "warm queue send", [], lambda: bench.rounds({"drover send local:codex (queue, daemon)": warm, peer_name: peer})
    )
    bench.daemon_stop()
    idle()
    bench.rows.append(
        ("send idle Codex, warm", got["drover send local:codex (queue, daemon)"], peer_name, got[peer_name], "<= 1.3x")
    )
    seen = "\n".join(s.user_messages())
    ran = sum(1 for text in sent if text in seen)
    bench.notes.append(f"queue rows: {ran} of drover's {len(sent)} sends ran as turns (the thread's rollout shows them)")
