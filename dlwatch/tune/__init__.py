"""dlwatch.tune: run the user's unmodified command several times with other
DataLoader settings and measure each (``dlwatch tune``).

- ``runner``: one trial (the command in its own session, a collector on a
  private runtime dir, a clean stop of the whole group);
- ``measure``: the trial's figures from its snapshots (pure);
- ``search``: the next setting to try and the one to recommend (pure);
- ``sweep``: the loop and the result document; ``report``: its text.

The settings reach the job through ``DLWATCH_OVERRIDES``, a document whose
format is ``dlwatch.overrides`` (the probe applies it; this side never
imports the probe).
"""
