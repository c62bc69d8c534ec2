"""The compiled backend: tree mask, acceptance and KV compaction as C++ (CPU) and CUDA kernels.

``Generator(..., tree_ops="cuda_ext")`` verifies with these kernels; ``tree_ops="auto"``
(the default) uses them when the extension builds and loads and has kernels for the
model's device, and the torch reference backend otherwise. Importing this package builds
nothing: the build (just in time, cached) happens when :class:`ExtTreeOps` is created.

- :mod:`~specdec.backends.cuda_ext.ops`: the three ops (``torch.ops.specdec.*``) as typed calls;
- :mod:`~specdec.backends.cuda_ext.backend`: :class:`ExtTreeOps`, the verifier's ``TreeOps`` on them;
- :mod:`~specdec.backends.cuda_ext.build`: sources, flags, the build;
- :mod:`~specdec.backends.cuda_ext.nvcc_check`: compiles the CUDA source where no GPU is present.

See ``docs/backends.md`` for the layouts, the measurements, and what was verified where.
"""

from __future__ import annotations

from specdec.backends.cuda_ext.backend import ExtTreeOps
from specdec.backends.cuda_ext.build import BackendUnavailableError, cuda_build_possible, load

__all__ = ["BackendUnavailableError", "ExtTreeOps", "cuda_build_possible", "load"]
