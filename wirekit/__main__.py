"""``python -m wirekit ...``: the ``wirekit`` command line."""

from wirekit.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
