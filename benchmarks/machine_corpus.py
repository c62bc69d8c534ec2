"""A >10M-token real corpus any machine with Python has, for datastore benchmarks.

GSM8K's training problems (``../shared/data/corpora``, when present: fields question and
answer), the Python standard library's source (site-packages excluded) and the text files
of ``/usr/share/doc``: about 26M tokens with the default model's tokenizer here.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"


def corpus_inputs() -> tuple[list[str], list[str]]:
    """(``--input`` paths, extra ``specdec datastore build`` arguments) for the corpus."""
    inputs: list[str] = []
    extra: list[str] = []
    gsm8k = SHARED / "corpora" / "gsm8k_train.jsonl"
    if gsm8k.exists():
        inputs.append(str(gsm8k))
        extra += ["--field", "question,answer"]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    inputs += [str(p) for p in sorted(stdlib.iterdir())
               if p.name != "site-packages" and (p.is_dir() or p.suffix == ".py")]
    doc = Path("/usr/share/doc")
    if doc.is_dir():
        inputs.append(str(doc))
    return inputs, extra
