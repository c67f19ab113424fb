"""Qualified names from the source, for Python 3.10's bare frame names: they
must be the names Python 3.11 itself gives (``__qualname__``)."""

from __future__ import annotations

import functools
import textwrap

from dlwatch import qualnames


def _decorated(f):
    @functools.wraps(f)
    def inner(*a, **k):
        return f(*a, **k)

    return inner


class Shards:
    def __getitem__(self, i):
        return i

    class Inner:
        @staticmethod
        @_decorated
        def wait():
            return 1


def outer():
    def helper():
        return 2

    return helper


class Other:
    def __getitem__(self, i):  # the same name in another class: told by its lines
        return -i


def test_each_function_gets_the_name_python_itself_qualifies_it_with():
    fns = [
        Shards.__getitem__,
        Shards.Inner.wait.__wrapped__,
        outer,
        outer(),
        Other.__getitem__,
        _decorated,
    ]
    for fn in fns:
        code = fn.__code__
        # the 3.10 path: the bare name, the file and the code's first line
        assert qualnames.qualify(code.co_name, code.co_filename, code.co_firstlineno) == fn.__qualname__
        assert qualnames.of_code(code) == fn.__qualname__
    # A line inside the body finds the same function (py-spy gives the running line).
    code = Other.__getitem__.__code__
    assert qualnames.qualify("__getitem__", code.co_filename, code.co_firstlineno + 1) == "Other.__getitem__"


def test_what_cannot_be_qualified_keeps_its_name(tmp_path):
    src = tmp_path / "job.py"
    src.write_text(
        textwrap.dedent(
            """
            if True:
                class Matmuls:
                    async def __getitem__(self, i):
                        return i
            """
        )
    )
    assert qualnames.qualify("__getitem__", str(src), 4) == "Matmuls.__getitem__"  # an if is no part of it
    assert qualnames.qualify("__getitem__", str(src), 1) == "__getitem__"  # not within its lines
    assert qualnames.qualify("missing", str(src), 4) == "missing"
    assert qualnames.qualify("wait", str(tmp_path / "gone.py"), 3) == "wait"  # unreadable
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n")
    assert qualnames.qualify("f", str(bad), 1) == "f"  # not Python
    assert qualnames.qualify("<module>", str(src), 1) == "<module>"
    assert qualnames.qualify("Barrier.wait", str(src), 1) == "Barrier.wait"  # already qualified
