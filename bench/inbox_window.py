"""How long after a message line is written Claude Code's negative receipts arrive, for a BUSY session.

drover ends its wait for a busy Claude after this window (drover/remote/inbox.py, BUSY_RECEIPT_WINDOW_S): an
accepted message to a busy session gets no receipt and does not reach the transcript until the turn ends, so
silence past the window is all the evidence there is.  This measures the window on the real binary (2.1.328,
offline, tests/support/claudelab.py): sessions held busy by a slow fake API, a message per trial from a process
of its own (a reply socket of its own: receipts are coalesced and rate-limited per sender address), for
`refused` (crossSessionInbound = refuse), `held` (= hold) and `dropped` (a duplicate of a queued message; at most
QUEUE_ROOM trials).  Each time runs from before the connection to the receipt, so it includes the write.

    PYTHONPATH=. .venv/bin/python bench/inbox_window.py [TRIALS]     # TRIALS per kind, default 50
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import wait_for
from tests.support.claudelab import ClaudeSession, ensure_binary, own_server_lab


def _line(rec: dict, reply: str, text: str) -> bytes:
    sock = rec["messagingSocketPath"]
    key = Path(rec["_dir"]) / f"{rec['pid']}.{hashlib.sha256(sock.encode()).hexdigest()}.key"
    token = json.loads(key.read_text())["peerToken"]
    envelope = '<cross-session-message from="uds:%s" from-name="bench" from-mode="prompting">\n%s\n</cross-session-message>'
    msg = {
        "msgV": 1,
        "msg_id": str(uuid.uuid4()),
        "type": "user",
        "message": {"role": "user", "content": envelope % (reply, text)},
        "priority": "next",
        "from": "uds:" + reply,
    }
    return (json.dumps({"type": "auth", "token": token}) + "\n" + json.dumps(msg) + "\n").encode()


def _trial(rec: dict, texts: list[str], out: int) -> None:
    """In a child: send each text (the last one timed), and write (seconds to its receipt or -1) to `out`."""
    reply = os.path.join(os.path.dirname(rec["messagingSocketPath"]), f"{os.getpid()}.sock")
    if os.path.exists(reply):
        os.unlink(reply)  # left by a process that had our pid
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(reply)
    listener.listen(4)
    took = -1.0
    try:
        for i, text in enumerate(texts):
            start = time.monotonic()
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(rec["messagingSocketPath"])
            conn.sendall(_line(rec, reply, text))
            conn.shutdown(socket.SHUT_WR)
            while conn.recv(4096):
                pass
            conn.close()
            if i < len(texts) - 1:
                continue
            listener.settimeout(10.0)
            try:
                got, _ = listener.accept()
                got.settimeout(2)
                data = got.recv(65536)
                took = time.monotonic() - start
                sys.stderr.write(f"{data.decode(errors='replace').strip()[:160]} {took * 1000:.1f} ms\n")
            except TimeoutError:
                pass
    finally:
        os.unlink(reply)
        os.write(out, f"{took:f}\n".encode())
        os._exit(0)


USED: set[int] = set()


def measure(rec: dict, texts: list[str]) -> float:
    """One trial from a child process whose pid no earlier trial had: Claude coalesces receipts per (sender
    address, pid, reason), and a reused pid is a reused address -- its receipt would come late by design."""
    while True:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            if os.getpid() in USED:
                os.write(w, b"again")
                os._exit(0)
            _trial(rec, texts, w)
        os.close(w)
        data = os.read(r, 100)
        os.close(r)
        os.waitpid(pid, 0)
        USED.add(pid)
        if data != b"again":
            return float(data)


# Each duplicate's first copy stays queued behind the turn, and Claude queues at most 50 peer messages: past that
# the first copy is dropped `queue-full` and the second is no duplicate (its receipt, coalesced, comes late).
QUEUE_ROOM = 45


def busy(s: ClaudeSession) -> dict:
    s.lab.tmux("send-keys", "-t", s.pane, "-l", "a slow turn")
    wait_for(lambda: "a slow turn" in s.screen(), timeout=20, what="the typed prompt")
    s.lab.tmux("send-keys", "-t", s.pane, "Enter")
    wait_for(lambda: s.status() == "busy", timeout=30, what="the turn to start")
    rec = s.record() or {}
    rec["_dir"] = str(s.lab.config / "sessions")
    return rec


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    binary, why = ensure_binary()
    assert binary, why
    results: dict[str, list[float]] = {}
    for lab in own_server_lab(binary, "dib-"):
        kinds = {
            "refused": lab.start("refusing", project_settings={"crossSessionInbound": "refuse"}, delay=3600),
            "held": lab.start("holding", project_settings={"crossSessionInbound": "hold"}, delay=3600),
            "dropped": lab.start("dup", delay=3600),
        }
        recs = {k: busy(s) for k, s in kinds.items()}
        for n in range(trials):
            for kind, rec in recs.items():
                if kind == "dropped" and n >= QUEUE_ROOM:
                    continue
                text = f"trial {n} {kind} {uuid.uuid4()}"
                # a duplicate: the same words twice from one sender, the first queued behind the turn
                texts = [text, text] if kind == "dropped" else [text]
                results.setdefault(kind, []).append(measure(rec, texts))
                assert kinds[kind].status() == "busy"
    report = {"load": os.getloadavg(), "trials_per_kind": trials}
    for kind, values in results.items():
        got = [v for v in values if v >= 0]
        report[kind] = {
            "missing": len(values) - len(got),
            "min_ms": round(min(got) * 1000, 1),
            "p50_ms": round(pct(got, 0.5) * 1000, 1),
            "p99_ms": round(pct(got, 0.99) * 1000, 1),
            "max_ms": round(max(got) * 1000, 1),
        }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
