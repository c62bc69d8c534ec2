"""Workarounds for torch.compile (dynamo and inductor) that the compiled bucket forwards need.

:func:`compile_forward` is the one place specdec compiles; :func:`fresh_code` gives each
bucket's function a code object of its own (dynamo's per-code limit); and
:func:`import_inductor_quietly` keeps torch's own deprecation warnings about its code quiet.
"""

from __future__ import annotations

import itertools
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch

CODE_TAGS = itertools.count()  # makes each compiled function's code object name unique


def import_inductor_quietly() -> None:
    """Import what inductor's freezing imports, minus torch's own deprecation warning.

    Compiling with ``freezing`` imports ``torch.fx.experimental.optimization``, which imports
    ``torch.utils.mkldnn``, whose classes decorate with ``torch.jit.script_method``: torch (2.13)
    warns ``DeprecationWarning: torch.jit.script_method is deprecated`` 14 times, about its
    own code, which no user can act on. Imported here first, that one warning is left out;
    every other warning still shows.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"`torch\.jit\.script_method` is deprecated", DeprecationWarning)
        import torch.fx.experimental.optimization  # noqa: F401


def fresh_code(function: Callable[..., Any], tag: str) -> Callable[..., Any]:
    """``function`` with a code object of its own.

    Dynamo keeps its compiled variants per code object, with a limit on how many (8 by
    default, then it silently runs eagerly). Every bucket of every verifier compiles its own
    variant, so each gets its own code object and the limit never bites.
    """
    code = function.__code__.replace(co_name=f"{function.__name__}_{tag}")
    fresh = types.FunctionType(code, function.__globals__, code.co_name, function.__defaults__, function.__closure__)
    fresh.__kwdefaults__ = function.__kwdefaults__
    return fresh


def compile_forward(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``torch.compile`` of a bucket's forward (compiled at its first call; the one place specdec compiles)."""
    import_inductor_quietly()
    return torch.compile(function, dynamic=False)
