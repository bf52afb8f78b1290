"""Fault injection for tests: `DROVER_FAULT=STEP` kills this process with SIGKILL at that step of a send.

It is how the tests show that a crash at each step -- before or after the accepted event, after the paste, after
Enter, before the outcome is written -- leaves a record that `drover retry` finishes exactly once.  With the
variable unset (always, outside tests) fault() does nothing.
"""

import os
import signal


def fault(step: str) -> None:
    if os.environ.get("DROVER_FAULT") == step:
        os.kill(os.getpid(), signal.SIGKILL)
