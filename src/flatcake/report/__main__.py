"""``python -m flatcake.report``: regenerate the replay benchmark report."""

import sys

from flatcake.report.steps import main

sys.exit(main())
