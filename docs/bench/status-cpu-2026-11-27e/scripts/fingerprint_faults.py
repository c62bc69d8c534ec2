"""The weights fingerprint cold and warm, and one read per 1 KiB of every weight (the page faults of the memory-mapped
checkpoint).

`python fingerprint_faults.py plain|touchfirst`.
"""

import sys

from weights_touch import timed, touch

import specdec.backends.identity as ident
from specdec.models import load_model

model, tok = load_model(None)
if sys.argv[1] == "touchfirst":
    timed("touch", touch, model)
timed("fp1", ident._weights_fingerprint, model)
timed("fp2", ident._weights_fingerprint, model)
timed("touch", touch, model)
timed("touch2", touch, model)
print(
    type(model.model.embed_tokens.weight.untyped_storage()),
    model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(),
)
