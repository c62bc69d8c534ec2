"""Compiled verification forwards, shared by every static-cache verifier of a model in the process.

Why: a static-cache verifier compiles one forward per tree-size bucket at its first use
(:mod:`specdec.backends.buckets.forward`), and ``specdec.run`` makes a new verifier per call. Each
compiled forward had a code object of its own, so every ``run(..., engine="compiled")``
compiled every bucket again: tens of seconds per call, 0.06-0.13x Hugging Face's
``generate`` one call at a time (issue 30). Here the compiled functions belong to the
**model object**: every verifier of it with the same dtype, device, kernel choice and
compile settings takes the bucket's function that the first one compiled, and dynamo's
guards pass, so a second ``run`` compiles nothing.

**Held weakly by the model.** :data:`_STORES` is a ``WeakKeyDictionary`` keyed by the model:
the compiled functions (which hold the frozen weights as constants) are freed with the
model, and nothing is written on the model itself. A compiled function refers to the
weights' tensors, never to the model, so the entry does not keep its own key alive.

**Invalidated when the weights change.** A store is for one :func:`weights_signature`
(the parameters' storage addresses and in-place version counters): ``model.to(...)``,
``param.data = ...`` or an optimizer step changes it, and the next verifier or prefill
that looks finds the store emptied and compiles afresh (frozen weights are constants).

**Captured graphs are lent, not shared.** A captured CUDA graph replays the very tensors it
was captured on (its bucket's buffers and its KV cache), and one cache serves one sequence,
so a verifier's device state (cache, buffers, graphs: ``device_set.DeviceSet``) belongs to one
verifier at a time. But capturing every bucket again for each ``specdec.run`` costs more
than a short generation (measured on an H200, default model's shape: a one-off ``run`` of
64 tokens took 2-10x a warmed Generator's time), so a verifier that is done with its state
(:meth:`Generator.close`, which ``run`` calls, or its garbage collection) gives it back here
(:func:`give_back`) and the model's next verifier with the same setting takes it
(:func:`take_idle`): a second ``run`` captures nothing. At most :data:`IDLE_PER_SETTING`
states wait per setting, held weakly by the model like the compiled forwards.

**Self-check results.** A compiled function whose first forward agreed with the eager
forward (:func:`disagreement`) is marked checked, so later verifiers do not check it again;
a mode that failed to compile or disagreed is remembered per store, so later verifiers of the
model go eager straight away (with their own warning) instead of failing again.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

# Largest |compiled - eager| a logit may show, relative to max(1, the row's largest |eager| logit),
# per dtype: far above the rounding of another kernel order, far below a wrong forward's error. float64:
# inductor's compiled forward of a tiny fp64 Llama on a GPU has differed from eager by a few 1e-6 of the
# row's scale, so 1e-6 refused a correct forward; 1e-4 is still 10x under float32's.
TOLERANCE = {torch.float64: 1e-4, torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2}


@dataclass
class SharedForward:
    """One bucket's compiled function (what ``torch.compile`` returned) and whether its output was checked."""

    function: Callable[..., torch.Tensor]
    checked: bool = False


@dataclass
class ForwardStore:
    """A model's shared compiled forwards, for the weights of ``signature``."""

    signature: tuple[int, int]
    forwards: dict[tuple[str, int, int], SharedForward] = field(default_factory=dict)  # (mode, bucket, capacity)
    capacity: dict[str, int] = field(default_factory=dict)  # mode -> the cache capacity its forwards are for
    failed: dict[str, str] = field(default_factory=dict)  # mode -> why it falls back to eager

    def forward(self, mode: str, size: int, capacity: int,
                build: Callable[[], Callable[..., torch.Tensor]]) -> SharedForward:
        """The shared forward of the ``size``-node bucket on a cache of ``capacity`` slots, built (and
        counted in :data:`COMPILED`) when there is none.

        One capacity per mode is kept, the largest: a forward is specialised to its cache's
        capacity, and verifiers reserve at least this one (:meth:`reserved`), so forwards for a
        smaller one would never run again and are dropped (with the weights they froze).
        """
        global COMPILED
        with _LOCK:
            shared = self.forwards.get((mode, size, capacity))
            if shared is None:
                shared = self.forwards[(mode, size, capacity)] = SharedForward(build())
                COMPILED += 1
                if capacity > self.capacity.get(mode, 0):
                    self.capacity[mode] = capacity
                    for key in [k for k in self.forwards if k[0] == mode and k[2] < capacity]:
                        del self.forwards[key]
            return shared

    def drop(self, mode: str, size: int, capacity: int) -> None:
        """Forget one bucket's compiled function (its compile failed: the next :meth:`forward` builds anew)."""
        with _LOCK:
            self.forwards.pop((mode, size, capacity), None)

    def reserved(self, mode: str) -> int:
        """The capacity a new verifier in ``mode`` reserves at least, to run the forwards compiled already."""
        with _LOCK:
            return self.capacity.get(mode, 0)


_STORES: weakref.WeakKeyDictionary[Any, dict[Hashable, ForwardStore]] = weakref.WeakKeyDictionary()
_IDLE: weakref.WeakKeyDictionary[Any, dict[Hashable, list[Any]]] = weakref.WeakKeyDictionary()
IDLE_PER_SETTING = 1  # device states (KV cache, buffers, CUDA graphs) kept per model and setting for reuse
_LOCK = threading.Lock()
COMPILED = 0  # compiled functions built in this process (tests count what a call compiled)


def weights_signature(model: Any) -> tuple[int, int]:
    """``(sum of the parameters' version counters, hash of their storage addresses)``.

    Versions only grow, so any in-place update raises the sum; moving, casting or
    re-assigning ``.data`` changes the addresses.
    """
    parameters = list(model.parameters())
    version = sum(int(p._version) for p in parameters)
    return version, hash(tuple(p.data_ptr() for p in parameters))


def store_for(model: Any, setting: Hashable, signature: tuple[int, int]) -> ForwardStore:
    """The store of ``model``'s forwards under ``setting`` (dtype, device, kernels, ...) for weights ``signature``.

    A store made for other weights is emptied first: its compiled functions hold the old ones.
    """
    with _LOCK:
        stores = _STORES.get(model)
        if stores is None:
            stores = _STORES[model] = {}
        store = stores.get(setting)
        if store is None or store.signature != signature:
            store = stores[setting] = ForwardStore(signature)
        return store


def take_idle(model: Any, setting: Hashable) -> Any | None:
    """A device state a finished verifier of ``model`` gave back under ``setting``, or None (module docstring)."""
    with _LOCK:
        idle = _IDLE.get(model, {}).get(setting)
        return idle.pop() if idle else None


def give_back(model_ref: weakref.ReferenceType[Any], setting: Hashable, state: Any) -> None:
    """Keep ``state`` for the next verifier of the model ``model_ref`` names (dropped once
    :data:`IDLE_PER_SETTING` wait, or when the model is gone)."""
    model = model_ref()
    if model is None:
        return
    with _LOCK:
        idle = _IDLE.setdefault(model, {}).setdefault(setting, [])
        if len(idle) < IDLE_PER_SETTING:
            idle.append(state)


def idle_count(model: Any) -> int:
    """How many device states wait for reuse on ``model`` (what the tests count)."""
    with _LOCK:
        return sum(len(states) for states in _IDLE.get(model, {}).values())


def stores_of(model: Any) -> dict[Hashable, ForwardStore]:
    """The model's stores, by setting (empty when it has none): for tests and ``specdec cache info``."""
    with _LOCK:
        return dict(_STORES.get(model, {}))


def forget(model: Any = None) -> None:
    """Drop ``model``'s shared forwards and idle device states (every model's with None): they are
    compiled or captured again at next use."""
    with _LOCK:
        if model is None:
            _STORES.clear()
            _IDLE.clear()
        else:
            _STORES.pop(model, None)
            _IDLE.pop(model, None)


def disagreement(compiled: torch.Tensor, eager: torch.Tensor) -> str | None:
    """Why ``compiled`` logits ``[N, V]`` are not the eager forward's ``eager`` on the same inputs, or None.

    They agree when every logit is within :data:`TOLERANCE` of the eager one (relative to the
    row's scale) and every row's argmax is the eager argmax, or a token whose eager logit is
    within that tolerance of the top one (a near-tie: rounding may pick either, as between
    the eager forwards of two tree sizes).
    """
    if compiled.shape != eager.shape:
        return f"logits of shape {tuple(compiled.shape)}, expected {tuple(eager.shape)}"
    tolerance = TOLERANCE.get(eager.dtype, 1e-3)
    compiled, eager = compiled.detach().double(), eager.detach().double()
    allowed = tolerance * eager.abs().amax(dim=-1).clamp_min(1.0)  # [N]
    error = ((compiled - eager).abs().amax(dim=-1) - allowed).nan_to_num(nan=float("inf"))  # NaN: too far
    if bool((error > 0).any()):
        row = int(error.argmax())
        worst = float((compiled[row] - eager[row]).abs().max())
        return f"node {row}: max |logit difference| {worst:.3g} > {float(allowed[row]):.3g}"
    chosen = compiled.argmax(dim=-1)  # [N]
    short = eager.amax(dim=-1) - eager.gather(1, chosen[:, None])[:, 0]  # how far below the top it is
    if bool((short > allowed).any()):
        row = int((short - allowed).argmax())
        return f"node {row}: argmax {int(chosen[row])}, the eager forward's {int(eager[row].argmax())}"
    return None
