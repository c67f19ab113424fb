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


def _ast_with(parse):
    """The ast module as qualnames sees it, with another parse (pytest's own
    parsing, for assertion rewriting, keeps the real one)."""
    import ast
    import types

    fake = types.ModuleType("ast")
    fake.__dict__.update(ast.__dict__)
    fake.parse = parse
    return fake


def test_files_are_parsed_one_at_a_time(tmp_path, monkeypatch):
    # The hang doctor qualifies py-spy dumps side by side; two ast.parse at
    # once on CPython 3.11 can raise "AST constructor recursion depth
    # mismatch" (fresh-clone run 88). Each parse here holds the floor a while.
    import ast
    import threading
    import time

    real, inside, most = ast.parse, [0], [0]

    def slow_parse(*a, **kw):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.02)
        try:
            return real(*a, **kw)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(qualnames, "ast", _ast_with(slow_parse))
    files = []
    for i in range(6):
        f = tmp_path / f"m{i}.py"
        f.write_text(f"class C{i}:\n    def run(self):\n        return {i}\n")
        files.append(str(f))
    got: dict = {}
    threads = [
        threading.Thread(target=lambda f=f: got.__setitem__(f, qualnames.qualify("run", f, 2))) for f in files
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
    assert [got[f] for f in files] == [f"C{i}.run" for i in range(6)]


def test_a_parser_failure_keeps_the_bare_name(tmp_path, monkeypatch):
    def broken(*a, **kw):
        raise SystemError("AST constructor recursion depth mismatch (before=39, after=35)")

    monkeypatch.setattr(qualnames, "ast", _ast_with(broken))
    src = tmp_path / "job.py"
    src.write_text("class C:\n    def run(self):\n        pass\n")
    assert qualnames.qualify("run", str(src), 2) == "run"


def test_a_child_forked_while_a_file_is_parsed_can_parse(tmp_path):
    # A worker forked while a thread of the job holds the parse lock gets a
    # lock of its own, not one held forever.
    import os

    src = tmp_path / "w.py"
    src.write_text("class W:\n    def step(self):\n        pass\n")
    with qualnames._PARSE:
        pid = os.fork()
        if pid == 0:  # the child: qualify within a second, or fail
            import signal

            signal.alarm(5)
            os._exit(0 if qualnames.qualify("step", str(src), 2) == "W.step" else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
