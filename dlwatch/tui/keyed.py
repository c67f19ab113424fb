"""Updates of a Static only when what it shows changed, and the comparison
of rich Text that decides it (also used by the tables).

Footprint: the display refreshes every 0.5 s while most of what it shows
stays the same. ``Static.update`` repaints the widget and may lay out the
whole screen again, so it is called only for content that really changed
(text *and* styles: rich's own ``Text ==`` ignores the base style, so a
recoloured value would be missed).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.geometry import Size
from textual.widgets import Static

from dlwatch.tui.textline import TextLine


def text_key(value: Any) -> Any:
    """What a cell or line looks like, as a comparable value."""
    if isinstance(value, Text):
        return (
            "Text",
            value.plain,
            str(value.style),
            value.justify,
            value.overflow,
            value.no_wrap,
            value.end,
            tuple((s.start, s.end, str(s.style)) for s in value.spans),
        )
    return value


_SHOWN = "_dlwatch_shown"
_ANY = Size(0, 0)


def set_static(widget: Static | TextLine, content: Any) -> bool:
    """``widget.update(content)`` unless it already shows exactly that.

    A changed content is repainted; a new layout of the screen (which
    repaints much more) is asked for only when the widget's size depends on
    its content and the new content needs another size (more wrapped lines,
    a wider auto-width label). Returns whether it updated.
    """
    key = text_key(content)
    if getattr(widget, _SHOWN, None) == key:
        return False
    widget.update(content, layout=False)
    setattr(widget, _SHOWN, key)
    if _needs_layout(widget):
        widget.refresh(layout=True)
    return True


def _needs_layout(widget: Static | TextLine) -> bool:
    try:
        if any(not node.display for node in widget.ancestors_with_self):
            # Hidden (by CSS, e.g. the compact layout, or with its panel):
            # showing it again lays it out anyway.
            return False
        size = widget.content_size
        if not widget.is_mounted or size.width <= 0 or size.height <= 0:
            return True  # not laid out yet, or empty until now
        styles = widget.styles
        width, height = styles.width, styles.height
        if width is not None and width.is_auto:
            if widget.get_content_width(_ANY, _ANY) != size.width:
                return True
        if height is None or height.is_auto:
            if widget.get_content_height(_ANY, _ANY, size.width) != size.height:
                return True
        return False
    except Exception:
        return True
