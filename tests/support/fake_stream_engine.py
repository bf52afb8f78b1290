"""A stand-in for `claude -p --input-format stream-json`, for the holder's own logic (what it counts as an
acknowledgement, what it resends): it answers each user line on stdin with the stream events Claude Code 2.1.328
emits, as MODE says -- `run` (queued, started, the isReplay echo, completed, a result), `queue` (busy in a turn
that never ends, each line queued only: held in its memory), `silent` (nothing).
The real claude is used by tests/test_headless.py."""

import json
import sys
import time


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "run"
    if mode == "queue":  # a turn that never ends: busy from the start
        sys.stdout.write(json.dumps({"type": "command_lifecycle", "command_uuid": "turn-0", "state": "started"}) + "\n")
        sys.stdout.flush()
    for raw in sys.stdin:
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        uid = line.get("uuid")
        events = []
        if mode in ("run", "queue"):
            events.append({"type": "command_lifecycle", "command_uuid": uid, "state": "queued"})
        if mode == "run":
            events.append({"type": "command_lifecycle", "command_uuid": uid, "state": "started"})
            events.append({"type": "user", "isReplay": True, "uuid": uid, "message": line.get("message")})
            events.append({"type": "command_lifecycle", "command_uuid": uid, "state": "completed"})
            events.append({"type": "result", "subtype": "success"})
        for ev in events:
            sys.stdout.write(json.dumps(ev) + "\n")
        sys.stdout.flush()
    if mode == "queue":  # stdin closed mid-turn (its holder killed): a turn goes on regardless
        time.sleep(3600)


if __name__ == "__main__":
    main()
