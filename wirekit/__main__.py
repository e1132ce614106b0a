"""``python -m wirekit``: the ``wirekit`` command, for a Python whose scripts are not on PATH."""

import sys

from wirekit.cli import main

sys.exit(main())
