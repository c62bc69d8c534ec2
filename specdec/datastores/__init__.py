"""Persistent, shareable indexes that drafters read: one file format, one build command.

- :mod:`specdec.datastores.format`: the file container (header, checks, memory-mapped sections).
- :mod:`specdec.datastores.corpus_reader`: reading corpora (jsonl, text, source trees) into token documents.
- :mod:`specdec.datastores.sam` and :mod:`specdec.datastores.rest`: the two kinds of index;
  :mod:`specdec.datastores.shared_store`: the store of generated outputs ``sam`` drafts from.
- ``specdec datastore build --kind KIND ...`` and ``specdec datastore info`` (:mod:`specdec.commands.datastore`).

Each kind registers its builder in :data:`BUILDERS`: a function that takes
``(documents, output, tokenizer, progress=...)`` where ``documents`` is a list of int64
token arrays, writes one file with :func:`~specdec.datastores.format.write_datastore`, and
returns a dict of build statistics to print.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specdec.datastores import rest, sam

BUILDERS: dict[str, Callable[..., dict[str, Any]]] = {"rest": rest.build, "sam": sam.build}
