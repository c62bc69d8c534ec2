"""``specdec datastore build`` and ``specdec datastore info``: index a corpus for a retrieval drafter, read a header."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from specdec.cachefiles import TokenizerIdentity
from specdec.datastores import BUILDERS
from specdec.datastores.corpus_reader import iter_texts, tokenize_documents
from specdec.datastores.format import read_header
from specdec.errors import SpecDecError
from specdec.models import load_tokenizer


def cmd_build(args: argparse.Namespace) -> int:
    build = BUILDERS.get(args.kind)
    if build is None:
        raise SpecDecError(f"unknown datastore kind {args.kind!r}; valid kinds: {', '.join(sorted(BUILDERS))}")
    tokenizer = load_tokenizer(args.tokenizer)
    fields = [f for spec in args.field for f in spec.split(",") if f]
    started = time.perf_counter()
    texts = iter_texts(args.input, fields=fields, chat=args.chat, tokenizer=tokenizer)
    documents = tokenize_documents(tokenizer, texts, max_tokens=args.max_tokens, progress=not args.quiet)
    if not documents:
        raise SpecDecError("the inputs hold no text to index")
    tokenized = time.perf_counter()
    try:
        report: dict[str, Any] = build(documents, Path(args.output), TokenizerIdentity.of(tokenizer),
                                       progress=not args.quiet)
    except OSError as error:  # a read-only folder, a full disk: one line naming the file, exit 2
        raise SpecDecError(f"cannot write {args.output}: {error.strerror or error}") from error
    report = {"documents": len(documents), "tokens": int(sum(len(d) for d in documents)),
              "tokenize_s": round(tokenized - started, 3), **report}
    print(json.dumps(report, indent=1))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    header = read_header(args.path)
    print(json.dumps(header, indent=1))
    return 0


def positive_count(text: str) -> int:
    """The argparse type of ``--max-tokens``: a whole number of at least 1 (a negative cap built everything)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def register(sub: Any) -> None:
    datastore = sub.add_parser("datastore", help="build or inspect a drafting datastore")
    actions = datastore.add_subparsers(dest="action", required=True)
    build = actions.add_parser("build", help="index a corpus for a retrieval drafter")
    build.add_argument("--kind", required=True, help="datastore kind (sam, rest)")
    build.add_argument("--input", nargs="+", required=True, help="jsonl files, text files or directories")
    build.add_argument("--tokenizer", default="default", help="'default' or a local checkpoint directory")
    build.add_argument("-o", "--output", required=True)
    build.add_argument("--field", action="append", default=[], help="jsonl field(s) holding the text")
    build.add_argument("--chat", action="store_true", help="render jsonl 'messages' with the chat template")
    build.add_argument("--max-tokens", type=positive_count, default=None, help="stop after this many tokens")
    build.add_argument("--quiet", action="store_true", help="no progress bars")
    build.set_defaults(func=cmd_build)
    info = actions.add_parser("info", help="print a datastore's header")
    info.add_argument("path")
    info.set_defaults(func=cmd_info)
