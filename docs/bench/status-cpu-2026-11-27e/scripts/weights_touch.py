"""What fingerprint_faults.py and populate.py share: one read per 1 KiB of every weight, and a timed call."""

import time


def touch(model):
    """Read one value per 1 KiB of every weight tensor (maps in each page of the memory-mapped checkpoint)."""
    total = 0.0
    for tensor in model.state_dict().values():
        if tensor.numel():
            flat = tensor.detach().reshape(-1)
            total += float(flat[:: max(1, 1024 // tensor.element_size())].sum())
    return total


def timed(label, function, *args):
    """Call ``function(*args)``, print ``label ms`` with the milliseconds it took, return its result."""
    started = time.perf_counter()
    result = function(*args)
    print(label, "ms", round((time.perf_counter() - started) * 1e3, 1))
    return result
