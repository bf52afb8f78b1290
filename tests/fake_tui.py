"""A stand-in for an agent TUI that draws a fixed screen (a real capture) and records every byte it is sent.

Installed by the tests under the engine's command name (bin/claude, bin/codex) so drover's process-tree
detection sees that engine; the screen it draws is a real capture from ../shared/design/screens.
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
    screen = open(args.screen, encoding="utf-8").read().rstrip("\n")
    os.write(1, b"\x1b[?2004h\x1b[H\x1b[2J" + screen.replace("\n", "\r\n").encode("utf-8"))
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
        finally:
            termios.tcsetattr(0, termios.TCSANOW, old)


if __name__ == "__main__":
    main()
