"""Wrapper frames dressed as the functions they wrap.

The probe wraps a few of torch's functions (the iterator's ``__init__``,
``__next__`` and ``_reset``; a worker's dataset fetch) and the loop's
``next()`` on other pipelines (consumer.py: dressed as the library's
``__next__``, or as the generator a proxy steps). A wrapper is a frame
of its own: without dressing, a dataset's exception would show
``dlwatch/probe/...`` frames in the user's traceback (and people blame the
file they see), and torch's ``warnings.warn(stacklevel=2)`` would name our
frame. Dressed, the wrapper's code carries the original's file, first line
and module globals: the traceback reads as torch's own code, as it would
without dlwatch. The exception itself is never touched (type, message, args,
``__cause__``, ``__context__``): the wrappers re-raise it as it came.
"""

from __future__ import annotations

import dis
import types


def as_frame_of(wrapper, orig, mod):
    """``wrapper`` whose frames carry ``orig``'s file, first line and module
    globals, so ``warnings`` (filename, line, module filters, once-registry)
    and tracebacks attribute them to torch, never to a dlwatch file. The
    wrapper must reach everything through its closure. Unchanged if ``orig``
    is not plain Python code (another patcher's callable)."""
    code = getattr(orig, "__code__", None)
    if code is None or not isinstance(getattr(mod, "__dict__", None), dict):
        return wrapper
    try:
        w = wrapper.__code__
        # Line numbers are stored relative to the first line: shifting it
        # makes every line of the wrapper read as the original's ``def`` line
        # region; the (last) call to the original lands on that line.
        call = _call_line(w)
        dressed = w.replace(
            co_filename=code.co_filename,
            co_firstlineno=max(1, code.co_firstlineno - (call - w.co_firstlineno)),
        )
        if hasattr(code, "co_qualname"):  # 3.11+: stack dumps name a frame by it
            dressed = dressed.replace(co_qualname=code.co_qualname)
        f = types.FunctionType(
            dressed, mod.__dict__, wrapper.__name__, wrapper.__defaults__, wrapper.__closure__
        )
    except Exception:
        return wrapper
    f.__kwdefaults__ = wrapper.__kwdefaults__
    f.__qualname__ = getattr(orig, "__qualname__", wrapper.__qualname__)
    return f


def _call_line(code) -> int:
    """The line of the wrapper that calls the original: the last line that
    loads the closure variable ``orig_*`` (``__next__`` calls it twice: first
    for an iterator it does not time, last on the timed path, the one a
    dataset's exception comes through)."""
    line: int | None = None
    found = code.co_firstlineno
    for instr in dis.get_instructions(code):
        positions = getattr(instr, "positions", None)  # Python 3.11+
        if positions is not None:
            line = positions.lineno
        elif instr.starts_line:  # 3.10: set on the first instruction of a line
            line = instr.starts_line
        if instr.opname == "LOAD_DEREF" and str(instr.argval).startswith("orig_") and line:
            found = line
    return found
