"""``python -m rlzoo ...`` is the ``rlzoo`` command (what ``torchrun -m rlzoo train ...`` launches)."""

import sys

from rlzoo.cli import console_main

sys.exit(console_main())
