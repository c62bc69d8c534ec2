"""Build specdec's C++ extensions now, into the shared cache, with this interpreter's torch.

Usage: ``python scripts/build_extensions.py [NAME ...]`` (default: all of them: cpu_kernels, tree_ops, sam,
rest_index). Each is built once per torch build (environments with the same torch share it, the first builds and
the others import it) and otherwise at its first use; CI builds them ahead, beside work that leaves a core idle
(``.ci/run``), and makes sure of them in the compat and vLLM environments. A build another process has started is
waited for, not repeated.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import ModuleType


def loaders() -> dict[str, Callable[[], ModuleType]]:
    from specdec.backends.cuda_ext import build
    from specdec.backends.specdec_engine import cpu_kernels
    from specdec.datastores import rest, sam

    return {"cpu_kernels": cpu_kernels.load, "tree_ops": build.load, "sam": sam.native, "rest_index": rest.native}


def main(names: list[str]) -> int:
    known = loaders()
    unknown = [name for name in names if name not in known]
    if unknown:
        print(f"build_extensions: unknown extension {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    for name in names or list(known):
        known[name]()
    print(f"build_extensions: {', '.join(names or known)} ready in {time.perf_counter() - started:.0f} s "
          f"({sys.prefix})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
