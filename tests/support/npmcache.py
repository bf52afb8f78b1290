"""The real agent CLIs the tests run come from npm, installed once into ~/.cache/drover-test/NAME-VERSION.

Shared by claudelab, codexlab and geminilab: stdlib only, because scripts/test.sh imports them before the
project's own packages are installed.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

# How long a lab waits for an agent CLI to come up (its first idle screen, its registry record, a start-up dialog).
# A cold start of Claude Code, Codex or gemini-cli takes a few seconds on a quiet machine and well over 30 s at a load
# average of 15-20 on two cores; the bound is there only so that a program that never starts fails the test.
START_S = 120.0


def cache_root() -> Path:
    home = pwd.getpwuid(os.getuid()).pw_dir  # not $HOME: tests move HOME around
    return Path(os.environ.get("DROVER_TEST_CACHE") or os.path.join(home, ".cache", "drover-test"))


def npm_install(package: str, prefix: Path, expect: Path) -> str:
    """Install `package` under `prefix` unless `expect` is already there: "" when it is, else why not."""
    if expect.exists():
        return ""
    if not shutil.which("npm"):
        return "npm is not installed (the README's test command installs it)"
    prefix.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(prefix), package],
            capture_output=True,
            text=True,
            timeout=1200,
        )
    except subprocess.TimeoutExpired:
        return f"npm install {package} timed out"
    if proc.returncode != 0 or not expect.exists():
        return f"npm install {package} failed: {proc.stderr.strip()[-500:]}"
    return ""


def unshare_works() -> str:
    """ "" when this process may make network namespaces (each lab's sessions run offline in one), else why not."""
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"unshare -n does not work here (needs root or user namespaces): {probe.stderr.strip()}"
    return ""
