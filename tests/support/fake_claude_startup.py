"""A stand-in for Claude Code's start-up, for the spawn race: its registry says idle, then it draws a dialog.

Measured on the real Claude Code 2.1.328 (docs/lanes.md): at start-up its registry record goes `idle` 14-48 ms
before it draws the "Make auto mode your default?" dialog, and says `waiting` ("dialog open") a few ms after; a
message through its inbox while that dialog is up dismisses it.  The real program's gap is too short for a test to
land in on purpose, so this one draws its dialog --dialog-after-ms after its record says idle, as a wider gap.

It is what drover takes for a Claude Code session: a process run under the name `claude` with a registry record
for its pid and start time (in $CLAUDE_CONFIG_DIR/sessions), and an inbox socket it listens on itself.  It draws
real captures (the idle screen, the dialog), and logs JSON lines: `idle`, `dialog_drawn`, and each inbox line as
`message` with whether the dialog was up -- a message while it is up dismisses it (`dismissed`), as Claude's does.

    python3 .../claude --name NAME --sock PATH --log PATH --idle SCREEN --dialog SCREEN --dialog-after-ms N
        [--record-stays-idle]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import time
import uuid


def proc_start() -> str:
    with open("/proc/self/stat", encoding="utf-8") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--sock", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--idle", required=True)
    parser.add_argument("--dialog", required=True)
    parser.add_argument("--dialog-after-ms", type=float, default=300.0)
    # A Claude whose record does not say it waits while its dialog is up: the screen alone shows it.
    parser.add_argument("--record-stays-idle", action="store_true")
    args = parser.parse_args()
    config = os.environ["CLAUDE_CONFIG_DIR"]
    os.makedirs(os.path.join(config, "sessions"), exist_ok=True)
    path = os.path.join(config, "sessions", f"{os.getpid()}.json")
    now_ms = int(time.time() * 1000)
    record = {
        "pid": os.getpid(),
        "sessionId": str(uuid.uuid4()),
        "cwd": os.getcwd(),
        "startedAt": now_ms,
        "procStart": proc_start(),
        "version": "2.1.328",
        "kind": "interactive",
        "entrypoint": "cli",
        "messagingSocketPath": args.sock,
        "name": args.name,
        "nameSource": "user",
    }

    def event(ev: str, **more: object) -> None:
        with open(args.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(dict(more, ev=ev, t=time.monotonic())) + "\n")

    def status(state: str, waiting_for: str | None = None) -> None:
        record.update(status=state, updatedAt=int(time.time() * 1000), statusUpdatedAt=int(time.time() * 1000))
        record.pop("waitingFor", None)
        if waiting_for:
            record["waitingFor"] = waiting_for
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(tmp, path)  # whole, never torn: drover reads it at any moment

    def draw(screen: str) -> None:
        with open(screen, encoding="utf-8") as f:
            lines = f.read().rstrip("\n").split("\n")
        os.write(1, b"\x1b[H\x1b[2J" + "\r\n".join(lines).encode("utf-8"))

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.sock)
    listener.listen(8)
    draw(args.idle)
    status("idle")
    event("idle")
    dialog_at: float | None = time.monotonic() + args.dialog_after_ms / 1000
    up = False
    try:
        while True:
            wait = None if dialog_at is None else max(0.0, dialog_at - time.monotonic())
            if not select.select([listener], [], [], wait)[0]:
                if dialog_at is not None and time.monotonic() >= dialog_at:
                    dialog_at, up = None, True
                    draw(args.dialog)
                    event("dialog_drawn")
                    if not args.record_stays_idle:
                        time.sleep(0.01)  # Claude's record follows its screen by a few ms
                        status("waiting", "dialog open")
                continue
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(5)
                data = b""
                try:
                    while True:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                except OSError:
                    pass
            for line in data.decode("utf-8", "replace").splitlines():
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(msg, dict) or msg.get("type") != "user":
                    continue
                event("message", dialog_up=up, content=str((msg.get("message") or {}).get("content"))[:200])
                if up:  # what the real one does with its start-up dialog: gone, unanswered
                    up = False
                    draw(args.idle)
                    status("idle")
                    event("dismissed")
    finally:
        for gone in (path, args.sock):
            try:
                os.unlink(gone)
            except OSError:
                pass


if __name__ == "__main__":
    main()
