"""Qualified function names (``Class.method``, ``f.<locals>.g``) for frames
of Python 3.10.

Python 3.11 gives every code object its ``co_qualname``, and py-spy reads it;
a 3.10 frame has only the bare name (``__getitem__``, ``wait``). dlwatch's
stacks, the hang doctor's causes (a ``Barrier.wait`` is a barrier, a bare
``wait`` is not), ``attach``'s iterator kind and the worker profile's stages
all read the qualified name. For a bare name it is looked up in the
function's source: the innermost ``def`` of that name whose lines hold the
frame's line, with its enclosing classes and functions, joined as Python
3.11 joins them. Stdlib only (both the job and the monitor use it): one
parse per file, cached; a file that cannot be read or parsed keeps the bare
name.
"""

from __future__ import annotations

import ast
import functools
import os
import threading
from types import CodeType

# Files parsed and kept (their defs: a few hundred tuples each at most).
MAX_FILES = 256
# One parse at a time: CPython 3.11's ast.parse keeps its recursion depth in
# interpreter state, and two threads parsing at once (the hang doctor reads
# its py-spy dumps side by side) can fail with "SystemError: AST constructor
# recursion depth mismatch" (fresh-clone run 88, Python 3.11.7).
_PARSE = threading.Lock()


def _fresh_lock_in_child() -> None:
    # A DataLoader worker forked while a dlwatch thread of the job parsed
    # would inherit the lock held, and its own sampler would wait forever.
    global _PARSE
    _PARSE = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_in_child)


def of_code(code: CodeType) -> str:
    """``code``'s qualified name: its own on Python >= 3.11."""
    q = getattr(code, "co_qualname", None)
    if isinstance(q, str):
        return q
    return qualify(code.co_name, code.co_filename, code.co_firstlineno)


@functools.lru_cache(maxsize=4096)
def qualify(name: str, filename: str, line: int) -> str:
    """The qualified name of the function ``name`` running at ``line`` of
    ``filename`` (a name that is already qualified, or ``<module>``,
    ``<lambda>`` and the like, comes back as it is)."""
    if not name or "." in name or name.startswith("<"):
        return name
    best: tuple[int, str] | None = None
    for first, last, n, q in _defs(filename):
        if n == name and first <= line <= last and (best is None or first >= best[0]):
            best = (first, q)
    return best[1] if best is not None else name


@functools.lru_cache(maxsize=MAX_FILES)
def _defs(filename: str) -> tuple[tuple[int, int, str, str], ...]:
    """Every function of the file: (first line, last line, name, qualified name);
    the first line is its first decorator's, as ``co_firstlineno`` is."""
    try:
        with open(filename, encoding="utf-8", errors="replace") as f:
            text = f.read()
        with _PARSE:
            tree = ast.parse(text, filename)
    except Exception:  # unreadable, not Python, too deep: the bare name stays
        return ()
    out: list[tuple[int, int, str, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                q = prefix + child.name
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                out.append((first, child.end_lineno or child.lineno, child.name, q))
                visit(child, q + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)  # an if, a try: no part of the name

    try:
        visit(tree, "")
    except RecursionError:
        return ()
    return tuple(out)
