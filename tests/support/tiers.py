"""Which tests form the slow tier, read from their code so that a new test lands in the right tier by itself.

A test is slow when it, a fixture it asks for, or any function or class of the suite that these call names
something that starts a process or a real program (tmux, sshd, an agent, `python -m drover`) or watches the clock
(`sleep`, `stays`).  Code outside tests/ is not followed: drover's own functions start tmux only when a pane
exists, and a test that makes one names the fixture or helper that does.  What this cannot see (a test that is
slow by the sheer size of its data) carries `@pytest.mark.slow` itself.
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from typing import Any

import pytest

# The names, as the compiled code holds them (a global or an attribute: `subprocess.run` holds both parts).
STARTS_OR_WAITS = frozenset(
    {
        # processes
        "drover_process",
        "subprocess",
        "Popen",
        "fork",
        "forkpty",
        "execv",
        "multiprocessing",
        # the real programs, through the suite's own starters
        "Tmux",
        "SSHFleet",
        "ClaudeLab",
        "CodexLab",
        "GeminiLab",
        "module_lab",
        "own_server_lab",
        "app_server",
        # the clock
        "sleep",
        "stays",
    }
)
# Fixtures that start the real programs; the reading above finds them too, this names them for the reader.
SLOW_FIXTURES = frozenset({"tmux", "sshfleet", "ssh_fleet_started", "claude_binary", "claude_lab"})
# Every test's own fixture: it kills the tmux servers a test left, and costs nothing when there are none.
EVERY_TESTS = frozenset({"isolated"})
# Not followed: it returns as soon as its condition holds, so what it waits on decides (and is read on its own).
NOT_FOLLOWED = frozenset({"wait_for"})


def _codes(code: types.CodeType) -> Iterable[types.CodeType]:
    """A code object and those nested in it (inner functions, lambdas, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _ours(obj: Any) -> bool:
    return str(getattr(obj, "__module__", "") or "").split(".")[0] == "tests"


def reason(obj: Any, seen: set[int] | None = None) -> str | None:
    """The name that makes `obj` (a function or class of the suite) slow, followed through what it calls."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return None
    seen.add(id(obj))
    if isinstance(obj, type):
        for member in vars(obj).values():
            found = reason(getattr(member, "__func__", member), seen)  # a staticmethod or classmethod: its function
            if found:
                return f"{obj.__name__}.{found}"
        return None
    code = getattr(obj, "__code__", None)
    if code is None:
        return None
    scope = getattr(obj, "__globals__", {})
    for each in _codes(code):
        for name in each.co_names:
            if name in STARTS_OR_WAITS:
                return name
            called = None if name in NOT_FOLLOWED else scope.get(name)
            if called is not None and _ours(called) and (isinstance(called, type) or hasattr(called, "__code__")):
                found = reason(called, seen)
                if found:
                    return f"{name} -> {found}"
    return None


def why_slow(item: pytest.Item) -> str | None:
    names = set(getattr(item, "fixturenames", ()))
    if SLOW_FIXTURES & names:
        return f"fixture {sorted(SLOW_FIXTURES & names)[0]}"
    found = reason(getattr(item, "function", None))
    if found:
        return found
    info = getattr(item, "_fixtureinfo", None)
    for name, defs in (getattr(info, "name2fixturedefs", None) or {}).items():
        if name in EVERY_TESTS or not defs:
            continue
        func = defs[-1].func
        if _ours(func):
            found = reason(func)
            if found:
                return f"fixture {name}: {found}"
    return None


def mark_slow(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") is None and why_slow(item):
            item.add_marker(pytest.mark.slow)
