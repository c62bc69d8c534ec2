"""Corpora into token documents: jsonl records, text files and source trees.

A *document* is one unit a draft never crosses: a jsonl record, a text file, a source
file. Documents are tokenized without special tokens and kept apart (datastores record
their boundaries), so no draft runs from the end of one document into the next.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from specdec.errors import SpecDecError

# Files read from a directory: source code and prose. Sorted walk, so builds are reproducible.
SOURCE_SUFFIXES = (".py", ".pyi", ".md", ".rst", ".txt", ".c", ".h", ".cpp", ".hpp", ".cc", ".js", ".ts", ".java",
                   ".go", ".rs", ".sh", ".toml", ".cfg", ".ini", ".html", ".css", ".json", ".yaml", ".yml")


def _record_text(record: Any, where: str, fields: Sequence[str], chat: bool, tokenizer: Any) -> str:
    if not isinstance(record, dict):
        raise SpecDecError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if chat:
        messages = record.get("messages") or record.get("conversations")
        if not isinstance(messages, list):
            raise SpecDecError(f"{where}: --chat needs a 'messages' list, the record has keys {sorted(record)}")
        if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
            raise SpecDecError("--chat needs a tokenizer with a chat template")
        return str(tokenizer.apply_chat_template(messages, tokenize=False))
    if fields:
        missing = [f for f in fields if f not in record]
        if missing:
            raise SpecDecError(f"{where}: no field {missing[0]!r}; the record has keys {sorted(record)}")
        return "\n".join(str(record[f]) for f in fields)
    if "text" in record:
        return str(record["text"])
    raise SpecDecError(f"{where}: no 'text' field; pick fields with --field (the record has keys {sorted(record)})")


def iter_texts(
    inputs: Sequence[str | os.PathLike[str]],
    *,
    fields: Sequence[str] = (),
    chat: bool = False,
    tokenizer: Any = None,
    suffixes: Sequence[str] = SOURCE_SUFFIXES,
) -> Iterator[str]:
    """Yield one text per document: a jsonl record, a text file, or each matching file of a directory."""
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes)
            for file in files:
                yield file.read_text(encoding="utf-8", errors="replace")
        elif path.is_file() and path.suffix == ".jsonl":
            with open(path, encoding="utf-8") as handle:
                for number, line in enumerate(handle, 1):
                    if line.strip():
                        try:
                            record = json.loads(line)
                        except json.JSONDecodeError as error:
                            raise SpecDecError(f"{path}:{number}: not valid JSON ({error})") from error
                        yield _record_text(record, f"{path}:{number}", fields, chat, tokenizer)
        elif path.is_file():
            yield path.read_text(encoding="utf-8", errors="replace")
        else:
            raise SpecDecError(f"no such input file or directory: {str(path)!r}")


def tokenize_documents(
    tokenizer: Any, texts: Iterator[str] | Sequence[str], *, max_tokens: int | None = None, progress: bool = True,
    batch_size: int = 64,
) -> list[npt.NDArray[np.int64]]:
    """Tokenize each text (no special tokens) into an int64 array; stop after ``max_tokens`` in all."""
    documents: list[npt.NDArray[np.int64]] = []
    total = 0
    bar = tqdm(desc="tokenizing", unit=" tok", unit_scale=True, disable=not progress)
    batch: list[str] = []

    def flush() -> bool:
        nonlocal total
        if not batch:
            return False
        for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            if max_tokens is not None and total + len(ids) > max_tokens:
                ids = ids[: max_tokens - total]
            if ids:
                documents.append(np.asarray(ids, dtype=np.int64))
                total += len(ids)
                bar.update(len(ids))
            if max_tokens is not None and total >= max_tokens:
                return True
        batch.clear()
        return False

    for text in texts:
        if text:
            batch.append(text)
        if len(batch) >= batch_size and flush():
            break
    else:
        flush()
    bar.close()
    return documents
