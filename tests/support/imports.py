"""What a drover command imports beyond the interpreter's own start-up, read from `python -X importtime`.

Judged against the same interpreter running nothing (`-c pass`, same environment): whatever site's hooks import or
merely try at start-up -- Debian's sitecustomize tries `import apport_python_hook`, an editable install adds its
finder -- is the interpreter's, not drover's, so only what drover itself pulls in is counted.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

STDLIB = set(sys.stdlib_module_names)
FRONT = {"drover", "drover.front", "drover.paths"}


def importtime_modules(stderr: str) -> set[str]:
    """The modules named in `-X importtime` output (attempts included: a failed import is still listed)."""
    names = {line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}
    return names - {"imported package"}


@functools.cache
def _startup(env_key: tuple[tuple[str, str], ...]) -> frozenset[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True, timeout=60, env=dict(env_key)
    )
    assert proc.returncode == 0, proc.stderr[-500:]
    return frozenset(importtime_modules(proc.stderr))


def startup_modules(env: dict[str, str] | None = None) -> frozenset[str]:
    """What this interpreter imports (or tries to) before running anything, in that environment."""
    return _startup(tuple(sorted((env if env is not None else os.environ).items())))


def foreign(imported: set[str], front: set[str] = FRONT, env: dict[str, str] | None = None) -> set[str]:
    """Modules drover imported that are neither the standard library nor the front."""
    own = imported - startup_modules(env)
    return {m for m in own if m.split(".")[0] not in STDLIB and m not in front and not m.startswith("_")}
