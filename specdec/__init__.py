"""specdec: lossless speculative decoding for Hugging Face causal LMs.

>>> import specdec
>>> result = specdec.run("default", "Repeat: the cat sat on the mat.", drafter="pld")  # doctest: +SKIP
>>> result.text, result.stats.mat  # doctest: +SKIP

``import specdec`` is cheap: the names below are imported from their modules at first use (PEP 562), so
``import specdec`` alone loads neither torch nor transformers (``specdec cache info`` and ``--help`` start
in a fraction of a second). ``from specdec import run`` still works; it imports what ``run`` needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specdec.api import Generator, generate, run, run_batch
    from specdec.datastores.shared_store import SharedStore
    from specdec.decoding import DecodingConfig, DecodingOptions, StopRules
    from specdec.drafters import available_drafters, make_factory
    from specdec.errors import DatastoreError, InvalidDraftTreeError, SpecDecError, UnsupportedModelError
    from specdec.hf import HFGenerate, hf_generate
    from specdec.models import load_model
    from specdec.types import (
        Drafter,
        DraftTree,
        Feedback,
        GenerationResult,
        GenerationStats,
        StepRecord,
        Verification,
    )

__version__ = "0.1.0"

# public name -> the module that defines it
_LAZY: dict[str, str] = {
    "Generator": "specdec.api",
    "generate": "specdec.api",
    "run": "specdec.api",
    "run_batch": "specdec.api",
    "SharedStore": "specdec.datastores.shared_store",
    "DecodingConfig": "specdec.decoding",
    "DecodingOptions": "specdec.decoding",
    "StopRules": "specdec.decoding",
    "available_drafters": "specdec.drafters",
    "make_factory": "specdec.drafters",
    "DatastoreError": "specdec.errors",
    "InvalidDraftTreeError": "specdec.errors",
    "SpecDecError": "specdec.errors",
    "UnsupportedModelError": "specdec.errors",
    "HFGenerate": "specdec.hf",
    "hf_generate": "specdec.hf",
    "load_model": "specdec.models",
    "Drafter": "specdec.types",
    "DraftTree": "specdec.types",
    "Feedback": "specdec.types",
    "GenerationResult": "specdec.types",
    "GenerationStats": "specdec.types",
    "StepRecord": "specdec.types",
    "Verification": "specdec.types",
}

__all__ = [
    "DatastoreError",
    "DecodingConfig",
    "DecodingOptions",
    "DraftTree",
    "Drafter",
    "Feedback",
    "GenerationResult",
    "GenerationStats",
    "Generator",
    "HFGenerate",
    "InvalidDraftTreeError",
    "SharedStore",
    "SpecDecError",
    "StepRecord",
    "StopRules",
    "UnsupportedModelError",
    "Verification",
    "__version__",
    "available_drafters",
    "generate",
    "hf_generate",
    "load_model",
    "make_factory",
    "run",
    "run_batch",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module at its first use and keep the name here (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'specdec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
