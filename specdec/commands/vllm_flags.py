"""``python -m specdec.commands.vllm_flags DRAFTER [-k K] [OPTION=VALUE ...]``: print the ``vllm serve`` flags
that run a specdec drafter (:func:`specdec.integrations.vllm.serve_flags`; docs/serving.md)."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

from specdec.commands.arguments import parse_options
from specdec.errors import SpecDecError
from specdec.integrations.vllm import DEFAULT_DRAFTER, DEFAULT_NUM_SPECULATIVE_TOKENS, serve_flags


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec.commands.vllm_flags",
                                     description="Print the `vllm serve` flags that run a specdec drafter.")
    parser.add_argument("drafter", nargs="?", default=DEFAULT_DRAFTER)
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=DEFAULT_NUM_SPECULATIVE_TOKENS)
    parser.add_argument("--tokenizer", help="the engine's tokenizer (a checkpoint directory), to check datastores")
    parser.add_argument("options", nargs="*", metavar="OPTION=VALUE",
                        help="drafter options; values are JSON when they parse as JSON (datastore=corpus.sam)")
    args = parser.parse_intermixed_args(argv)
    try:
        options = parse_options(args.options, "option")
        flags = serve_flags(args.drafter, args.num_speculative_tokens, tokenizer=args.tokenizer, **options)
    except SpecDecError as error:
        parser.exit(2, f"error: {error}\n")
    print(" ".join(shlex.quote(flag) for flag in flags))
    return 0


if __name__ == "__main__":
    sys.exit(main())
