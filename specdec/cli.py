"""The former home of the ``specdec`` command, kept so ``specdec.cli:main`` (and ``python -m specdec.cli``) work.

The commands live in :mod:`specdec.commands`.
"""

import sys

from specdec.commands import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
