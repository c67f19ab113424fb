"""``import dlwatch.hook``: instrument every PyTorch DataLoader in this process,
and the pipelines of torchdata.nodes, Grain, MONAI and WebDataset
(probe/adapters), each where the training loop takes its batches.

Importing only installs class-level patches (or, if torch is not imported
yet, an import hook that patches it when it is). No thread, socket or file
exists until a DataLoader is first iterated in a trainer process. Safe to
import many times, and in DataLoader workers (spawn re-imports the script).
Set ``DLWATCH_DISABLE=1`` to make it a no-op. ``DLWATCH_OVERRIDES`` (set by
``dlwatch tune``) also overrides DataLoader settings; unset, nothing changes.
"""

import os as _os

if _os.environ.get("DLWATCH_DISABLE", "").strip() in ("", "0", "false", "no"):
    try:
        from dlwatch.probe import patches as _patches
        from dlwatch.probe import publisher as _publisher

        _patches.on_first_iterator = _publisher.ensure_started
        _patches.install()
    except Exception:  # the job must train on whatever happens here
        pass
    try:
        from dlwatch.probe import adapters as _adapters
        from dlwatch.probe import trainthread as _trainthread

        # A process that steps an optimizer trains: listed even before (or
        # without) a loader dlwatch recognises.
        _trainthread.on_first_step = _publisher.ensure_started
        _trainthread.install()
        _adapters.install()
    except Exception:
        pass
    if _os.environ.get("DLWATCH_AUTOTUNE"):
        try:
            from dlwatch.probe import autotune as _autotune

            if _autotune.enabled():
                _patches.after_new_iterator = _autotune.after_new_iterator
                _autotune.install()
        except Exception:
            pass
    if _os.environ.get("DLWATCH_OVERRIDES"):
        try:
            from dlwatch.probe import overrides as _overrides

            _overrides.install()
        except Exception:
            pass
