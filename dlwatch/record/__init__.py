"""Recordings: the snapshot stream written to a JSON Lines file and read back.

``recorder`` runs the live collector headless and appends its snapshots;
``reader`` reads a recording back (tolerating a torn last line); ``series``
turns a recording into time series and summaries; ``report`` and ``compare``
render them as one self-contained HTML file. The file format is described in
``fileformat`` and docs/recordings.md.
"""
