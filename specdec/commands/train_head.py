"""``specdec train-head``: train an EAGLE draft head for a target model (:mod:`specdec.drafters.eagle_train`).

The target's features on the corpus are computed once and cached (``<cache>/eagle-features``);
the head (its own weights in float16, its draft vocabulary, the settings and the validation
result) goes to ``--out``. The head shipped for the default model was made by the command in
docs/algorithms/eagle.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch

from specdec.commands.arguments import add_model_argument
from specdec.drafters.eagle_head import save_head
from specdec.drafters.eagle_train import TrainConfig, corpus_windows, extract, settings, train
from specdec.models import load_model


def cmd_train_head(args: argparse.Namespace) -> int:
    config = TrainConfig(corpora=tuple(args.corpus or ["stdlib"]), tokens=args.tokens, window=args.window,
                         epochs=args.epochs, seed=args.seed, draft_vocab=args.draft_vocab, lr=args.lr,
                         batch=args.batch)  # fmt: skip
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model)
    model.eval()  # type: ignore[no-untyped-call]
    cast: Any = model  # transformers types .to oddly
    train_windows, valid_windows = corpus_windows(config, tokenizer)
    print(f"corpus: {len(train_windows)} training and {len(valid_windows)} validation windows of "
          f"{config.window} tokens", file=sys.stderr)  # fmt: skip
    started = time.perf_counter()

    def progress(done: int, total: int) -> None:
        print(f"\rfeatures: {done}/{total} windows ({time.perf_counter() - started:.0f} s)", end="", file=sys.stderr)

    if args.features_dtype != "float32":  # the features only: the head trains in float32 on the float32 LM head
        cast.to(dtype=getattr(torch, args.features_dtype))
    data = extract(model, train_windows, config, progress)
    valid = extract(model, valid_windows, config, progress)
    cast.to(dtype=torch.float32)
    print(file=sys.stderr)
    extract_s = time.perf_counter() - started
    head, result = train(model, config, data, valid, log=lambda line: print(line, file=sys.stderr))
    trained: dict[str, Any] = {"settings": settings(config), "result": result, "features_s": round(extract_s, 1),
                               "features_dtype": args.features_dtype, "torch": torch.__version__}  # fmt: skip
    save_head(head, model, args.out, trained)
    print(f"wrote {args.out}: validation top-1 agreement {result['valid_top1']:.3f}")
    return 0


def register(sub: Any) -> None:
    """Add ``specdec train-head`` to the command line."""
    parser = sub.add_parser("train-head", help="train an EAGLE draft head (drafter 'eagle') for a target model")
    add_model_argument(parser)
    parser.add_argument("--out", required=True, help="the head file to write (.safetensors)")
    parser.add_argument("--corpus", action="append", default=None, metavar="SOURCE",
                        help="'stdlib' (the Python standard library's source) or a JSONL file of "
                             "{'question', 'answer'} rows (GSM8K's training set); repeat for several, each an "
                             "equal share of --tokens (default: stdlib)")  # fmt: skip
    parser.add_argument("--tokens", type=int, default=400_000, help="tokens in all (default: 400000)")
    parser.add_argument("--window", type=int, default=512, help="tokens per training window (default: 512)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draft-vocab", type=int, default=8192,
                        help="token ids the head scores: the target's most frequent predictions (default: 8192)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=2, help="windows per optimizer step (default: 2)")
    parser.add_argument("--features-dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the target's dtype while it computes the features (bfloat16: ~1.4x faster on a CPU "
                             "with BF16 dot products; default: float32)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own)")
    parser.set_defaults(func=cmd_train_head)
