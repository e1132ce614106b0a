"""The control around the request path: what exists, how it is doing, what to change.

- :mod:`.catalog` -- which models run on which devices with what share (the one source of
  truth routing, metrics and the controller follow);
- :mod:`.metrics` -- figures kept in memory, exported as ``/metrics`` and ``/stats``;
- :mod:`.controller` / :mod:`.actuators` -- metrics → policy → decisions → a node's resources;
- :mod:`.k8s` -- a deployment config as Kubernetes manifests.
"""
