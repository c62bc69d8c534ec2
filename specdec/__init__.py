"""specdec: lossless speculative decoding for Hugging Face causal LMs.

>>> import specdec
>>> result = specdec.run("default", "Repeat: the cat sat on the mat.", drafter="pld")  # doctest: +SKIP
>>> result.text, result.stats.mat  # doctest: +SKIP
"""

from __future__ import annotations

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
