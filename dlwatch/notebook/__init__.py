"""dlwatch in a Jupyter notebook: the live panel in a cell's output.

In a cell before the training cell::

    %load_ext dlwatch
    %dlwatch                 # instrument this kernel, show the live panel here

or without magics::

    import dlwatch.notebook
    dlwatch.notebook.show()

``%dlwatch stop`` (``dlwatch.notebook.stop()``) freezes the panel with its
final figures; ``%dlwatch tune SCRIPT [ARGS]`` runs ``dlwatch tune`` on a
script (the tuner re-runs a command several times, so it needs a script, not
the notebook).

This module is the kernel side: it installs the hook (as ``import
dlwatch.hook``) and starts the collector as a child process
(``dlwatch.panel.feed``), whose HTML frames a reader thread hands to the
cell's display. The kernel itself only reads a pipe once a second.
IPython is imported only when a panel is shown.
"""

from __future__ import annotations

from dlwatch.notebook.session import PanelSession, current, show, stop

__all__ = ["PanelSession", "current", "show", "stop", "load_ipython_extension"]


def load_ipython_extension(ipython) -> None:  # noqa: ANN001 (IPython's shell)
    from dlwatch.notebook.magic import register

    register(ipython)
