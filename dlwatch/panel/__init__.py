"""The notebook panel, monitor side: the collector run as a child of the
kernel (``feed``) and the HTML it sends back once a second (``html``).

The kernel side (``dlwatch.notebook``) only starts the child and shows what it
prints: the collecting and the rendering happen outside the training process,
so they cost the training loop no GIL time.
"""
