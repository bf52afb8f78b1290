"""What a host's login shell prints before the helper's answer: a warning naming the host, unless the fleet accepts
it as that host's login banner (`banner_ok` under [hosts.NAME]).

HPC login nodes print a banner (usage policy, quotas, maintenance dates) from their rc files on every command,
non-interactive ones too.  The helper's framed answer is unharmed, but a warning on every command -- every cron
run -- teaches people to ignore warnings.  `banner_ok` accepts exactly the text its patterns match, whole: an
rc file that prints something else as well (an error, a changed banner) is still a warning.
"""

from __future__ import annotations

import asyncio
import json
import sys

# Longer output than this is no banner: it is warned about, never matched (a pattern's cost stays bounded).
MAX_BANNER_BYTES = 64 << 10
# How long the patterns may take on one text.  The host chooses the text: a pattern that backtracks badly on it
# ('(a|aa)+' on 'aaa...ab') would run for minutes, and Python's re can be neither interrupted nor run beside the
# event loop (it holds the GIL), so the match runs in a child process that is killed at this bound.
MATCH_TIMEOUT_S = 1.0
# What that child runs: the same fullmatch, in a bare interpreter (no site, no environment: it starts in ~15 ms).
_MATCHER = (
    "import json,re,sys;d=json.loads(sys.stdin.read());"
    "sys.stdout.write('1' if any(re.fullmatch(p,d['t'],re.DOTALL) for p in d['p']) else '0')"
)
# A process asks about one host's banner on every command: the answer is kept (the daemon lives long).
_answers: dict[tuple[bytes, tuple[str, ...]], bool | None] = {}
_MAX_ANSWERS = 256


def _text(noise: bytes) -> str:
    return noise.decode("utf-8", "replace").replace("\r\n", "\n").strip()


async def judge(noise: bytes, patterns: list[str], timeout: float = MATCH_TIMEOUT_S) -> bool | None:
    """Whether `noise` is a banner `patterns` accept: one of them matches all of it (`.` spans lines; line endings
    as \\n; the whitespace around it ignored).  None when the patterns took longer than `timeout` on it (then it
    is no accepted banner either).  Never blocks the event loop."""
    if not patterns or len(noise) > MAX_BANNER_BYTES:
        return False
    key = (noise, tuple(patterns))
    if key in _answers:
        return _answers[key]
    request = json.dumps({"t": _text(noise), "p": patterns}).encode()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-S", "-c", _MATCHER,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(request), timeout)
        answer: bool | None = out == b"1"
    except TimeoutError:
        answer = None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if len(_answers) >= _MAX_ANSWERS:
        _answers.clear()
    _answers[key] = answer
    return answer


def warning(host: str, noise: bytes, slow: bool = False) -> str:
    """The warning, naming its host (it reaches places that do not: `drover send`, cron's mail)."""
    if slow:
        return (
            f"the login shell on {host} printed {len(noise)} bytes before the helper's answer: {noise[:120]!r}, "
            f"and banner_ok under [hosts.{host}] took more than {MATCH_TIMEOUT_S:g}s to match it, so it is not "
            "accepted (a pattern that backtracks, such as (a|aa)+: write one that does not)"
        )
    return (
        f"the login shell on {host} printed {len(noise)} bytes before the helper's answer: {noise[:120]!r} "
        f"(if that is the host's login banner, accept it: banner_ok = ['PATTERN'] under [hosts.{host}])"
    )
