"""bench/run's inbox rows: `drover send` to a real idle Claude Code (2.1.328, offline, tests/support/claudelab.py)
through its inbox, cold and through the daemon, next to a minimal independent sender writing the same envelope to
the same socket (bench/min_inbox_sender.py).  Each sample starts once the session is idle again (its reply to the
last message over), so every send meets an idle session: the case whose wait ends on Claude's own record."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from measure import Sample, run

from tests.support.claudelab import ClaudeLab, ensure_binary, own_server_lab

HERE = Path(__file__).resolve().parent


def rows(bench: Any, drover: list[str]) -> None:
    print("inbox send to an idle Claude Code")
    binary, why = ensure_binary()
    if binary is None:
        bench.notes.append(f"inbox rows: no Claude Code binary here ({why})")
        return
    for lab in own_server_lab(binary, "dbi-"):  # once; leaving the loop stops its tmux server and every Claude in it
        measure_lab(bench, lab, drover)


def measure_lab(bench: Any, lab: ClaudeLab, drover: list[str]) -> None:
    s = lab.start("inboxbench")
    record = lab.config / "sessions" / f"{s.pid}.json"
    env = {**bench.env, "CLAUDE_CONFIG_DIR": str(lab.config)}
    warm_env = {**bench.warm_env, "CLAUDE_CONFIG_DIR": str(lab.config)}

    def on_idle(cmd: Callable[[int], list[str]], env: dict[str, str]) -> Callable[[int], Sample]:
        def go(i: int) -> Sample:
            deadline = time.monotonic() + 60
            while s.status() != "idle" and time.monotonic() < deadline:
                time.sleep(0.05)
            return run(cmd(i), env, cwd=str(bench.root))

        return go

    minimal = on_idle(lambda i: [bench.python, str(HERE / "min_inbox_sender.py"), str(record), f"minimal {i}"], env)
    cold = on_idle(lambda i: [*drover, "send", "local:inboxbench", f"inbox message {i}"], env)
    got = bench.rounds({"drover send local:claude (inbox)": cold, "minimal inbox sender": minimal})
    peer = got["minimal inbox sender"]
    bench.rows.append(("send idle Claude, cold", got["drover send local:claude (inbox)"], "minimal inbox sender", peer, "(info)"))
    saved, bench.warm_env = bench.warm_env, warm_env  # the daemon's helper must see the lab's registry
    try:
        started = bench.daemon()
    finally:
        bench.warm_env = saved
    if not started:
        return
    warm = on_idle(lambda i: [*drover, "send", "local:inboxbench", f"warm inbox message {i}"], warm_env)
    warm(-1)  # starts the daemon's helper; not a sample
    got = bench.rounds({"drover send local:claude (inbox, daemon)": warm, "minimal inbox sender": minimal})
    bench.daemon_stop()
    warm_peer = got["minimal inbox sender"]
    bench.rows.append(
        (
            "send idle Claude, warm",
            got["drover send local:claude (inbox, daemon)"],
            "minimal inbox sender",
            warm_peer,
            "(info)",
        )
    )
    print(f"  ({len(s.peer_messages())} peer messages in the session's transcript)", file=sys.stderr)
