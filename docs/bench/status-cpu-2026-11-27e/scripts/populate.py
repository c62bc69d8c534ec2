"""Mapping the checkpoint in with madvise(MADV_POPULATE_READ) against faulting it in by touch.

`python populate.py pop|plain`.
"""

import ctypes
import mmap
import sys
import time

from weights_touch import timed, touch

from specdec.models import load_model

t = time.perf_counter()
model, tok = load_model(None)
print("load ms", round((time.perf_counter() - t) * 1e3, 1))
PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def spans():
    seen = {}
    for t in model.state_dict().values():
        s = t.untyped_storage()
        if s.device.type == "cpu" and s.nbytes():
            seen[s.data_ptr()] = s.nbytes()
    return seen


def populate():
    n = 0
    for ptr, size in spans().items():
        start = ptr - ptr % PAGE
        end = ptr + size
        r = libc.madvise(start, end - start, 22)
        if r != 0:
            return ("err", ctypes.get_errno())
        n += 1
    return n


t = time.perf_counter()
sp = spans()
print("spans", len(sp), sum(sp.values()) / 1e6, "MB", round((time.perf_counter() - t) * 1e3, 1))
if sys.argv[1] == "pop":
    t = time.perf_counter()
    print(populate())
    print("populate ms", round((time.perf_counter() - t) * 1e3, 1))
timed("touch", touch, model)
timed("touch2", touch, model)
