"""The request path of ``wirekit serve``: from a door's request to a backend and back.

- :mod:`.dispatcher` -- one request in, one answer out; the one place that records how each
  request ends (``ok``, ``failed``, ``timeout``, ``abandoned``...);
- :mod:`.lane` -- the MIP fast path, a read's worth of requests per call (its compiled twin is
  ``wirekit/_fast/servelane.pyx``); it reports every end through the dispatcher;
- :mod:`.router` -- the device a request goes to, drawn by quota;
- :mod:`.cache` -- answers kept for repeated inputs;
- :mod:`.payload` -- a MIP message as it travels: wire bytes, decoded, or both.
"""
