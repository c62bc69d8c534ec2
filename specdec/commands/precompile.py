"""``specdec compile``: compile an engine's bucket forwards now, for this and every later process.

On a CPU, ``engine="auto"`` runs specdec's own forward for a Llama-family model, whose kernels
are compiled ahead of time (C++, once per machine): there the command builds and loads them and
calibrates, and says so; ``--engine compiled`` compiles inductor's buckets.

A static-cache verifier compiles each tree-size bucket's forward at its first use; inductor
keeps the generated code in specdec's cache (:mod:`specdec.backends.buckets.compile_cache`), so a
later process that compiles the same bucket reads it instead of generating and building it
again. This command builds them all up front, as ``specdec.run(model, ..., engine="compiled")``
would (the same drafter, dtype, device and calibrated kernels), with a progress bar; it prints
the time it took, the process's peak memory and where the compiled code went.

The forwards are specialised to the cache's capacity (a power of two, 256 slots at least,
holding the sequence and the largest tree): ``--max-tokens`` is the longest prompt plus new
tokens that later calls should find compiled (128: 512-slot caches).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from typing import Any

from tqdm import tqdm

from specdec.api import Generator
from specdec.backends.buckets import compile_cache
from specdec.backends.buckets.forward import BucketForward
from specdec.backends.engines import row_of
from specdec.commands.arguments import add_engine_arguments, add_model_argument, engine_options
from specdec.errors import SpecDecError


def peak_rss_gb() -> float:
    """The largest resident set of this process or of any child it waited for (compile workers), in GB."""
    peaks = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return max(peaks) * 1024 / 1e9  # ru_maxrss is in KiB on Linux


def cmd_compile(args: argparse.Namespace) -> int:
    if args.max_tokens < 1:
        raise SpecDecError(f"--max-tokens must be positive, got {args.max_tokens}")
    print(f"Loading the model ({args.model}) ...", file=sys.stderr)
    generator = Generator(args.model, drafter=args.drafter, device=args.device, dtype=args.dtype,
                          **engine_options(args))  # fmt: skip
    verifier = generator.verifier
    row = row_of(verifier)  # what its engine precompiles: engines.TABLE
    if row is not None and row.precompiles == "kernels":  # engine="specdec" (module docstring)
        spent = generator.warm_up(args.max_tokens)
        built = verifier.forward.kernels_build()
        print(f"engine {verifier.engine!r} (specdec's own forward) here: its kernels ({built}) "
              f"are built, loaded and calibrated ({spent:.1f} s); nothing else to compile "
              "(--engine compiled compiles inductor's buckets)")
        return 0
    buckets = verifier.forward  # the fixed-shape forwards this command compiles
    if row is None or row.precompiles != "buckets" or not isinstance(buckets, BucketForward):
        raise SpecDecError(f"engine {verifier.engine!r} compiles nothing (--engine compiled: inductor's buckets)")
    if "inductor" not in buckets.mode:
        print(f"engine {verifier.engine!r}: nothing is compiled ahead of time (graphs are captured per process)")
        return 0
    folder = compile_cache.activate()
    started = time.perf_counter()
    with tqdm(total=len(buckets.buckets), desc="compiling buckets", unit="bucket", disable=args.quiet) as bar:

        def done(size: int) -> None:
            bar.set_postfix(nodes=size)
            bar.update()

        verifier.warm_up(args.max_tokens, on_bucket=done)
    seconds = time.perf_counter() - started
    if verifier.forward.fallback_reason is not None:
        print("the compiled forwards fell back to eager ones (see the warning above): nothing useful was stored")
        return 1
    where = folder if folder is not None else f"inductor's own cache ({compile_cache.INDUCTOR_ENV})"
    print(f"compiled {len(buckets.buckets)} buckets ({', '.join(map(str, buckets.buckets))} nodes) for "
          f"{buckets.cache.capacity}-slot caches in {seconds:.1f} s; peak memory {peak_rss_gb():.2f} GB")
    print(f"stored in {where}")
    return 0


def register(sub: Any) -> None:
    parser = sub.add_parser("compile", help="compile an engine's forwards up front (kept for later processes)",
                            description=__doc__.split("\n\n")[1] if __doc__ else None)
    add_model_argument(parser)
    add_engine_arguments(parser, ("auto", "specdec", "compiled", "graphs", "compiled-graphs"))
    parser.add_argument("--drafter", default="sam+recycling", help="the drafter later calls use (default: %(default)s)")
    parser.add_argument("--device", default=None, help="torch device (default: cpu)")
    parser.add_argument("--dtype", default=None, help="model dtype (default: float32)")
    parser.add_argument("--max-tokens", type=int, default=128,
                        help="prompt plus new tokens the compiled forwards must hold (default: %(default)s)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=cmd_compile)
