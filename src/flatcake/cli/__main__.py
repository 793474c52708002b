"""``python -m flatcake.cli``: the same as the ``flatcake`` script."""

import sys

from flatcake.cli import main

sys.exit(main())
