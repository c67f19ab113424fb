"""dlwatch.diagnose: pure rules from a snapshot to hints (docs/ARCHITECTURE.md §1, docs/hints/index.md).

No I/O, no clock of its own (``snapshot["time"]`` is the clock), and no
imports of textual/psutil/pynvml/torch.

- ``diagnose(snapshot, state) -> (hints, state)``: hysteresis and warm-up
  gating over successive snapshots; the live views use it (or ``Diagnoser``).
- ``evaluate(snapshot) -> hints``: instantaneous, stateless (``dlwatch snapshot``
  judges as the live view does: ``collect.monitor.Monitor.judge_now``).
- ``format_hints(hints) -> str``: text for ``dlwatch snapshot``.
- ``judging(snapshot)`` / ``Diagnoser.judging()``: the loaders not judged
  yet (their first warm-up), the snapshot's ``judging``.

The rule catalog, thresholds and their origins: ``RULES.md`` next to this file.
"""

from .engine import (
    HOLD_OFF_S,
    HOLD_ON_S,
    REGISTRY,
    Diagnoser,
    DiagnoseState,
    diagnose,
    evaluate,
    judging,
)
from .registry import Rule
from .render import format_hints

__all__ = [
    "Diagnoser",
    "DiagnoseState",
    "diagnose",
    "evaluate",
    "format_hints",
    "judging",
    "HOLD_ON_S",
    "HOLD_OFF_S",
    "REGISTRY",
    "Rule",
]
