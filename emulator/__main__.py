"""``python -m emulator`` is the ``emulator`` command."""

import sys

from emulator.cli import main

sys.exit(main())
