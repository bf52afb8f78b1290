"""Host expressions, as pssh/clush users type them: `node[01-40]`, `h1,h3`, `h[1-3],!h2`, `!h2`.

One function, `expand`, turns the values of `--host` (and an op's `hosts`) into host names, parsed by ClusterShell's
NodeSet -- the field's own parser -- so a range means exactly what it means to clush:

- a value is a comma list of items; each item is a NodeSet (`node[01-40]`, `rack[1-2]-n[1-4]`, with NodeSet's own
  `!` difference, `&` intersection and `^` symmetric difference inside the item: `h[1-5]!h4`);
- an item that starts with `!` excludes its hosts from the whole selection, wherever it stands (as clush's -x);
- only exclusions (`!h2`) select every host of the fleet but those;
- every host an expression names, included or excluded, must be one the fleet knows: an unknown one is an error
  naming it (a typo in a range must not shrink a fan-out in silence).

NodeSet's `@group` syntax is refused: its groups come from /etc/clustershell, whose sources may run commands;
drover's own groups are tags (`--tag`).  A plain name (no `[`, `,`, `!`, `&`, `^`) never reaches NodeSet.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from drover.errors import UnknownHost, UsageError

SPECIAL = re.compile(r"[\[\],!&^@]")
# What one expression may name before it is expanded: NodeSet builds every name of a range in memory, so
# `h[1-999999999]` is refused from its text, before NodeSet sees it.
MAX_NAMED = 100_000
_RANGE = re.compile(r"\[([^\[\]]*)\]")
_PIECE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*(?:/\s*(\d+)\s*)?)?$")


def is_expression(value: str) -> bool:
    """Whether `value` is more than one plain host name."""
    return bool(SPECIAL.search(value))


def _split_items(value: str) -> list[str]:
    """The comma list's items: commas inside brackets (`h[1,3]`) belong to their item."""
    items, depth, start = [], 0, 0
    for at, char in enumerate(value):
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            items.append(value[start:at])
            start = at + 1
    items.append(value[start:])
    return [item.strip() for item in items]


def _named(item: str) -> int:
    """An upper bound on how many names `item` expands to, read from its text alone (0: not a range we can read;
    NodeSet then says what is wrong with it)."""
    total = 1
    for group in _RANGE.findall(item):
        count = 0
        for piece in group.split(","):
            m = _PIECE.match(piece)
            if not m:
                return 0
            low, high, step = int(m.group(1)), int(m.group(2) or m.group(1)), int(m.group(3) or 1)
            count += max(0, high - low) // max(step, 1) + 1
        total *= count
    return total


def _nodeset(item: str, value: str) -> list[str]:
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

    if "@" in item:
        raise UsageError(
            f"--host {value!r}: @groups are not host names here",
            hint="drover's groups are tags: --tag TAG (fleet.toml's tags = [...])",
        )
    if sum(_named(part) for part in re.split(r"[!&^]", item)) > MAX_NAMED:
        raise UsageError(f"--host {value!r} names more than {MAX_NAMED} hosts", hint="no fleet is that large: check the range")
    try:
        return list(NodeSet(item, resolver=RESOLVER_NOGROUP))
    except NodeSetException as exc:
        raise UsageError(
            f"--host {value!r} is not a host expression: {exc}",
            hint="e.g. node[01-40], h1,h3, or h[1-3],!h2 (a host list, a range, and ! to leave hosts out)",
        ) from None


def _parse(values: list[str]) -> tuple[list[str] | None, set[str]]:
    """(the hosts included, in order -- None when there are only exclusions --, the hosts excluded)."""
    included: list[str] = []
    excluded: set[str] = set()
    only_exclusions = True
    for value in values:
        if not is_expression(value):
            included.append(value)
            only_exclusions = False
            continue
        items = _split_items(value)
        if any(not item or item == "!" for item in items):
            raise UsageError(f"--host {value!r} has an empty item", hint="e.g. h[1-3],!h2: no empty item between commas")
        for item in items:
            exclude = item.startswith("!")
            names = _nodeset(item[1:] if exclude else item, value)
            if exclude:
                excluded.update(names)
            else:
                included.extend(names)
                only_exclusions = False
    return (None if only_exclusions else included), excluded


def _where(name: str, values: list[str]) -> str:
    """The value that named `name` (for the error that says so)."""
    for value in values:
        if not is_expression(value):
            if value == name:
                return value
            continue
        for item in _split_items(value):
            if name in _nodeset(item.removeprefix("!"), value):
                return value
    return values[0]


def expand(values: Iterable[str], known: Sequence[str]) -> list[str]:
    """The hosts `values` select, each once: in the order first named, a range in its own order.

    `known` is the fleet's hosts: every name an expression holds must be one of them (UnknownHost names those that
    are not), and exclusions alone select all of them but the excluded.  An expression that selects nothing
    (`h1,!h1`) is a usage error, never an empty fan-out.  Without any expression the values come back as they are
    (the caller checks plain names as it always did)."""
    values = list(values)
    if not any(is_expression(value) for value in values):
        return values
    included, excluded = _parse(values)
    unknown = sorted({*(included or []), *excluded} - set(known))
    if unknown:
        shown = ", ".join(repr(n) for n in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise UnknownHost(
            f"unknown host{'s' if len(unknown) > 1 else ''} {shown} (named by --host {_where(unknown[0], values)!r})",
            hint=f"known hosts: {', '.join(known)}; add one with `drover fleet add`",
        )
    chosen = [name for name in dict.fromkeys(known if included is None else included) if name not in excluded]
    if not chosen:
        raise UsageError(f"--host {' '.join(values)!r} selects no host: every host it names is excluded")
    return chosen


def matcher(values: Iterable[str]) -> Callable[[str], bool]:
    """Whether a host is one `values` select, with no fleet to check names against: for the record (`drover log
    --host`), which still holds the messages to hosts the fleet has since dropped."""
    values = list(values)
    included, excluded = _parse(values)
    wanted = None if included is None else set(included)
    return lambda host: (wanted is None or host in wanted) and host not in excluded
