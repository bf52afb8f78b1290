"""A stand-in for an agent TUI that draws a fixed screen (a real capture) and records every byte it is sent.

Installed by the tests under the engine's command name (bin/claude, bin/codex), with the test's fleet vouching for
that name (`[engines.claude] commands = ["claude"]`): a name alone is no evidence, so without that drover takes it
for `unknown` and types nothing (tests/test_identity.py).  The screen it draws is a real capture from
../shared/design/screens.  Like the real programs it shows what it is sent in its input box (the capture's last
`❯ `, `› ` or ` > ` line), so a paste is visible on screen before Enter.
"""

from __future__ import annotations

import argparse
import os
import select
import termios


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--screen", required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    old = termios.tcgetattr(0)
    new = termios.tcgetattr(0)
    new[0] &= ~(termios.ICRNL | termios.IXON)
    new[3] &= ~(termios.ICANON | termios.ECHO | termios.ISIG | termios.IEXTEN)
    termios.tcsetattr(0, termios.TCSANOW, new)
    lines = open(args.screen, encoding="utf-8").read().rstrip("\n").split("\n")
    box = max((i for i, line in enumerate(lines) if line.startswith(("❯ ", "❯\u00a0", "› ", " > ")) or line == "❯"), default=None)
    typed = b""

    def draw() -> None:
        shown = list(lines)
        if box is not None and typed:
            text = typed.replace(b"\x1b[200~", b"").replace(b"\x1b[201~", b"").decode("utf-8", "replace")
            prefix = shown[box][:2] if shown[box].startswith(("❯", "›")) else " > "
            flat = text.replace("\n", " ⏎ ")
            shown[box] = prefix + (flat if len(flat) <= 150 else flat[:70] + " … " + flat[-70:])
        os.write(1, b"\x1b[?2004h\x1b[H\x1b[2J" + "\r\n".join(shown).encode("utf-8"))

    draw()
    with open(args.log, "ab") as log:
        log.write(b"")
        try:
            while True:
                select.select([0], [], [])
                data = os.read(0, 65536)
                if not data:
                    break
                log.write(data)
                log.flush()
                # Enter submits: the input box empties, as in the real programs.
                typed = b"" if b"\r" in data else typed + data
                draw()
        finally:
            termios.tcsetattr(0, termios.TCSANOW, old)


if __name__ == "__main__":
    main()
