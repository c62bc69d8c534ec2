"""``python -m specdec.commands ...``: the ``specdec`` command."""

import sys

from specdec.commands import main

sys.exit(main())
