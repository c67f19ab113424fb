"""What the benchmarks share: the plain-text table they print and the
``--json`` document they write.

Imported as ``common`` by the scripts beside it (``python bench/x.py`` puts
this folder first on ``sys.path``).
"""

from __future__ import annotations

import json
import os


def text_table(head: tuple, rows: list[tuple]) -> str:
    """Columns padded to their widest cell, a dashed rule under the head."""
    lines = [head, *rows]
    widths = [max(len(x[i]) for x in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def write_json(path: str, doc, **dump_kwargs) -> None:
    """``doc`` as indented JSON at ``path`` (its folder made if missing)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, **dump_kwargs)
        f.write("\n")
