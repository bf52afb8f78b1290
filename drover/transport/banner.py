"""What a host's login shell prints before the helper's answer: a warning naming the host, unless the fleet accepts
it as that host's login banner (`banner_ok` under [hosts.NAME]).

HPC login nodes print a banner (usage policy, quotas, maintenance dates) from their rc files on every command,
non-interactive ones too.  The helper's framed answer is unharmed, but a warning on every command -- every cron
run -- teaches people to ignore warnings.  `banner_ok` accepts exactly the text its patterns match, whole: an
rc file that prints something else as well (an error, a changed banner) is still a warning.
"""

from __future__ import annotations

import re

# Longer output than this is no banner: it is warned about, never matched (a pattern's cost stays bounded).
MAX_BANNER_BYTES = 64 << 10


def accepted(noise: bytes, patterns: list[str]) -> bool:
    """Whether `noise` is a banner `patterns` accept: one of them matches all of it (`.` spans lines; line endings
    as \\n; the whitespace around it ignored)."""
    if not patterns or len(noise) > MAX_BANNER_BYTES:
        return False
    text = noise.decode("utf-8", "replace").replace("\r\n", "\n").strip()
    return any(re.fullmatch(pattern, text, re.DOTALL) for pattern in patterns)


def warning(host: str, noise: bytes) -> str:
    """The warning, naming its host (it reaches places that do not: `drover send`, cron's mail)."""
    return (
        f"the login shell on {host} printed {len(noise)} bytes before the helper's answer: {noise[:120]!r} "
        f"(if that is the host's login banner, accept it: banner_ok = ['PATTERN'] under [hosts.{host}])"
    )
