"""Where in fleet.toml's text a problem is: a key's line for pydantic's errors, and the values no fleet file holds.

Split from drover/fleet.py: the text-level checks (a NUL, nesting past any fleet's shape) and the line finder.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

# Deeper than any fleet's shape (a table of hosts, a list of tags, a nudge list): a nested array or table past
# this is hostile, and every walk over it (validation, an error's repr, a JSON dump) would recurse as deep.
MAX_DEPTH = 16


def _table_path(header: str) -> list[str]:
    parts = re.findall(r'"([^"]*)"|\'([^\']*)\'|([^.\s]+)', header)
    return [a or b or c for a, b, c in parts]


def locate(text: str, loc: tuple[Any, ...]) -> int | None:
    """The line number in the TOML text of the key at pydantic location `loc` (best effort)."""
    keys = [str(k) for k in loc]
    table: list[str] = []
    best: int | None = None
    arrays: dict[tuple[str, ...], int] = {}  # [[name]] tables seen so far: the next one's index in the list
    for number, line in enumerate(text.splitlines(), 1):
        array = re.match(r"^\s*\[\[\s*([^\[\]]+?)\s*\]\]\s*(#.*)?$", line)
        if array:
            name = tuple(_table_path(array.group(1)))
            table = [*name, str(arrays.get(name, 0))]  # pydantic's location of the list's item: name, index
            arrays[name] = arrays.get(name, 0) + 1
            if table == keys:
                return number
            if keys[: len(table)] == table or (best is None and table[: len(keys)] == keys):
                best = number  # the entry a missing key belongs in, or the first entry for the list itself
            continue
        header = re.match(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$", line)
        if header:
            table = _table_path(header.group(1))
            if table == keys:
                return number
            if keys[: len(table)] == table and (best is None or len(table) > 0):
                best = number
            continue
        assign = re.match(r"^\s*(\"[^\"]+\"|'[^']+'|[A-Za-z0-9_.-]+)\s*=", line)
        if assign:
            key_path = table + _table_path(assign.group(1))
            if keys[: len(key_path)] == key_path:
                return number
    return best


_CREDENTIALS = re.compile(r"://[^/?#\s]*@")


def problems(path: Path, text: str, exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = ".".join(str(part) for part in loc) or "(top level)"
        line = locate(text, loc)
        prefix = f"{path.name}:{line}" if line else path.name
        msg = err["msg"].removeprefix("Value error, ")  # our own validators' words, without pydantic's label
        if err["type"] == "extra_forbidden":
            msg = "unknown key (`drover fleet init --print` lists every key drover knows)"
        elif "input" in err and not isinstance(err["input"], dict | list) and not _CREDENTIALS.search(str(err["input"])):
            # (An address with user:password@ is never echoed: the password would land in logs and terminals.)
            msg = f"{msg} (got {err['input']!r})"
        out.append(f"{prefix}: {where}: {msg}")
    return out


def strange_values(data: Any, text: str, path: Path) -> list[str]:
    """What no fleet file holds, each with its line: a NUL in a key or string (no name, path or command may carry
    one: the OS cuts it there or refuses it), and arrays or tables nested deeper than MAX_DEPTH."""
    out: list[str] = []

    def where(loc: tuple[Any, ...], nul: bool = False) -> str:
        line = locate(text, loc)
        if nul and line is None:  # a key holding it names no line `locate` can match: its escape's line
            line = next((n for n, t in enumerate(text.splitlines(), 1) if re.search(r"\\(u0000|U00000000)", t)), None)
        return f"{path.name}:{line}" if line else path.name

    def walk(value: Any, loc: tuple[Any, ...]) -> None:
        if len(out) >= 5:
            return
        if len(loc) > MAX_DEPTH:
            out.append(f"{where(loc)}: {'.'.join(map(str, loc[:3]))}...: nested more than {MAX_DEPTH} deep: not a fleet file")
            return
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else None
        if items is None:
            if isinstance(value, str) and "\x00" in value:
                out.append(f"{where(loc, nul=True)}: {'.'.join(map(str, loc))}: holds a NUL character (\\u0000): no value may")
            return
        for key, item in items:
            if isinstance(key, str) and "\x00" in key:
                out.append(
                    f"{where(loc, nul=True)}: a key under {'.'.join(map(str, loc)) or '(top level)'} holds a NUL character"
                )
                continue
            walk(item, (*loc, key))

    walk(data, ())
    return out


def deep_line(text: str, path: Path) -> str:
    """The problem for a file the TOML parser could not descend: the line where its brackets first nest past
    MAX_DEPTH (strings and comments skipped), said as a fleet problem rather than a RecursionError."""
    depth, quote, number = 0, "", 1
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\n":
            number += 1
        if quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c == "#":
            while i + 1 < len(text) and text[i + 1] != "\n":
                i += 1
        elif c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                break
        elif c in "]}":
            depth = max(0, depth - 1)
        i += 1
    return f"{path.name}:{number}: arrays or tables nested more than {MAX_DEPTH} deep: not a fleet file"
