"""The tests' scaffolding, written once (issue 35): a server command in a subprocess
(:mod:`support.process`), a free port (:mod:`support.ports`), the dispatcher in process
with its backends (:mod:`support.service`) and the rows of a requests store
(:mod:`support.rows`).

``tests/`` is on ``sys.path`` (``pythonpath`` in ``pyproject.toml``), so the tests and the
benchmarks import it as ``support``."""
