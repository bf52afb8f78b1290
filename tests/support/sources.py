"""drover's source as the suite's static checks read it (tests/test_imports_graph.py, tests/test_paths.py): each
module's syntax tree, parsed once per run.  Parsing all of drover costs ~0.3 s of CPU, and these checks asked for
it seven times in the fast tier; the files do not change while the suite runs."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def tree(path: Path) -> ast.Module:
    """The module at `path`, parsed (shared: read it, never change it)."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
