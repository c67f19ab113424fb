"""A modal screen that shows one text, scrollable, closed by a few keys: the
help (``?``) and the hints in full (``e``) are both this. Every modal of the
view (these, the profiles, the stacks) sits in a ``closing_frame``, which says
on its border how to close it: a short terminal may cut the text, never that."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


def closing_frame(closes: str, title: str = "") -> VerticalScroll:
    """The scrollable box of a modal, its border naming the keys that close it."""
    box = VerticalScroll()
    box.border_title = title
    box.border_subtitle = f"{closes} · ↑↓ pgup pgdn scroll"
    return box


class TextModal(ModalScreen[None]):
    # Subclasses add their own opening key as one more way to close.
    BINDINGS = [
        Binding("escape", "dismiss", "close"),
        Binding("q", "dismiss", "close", show=False),
    ]

    DEFAULT_CSS = """
    TextModal { align: center middle; }
    TextModal > VerticalScroll {
        width: 76; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; padding: 0 1; background: $surface;
    }
    TextModal .modal-text { width: 100%; }
    """

    def __init__(
        self,
        body: Text,
        *,
        title: str = "",
        closes: str = "escape closes",
        body_id: str | None = None,
        width: int | None = None,
    ) -> None:
        super().__init__()
        self._body = body
        self._title = title
        self._closes = closes
        self._body_id = body_id
        self._width = width

    def compose(self) -> ComposeResult:
        box = closing_frame(self._closes, self._title)
        if self._width:
            box.styles.width = self._width
        with box:
            yield Static(self._body, id=self._body_id, classes="modal-text")

    async def action_dismiss(self, result: Any = None) -> None:
        self.dismiss(None)
