"""drover's layers, read from its source: no import loop among its modules, the daemon never reaches up into the
CLI, and the remote side (shipped alone to every host) imports only itself.

The graph is built from every module's `ast`, imports inside functions included (a lazy import is still a
dependency: it only moves the moment the loop bites).  Imports under `if TYPE_CHECKING:` are left out: they are
never run.  So is a module's import of its own ancestor package (`from drover import __version__` in drover.front):
Python runs a package before any module in it, whatever the module says, so that edge cannot close a loop."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from tests.conftest import ROOT
from tests.support.sources import tree

PACKAGE = ROOT / "drover"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in the tree, at any depth, but those only a type checker runs."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        if _type_checking(node):
            assert isinstance(node, ast.If)
            stack.extend(node.orelse)
            continue
        # Imports are statements: only statements (and the handlers and cases that hold them) can hold one, so the
        # walk never descends into expressions (the confusables tables are hundreds of thousands of those).
        stack.extend(c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt | ast.excepthandler | ast.match_case))
    return found


def imported(name: str, path: Path, known: set[str], ancestors: bool) -> set[str]:
    """The drover modules `name` (at `path`) imports: `from pkg import module` names the module, `from pkg import
    thing` the package; relative imports resolved against the module's package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _imports(tree(path)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            # `import a.b.c` (and `from a.b.c import x`) runs a.b.c: the edge is to the deepest module named.
            while target and target not in known:
                target = target.rpartition(".")[0]
            ancestor = name.startswith(target + ".")
            if target.startswith("drover") and target != name and (ancestors or not ancestor):
                out.add(target)
    return out


def graph(ancestors: bool = False) -> dict[str, set[str]]:
    """Each module's edges; with `ancestors`, imports of its own ancestor packages too (what the remote side,
    shipped without drover/__init__.py, must not have).  A copy of the graph built once per run."""
    return {name: set(targets) for name, targets in _graph(ancestors).items()}


@functools.cache
def _graph(ancestors: bool) -> dict[str, frozenset[str]]:
    mods = modules()
    known = set(mods)
    return {name: frozenset(imported(name, path, known, ancestors)) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def path_between(edges: dict[str, set[str]], start: str, goal: str) -> list[str]:
    """One import path from start to goal (breadth first), for the failure message."""
    seen = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges.get(v, ())):
            if w not in seen:
                seen[w] = [*seen[v], w]
                if w == goal:
                    return seen[w]
                queue.append(w)
    return []


def test_the_graph_sees_what_the_modules_import() -> None:
    """The parser itself: a lazy import inside a function, a relative import, `from pkg import module`."""
    edges = graph()
    assert "drover.cli.render" in edges["drover.cli.app"]  # `from drover.cli import render`
    assert "drover.daemon.autostart" in edges["drover.daemon.client"]  # imported inside a function
    assert "drover.remote.protocol" in edges["drover.remote.main"]
    assert all(not m.startswith("drover.remote.") or m in edges for m in edges["drover.remote.main"])
    assert "drover" not in edges["drover.front"] and "drover" in graph(ancestors=True)["drover.front"]
    loop = {"drover.x": {"drover.y"}, "drover.y": {"drover.z"}, "drover.z": {"drover.x"}, "drover.w": {"drover.x"}}
    assert cycles(loop) == [["drover.x", "drover.y", "drover.z"]]


def test_no_import_loop_among_drovers_modules() -> None:
    edges = graph()
    found = cycles(edges)
    described = [" -> ".join([*path_between(edges, c[0], c[1]), *path_between(edges, c[1], c[0])[1:]]) for c in found]
    assert found == [], "import loops: " + "; ".join(described)


def test_the_daemon_never_imports_the_cli() -> None:
    edges = graph()
    bad = {m: sorted(t for t in ts if t == "drover.cli" or t.startswith("drover.cli.")) for m, ts in edges.items()}
    bad = {m: ts for m, ts in bad.items() if ts and (m == "drover.daemon" or m.startswith("drover.daemon."))}
    assert bad == {}, bad


def test_the_remote_package_imports_only_itself() -> None:
    edges = graph(ancestors=True)
    remote = {m for m in edges if m == "drover.remote" or m.startswith("drover.remote.")}
    bad = {m: sorted(t for t in edges[m] if t not in remote) for m in remote}
    assert {m: ts for m, ts in bad.items() if ts} == {}
