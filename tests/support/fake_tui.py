"""A stand-in for an agent TUI that draws a fixed screen (a real capture) and records every byte it is sent.

Installed by the tests under the engine's command name (bin/claude, bin/codex), with the test's fleet vouching for
that name (`[engines.claude] commands = ["claude"]`): a name alone is no evidence, so without that drover takes it
for `unknown` and types nothing (tests/test_identity.py).  The screen it draws is a real capture from
../shared/design/screens.  Like the real programs it shows what it is sent in its input box (the capture's last
`❯ `, `› ` or ` > ` line), so a paste is visible on screen before Enter.

With --events, it can also raise a dialog drawn at the TOP of its screen, far from its box: --dialog-top-ms after
each paste (or on SIGUSR1), or in answer to Enter instead of submitting (--dialog-on-enter).  Enter while the
dialog is up answers it (logged with how long it had been on screen), Esc closes it.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import termios
import time

DIALOG = ["Do you want to proceed?", "> 1. Yes", "  2. No", "Enter to confirm - Esc to cancel"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--screen", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--events", help="a JSON line per dialog drawn, answered or closed")
    parser.add_argument("--dialog-top-ms", type=float, default=-1.0)
    parser.add_argument("--dialog-on-enter", action="store_true")
    args = parser.parse_args()
    old = termios.tcgetattr(0)
    new = termios.tcgetattr(0)
    new[0] &= ~(termios.ICRNL | termios.IXON)
    new[3] &= ~(termios.ICANON | termios.ECHO | termios.ISIG | termios.IEXTEN)
    termios.tcsetattr(0, termios.TCSANOW, new)
    lines = open(args.screen, encoding="utf-8").read().rstrip("\n").split("\n")
    box = max((i for i, line in enumerate(lines) if line.startswith(("❯ ", "❯\u00a0", "› ", " > ")) or line == "❯"), default=None)
    typed = b""
    dialog_at: float | None = None  # when to draw the dialog (monotonic)
    shown_at: float | None = None  # when it was drawn: it is up

    def event(ev: str, **more: object) -> None:
        if args.events:
            with open(args.events, "a", encoding="utf-8") as f:
                f.write(json.dumps(dict(more, ev=ev)) + "\n")

    def draw() -> None:
        shown = list(lines)
        if shown_at is not None:
            shown[2 : 2 + len(DIALOG)] = DIALOG
        if box is not None and typed:
            text = typed.replace(b"\x1b[200~", b"").replace(b"\x1b[201~", b"").decode("utf-8", "replace")
            prefix = shown[box][:2] if shown[box].startswith(("❯", "›")) else " > "
            flat = text.replace("\n", " ⏎ ")
            shown[box] = prefix + (flat if len(flat) <= 150 else flat[:70] + " … " + flat[-70:])
        os.write(1, b"\x1b[?2004h\x1b[H\x1b[2J" + "\r\n".join(shown).encode("utf-8"))

    def open_dialog() -> None:
        nonlocal shown_at, dialog_at
        dialog_at, shown_at = None, time.monotonic()
        draw()
        event("dialog_drawn")

    signal.signal(signal.SIGUSR1, lambda *_: open_dialog())
    draw()
    with open(args.log, "ab") as log:
        log.write(b"")
        try:
            while True:
                wait = None if dialog_at is None else max(0.0, dialog_at - time.monotonic())
                if not select.select([0], [], [], wait)[0]:
                    if dialog_at is not None and time.monotonic() >= dialog_at:
                        open_dialog()
                    continue
                data = os.read(0, 65536)
                if not data:
                    break
                log.write(data)
                log.flush()
                if shown_at is not None:
                    # The dialog has the keyboard: Enter answers it, Esc closes it; the box keeps its text.
                    if b"\r" in data:
                        event("answered_by_enter", shown_ms=(time.monotonic() - shown_at) * 1000)
                    elif data != b"\x1b":
                        continue
                    shown_at = None
                    draw()
                    continue
                if b"\r" in data and args.dialog_on_enter:
                    open_dialog()
                    continue
                if b"\x1b[201~" in data and args.dialog_top_ms >= 0:
                    dialog_at = time.monotonic() + args.dialog_top_ms / 1000
                # Enter submits: the input box empties, as in the real programs (and Ctrl-U clears it).
                typed = b"" if b"\r" in data or data == b"\x15" else typed + data
                draw()
        finally:
            termios.tcsetattr(0, termios.TCSANOW, old)


if __name__ == "__main__":
    main()
