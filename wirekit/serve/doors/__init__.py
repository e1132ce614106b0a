"""The front doors of ``wirekit serve``: where a request arrives.

- :mod:`.mipfront` -- one MIP listener per model;
- :mod:`.http` / :mod:`.httpdoor` / :mod:`.httpbody` -- the HTTP/JSON door (predictions,
  ``/metrics``, ``/stats``, ``/readyz``, the admin API) and the limits it reads within;
- :mod:`.oiprest` -- the Open Inference Protocol's REST routes (``/v2/...``) at the HTTP door;
- :mod:`.answers` -- the status every HTTP door answers for a request's outcome;
- :mod:`.adminauth` -- who may use the admin API;
- :mod:`.fdwatch` -- every door's file descriptors: running out of them, logged once a burst;
- :mod:`.page` and ``static/`` -- the live page at ``GET /``.

A door turns bytes into a request and hands it to :mod:`wirekit.serve.dispatch`; it decides
nothing about the request's end.
"""
