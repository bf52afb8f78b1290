"""Fault injection for tests: `DROVER_FAULT=STEP` kills this process with SIGKILL at that step of a send.

It is how the tests show that a crash at each step -- before or after the accepted event, after the paste, after
Enter, before the outcome is written -- leaves a record that `drover retry` finishes exactly once.

`DROVER_FAULT=hold:STEP` with `DROVER_FAULT_GATE=PATH` holds the send at that step instead: it writes PATH.held
(so the test knows the send is there), then waits until PATH exists and goes on.  So a test can do something --
kill -9 the daemon's client, say -- while a send is at a known step, rather than racing it.

With the variables unset (always, outside tests) fault() does nothing.
"""

import os
import signal
import time

HOLD_LIMIT_S = 600.0  # a test that forgot its gate does not leave a send held for ever


def fault(step: str) -> None:
    want = os.environ.get("DROVER_FAULT")
    if not want:
        return
    if want == step:
        os.kill(os.getpid(), signal.SIGKILL)
    elif want == "hold:" + step:
        gate = os.environ.get("DROVER_FAULT_GATE")
        if gate:
            _hold(gate)


def _hold(gate: str) -> None:
    with open(gate + ".held", "w") as f:
        f.write("%d %s\n" % (os.getpid(), time.time()))
    deadline = time.monotonic() + HOLD_LIMIT_S
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
