"""`python -m runrelay.cli`: the `runrelay` command."""

import sys

from . import main

sys.exit(main())
