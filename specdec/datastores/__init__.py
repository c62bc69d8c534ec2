"""Persistent, shareable indexes that drafters read: one file format, one build command.

- :mod:`specdec.datastores.format`: the file container (header, checks, memory-mapped sections).
- :mod:`specdec.datastores.corpus_reader`: reading corpora (jsonl, text, source trees) into token documents.
- :mod:`specdec.datastores.cli`: ``specdec datastore build --kind KIND ...`` and ``specdec datastore info``.

Each kind registers its builder in :data:`BUILDERS` as ``"module:function"``; the function
takes ``(documents, output, tokenizer, progress=...)`` where ``documents`` is a list of int64
token arrays, writes one file with :func:`~specdec.datastores.format.write_datastore`, and
returns a dict of build statistics to print.
"""

from __future__ import annotations

BUILDERS: dict[str, str] = {"rest": "specdec.datastores.rest:build", "sam": "specdec.datastores.sam:build"}
