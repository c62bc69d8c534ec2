"""Op calls in child processes, many per child: a crash fails the case that caused it, not the suite.

Vocabulary. A *case* (:class:`Case`) is one call of an op, its arguments described as data
(:class:`T`: a tensor the child builds on the device under test), and what the call must do:
raise a ``RuntimeError`` whose message matches ``match``, or, with ``match=None``, return. A
*mode* (:data:`MODES`) is how the child makes the call: torch on one thread, on several, and
from a Python thread. An *outcome* is what one call did; a case's *verdict* is its outcome in
every mode, or how a child died on it.

:func:`run_cases` pickles a batch of cases to one child interpreter, so the ~2 s of starting
Python and importing torch are paid once per batch, not once per case. The child announces
each call before making it and prints its outcome the moment it has it. On CUDA it also checks,
after every call, that the context still works (a device-side assert or a stray write would
break it for good). When a child dies (a signal, an exit, a hang) or finds its context broken,
the call it announced last is the suspect: that case runs again alone in a fresh child, and its
verdict says whether it dies there too (the case is the culprit, named with the signal) or only
after the cases before it (they are named). The cases not yet reached go on in a new child.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

THREADS = 4  # the "several threads" mode; more than this machine's cores is fine for tiny ops
MODES = ("threads=1", f"threads={THREADS}", f"python thread, threads={THREADS}")
OTHER = "other"  # T.device: a device other than the one under test (meta beside the CPU, the CPU beside CUDA)
DEVICE = "<the device under test>"  # an argument the child replaces with the device's name
_LINE = "@@case "  # prefix of the child's protocol lines on stdout
DEVICE_MISMATCH = r"(is on|must be a CUDA tensor|must be on one device)"  # what a device mix is answered with


@dataclass(frozen=True)
class T:
    """A tensor the child builds: ``values`` (nested lists) or, without them, normal samples of ``shape``.

    ``layout``: ``"contiguous"``; ``"strided"``, every other element of a tensor twice as wide
    (same values, not contiguous); ``"transposed"``, the last two axes' strides swapped (same
    values). ``device``: None for the device under test, :data:`OTHER`, or a device name.
    """

    values: Any = None
    shape: tuple[int, ...] = ()
    dtype: torch.dtype = torch.int64
    layout: str = "contiguous"
    device: str | None = None

    def build(self, device: str) -> torch.Tensor:
        where = device if self.device is None else other_device(device) if self.device == OTHER else self.device
        if self.values is not None:
            tensor = torch.tensor(self.values, dtype=torch.int64 if _all_ints(self.values) else torch.float64)
        else:
            tensor = torch.randn(self.shape, dtype=torch.float64)
        tensor = tensor.to(self.dtype).to(where)
        if self.layout == "strided" and tensor.dim() >= 1:
            wide = torch.zeros((*tensor.shape[:-1], 2 * tensor.shape[-1]), dtype=tensor.dtype, device=where)
            wide[..., ::2] = tensor
            return wide[..., ::2]
        if self.layout == "transposed" and tensor.dim() >= 2:
            return tensor.transpose(-1, -2).contiguous().transpose(-1, -2)
        return tensor


def _all_ints(values: Any) -> bool:
    if isinstance(values, list | tuple):
        return all(_all_ints(v) for v in values)
    return isinstance(values, int)


def other_device(device: str) -> str:
    return "meta" if device == "cpu" else "cpu"


@dataclass(frozen=True)
class Case:
    """One call: ``op`` (a name in ``specdec.backends.cuda_ext.ops``, or ``"module:function"``) on ``args``.

    ``status``: False, no status; True, a fresh one (``ops.new_status``), checked after the call
    with ``ops.check_status`` as the fast path's caller would; a :class:`T`, that tensor as the
    status (to test bad ones). ``match``: the regex the RuntimeError's message must match, or
    None when the call must return.
    """

    name: str
    op: str
    args: tuple[Any, ...]
    match: str | None
    status: bool | T = False


@dataclass
class Verdict:
    """What a case did: its outcome per mode, or how a child died on it (``death``)."""

    case: Case
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)
    death: str | None = None

    def problems(self) -> list[str]:
        """Every way the case failed its expectation; empty when it met it in every mode."""
        if self.death is not None:
            return [f"{self.case.name}: {self.death}"]
        found = []
        for mode in MODES:
            outcome = self.outcomes.get(mode)
            if outcome is None:
                found.append(f"{self.case.name} [{mode}]: no outcome reported")
                continue
            said = f"{outcome.get('type')}: {outcome.get('message')!r}" if outcome["kind"] == "raised" else "returned"
            if self.case.match is None:
                if outcome["kind"] != "returned":
                    found.append(f"{self.case.name} [{mode}]: must return, raised {said}")
            elif outcome["kind"] != "raised" or not outcome["runtime_error"]:
                found.append(
                    f"{self.case.name} [{mode}]: must raise a RuntimeError matching {self.case.match!r}, {said}"
                )
            elif not re.search(self.case.match, outcome["message"]):
                found.append(f"{self.case.name} [{mode}]: message does not match {self.case.match!r}: {said}")
            if outcome.get("cache_changed") and outcome["kind"] == "raised":
                found.append(f"{self.case.name} [{mode}]: raised, but the cache was changed first")
        return found


# -- the child ------------------------------------------------------------------------------------


def _emit(record: dict[str, Any]) -> None:
    sys.stdout.write(_LINE + json.dumps(record) + "\n")
    sys.stdout.flush()


def _argument(spec: Any, device: str) -> Any:
    if isinstance(spec, T):
        return spec.build(device)
    if isinstance(spec, list):
        return [_argument(item, device) for item in spec]
    return device if isinstance(spec, str) and spec == DEVICE else spec


def _call_once(case: Case, device: str, mode: str) -> dict[str, Any]:
    """Build the case's arguments afresh, call it as ``mode`` says, and describe what happened."""
    from specdec.backends.cuda_ext import ops

    torch.manual_seed(0)
    args = [_argument(spec, device) for spec in case.args]
    status = ops.new_status(device) if case.status is True else case.status.build(device) if case.status else None
    kwargs = {} if status is None else {"status": status}
    module, _, name = case.op.rpartition(":")
    function = getattr(importlib.import_module(module) if module else ops, name)
    cache = args[0] if case.op == "compact_kv" and isinstance(args[0], list) else []
    before = [t.clone() for t in cache if t.device.type != "meta"]

    def call() -> None:
        function(*args, **kwargs)
        if case.status is True:
            ops.check_status(status)  # the caller's report at its own sync (a no-op sync on the CPU)

    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            call()
        except Exception as error:  # reported, whatever it is: the parent judges it
            errors.append(error)

    torch.set_num_threads(1 if mode == MODES[0] else THREADS)
    if mode == MODES[2]:
        worker = threading.Thread(target=guarded)
        worker.start()
        worker.join()
    else:
        guarded()
    outcome: dict[str, Any] = {"kind": "returned"}
    if errors:
        error = errors[0]
        outcome = {
            "kind": "raised",
            "type": type(error).__name__,
            "runtime_error": isinstance(error, RuntimeError),
            "message": " ".join(str(error).split()),
        }
    after = [t for t in cache if t.device.type != "meta"]
    outcome["cache_changed"] = any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    return outcome


def _context_broken(device: str) -> str | None:
    """On CUDA: None while the context still runs a kernel and synchronizes, else the error."""
    if not device.startswith("cuda"):
        return None
    try:
        torch.cuda.synchronize()
        if int(torch.ones(4, device=device).sum().item()) != 4:
            return "a sum of four ones is not 4"
    except Exception as error:
        return " ".join(str(error).split())
    return None


def child_main() -> None:
    """The child: read (device, cases) from stdin, run every case in every mode, print outcomes."""
    device, cases = pickle.load(sys.stdin.buffer)
    from specdec.backends.cuda_ext import load

    load()
    for index, case in enumerate(cases):
        for mode in MODES:
            _emit({"event": "start", "case": index, "mode": mode})
            outcome = _call_once(case, device, mode)
            _emit({"event": "done", "case": index, "mode": mode, "outcome": outcome})
            broken = _context_broken(device)
            if broken is not None:
                _emit({"event": "broken", "case": index, "mode": mode, "message": broken})
                sys.stdout.flush()
                os._exit(3)


# -- the parent -----------------------------------------------------------------------------------


@dataclass
class _ChildRun:
    outcomes: dict[int, dict[str, dict[str, Any]]]  # case index -> mode -> outcome
    last_started: int | None
    death: str | None  # None: every case ran and the child exited cleanly
    stderr: str


def _run_child(cases: Sequence[Case], device: str, timeout_s: float) -> _ChildRun:
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    child = subprocess.Popen(
        [sys.executable, "-c", "import child_cases; child_cases.child_main()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment,
    )  # fmt: skip
    try:
        stdout, stderr = child.communicate(pickle.dumps((device, list(cases))), timeout=timeout_s)
        hung = False
    except subprocess.TimeoutExpired:
        child.kill()  # our own child, by its handle
        stdout, stderr = child.communicate()
        hung = True
    outcomes: dict[int, dict[str, dict[str, Any]]] = {}
    last_started, broken = None, None
    for line in stdout.decode(errors="replace").splitlines():
        if not line.startswith(_LINE):
            continue
        record = json.loads(line[len(_LINE) :])
        if record["event"] == "start":
            last_started = record["case"]
        elif record["event"] == "done":
            outcomes.setdefault(record["case"], {})[record["mode"]] = record["outcome"]
        else:
            broken = record["message"]
    finished = len(outcomes) == len(cases) and all(len(modes) == len(MODES) for modes in outcomes.values())
    if hung:
        death = f"hung: the child was killed after {timeout_s:.0f} s"
    elif broken is not None:
        death = f"left the CUDA context broken: {broken}"
    elif child.returncode < 0:
        death = f"killed the child with {signal.Signals(-child.returncode).name}"
    elif child.returncode != 0 or not finished:
        death = f"made the child exit with status {child.returncode}"
    else:
        death = None
    return _ChildRun(outcomes, last_started, death, stderr.decode(errors="replace"))


def _tail(text: str, lines: int = 6) -> str:
    kept = text.strip().splitlines()[-lines:]
    return (" | child stderr: " + " / ".join(kept)) if kept else ""


def run_cases(cases: Sequence[Case], device: str, timeout_s: float = 300.0) -> dict[str, Verdict]:
    """Every case's verdict, by name, from as few child processes as the cases allow (see the module doc)."""
    names = [case.name for case in cases]
    if len(set(names)) != len(names):
        raise ValueError(f"case names must be unique: {sorted({n for n in names if names.count(n) > 1})}")
    verdicts: dict[str, Verdict] = {}
    start = 0
    while start < len(cases):
        batch = cases[start:]
        run = _run_child(batch, device, timeout_s)
        for index, modes in run.outcomes.items():
            verdicts[batch[index].name] = Verdict(batch[index], modes)
        if run.death is None:
            break
        if run.last_started is None:
            raise RuntimeError(f"the child {run.death} before its first case{_tail(run.stderr, 20)}")
        suspect = batch[run.last_started]
        alone = _run_child([suspect], device, timeout_s)
        if alone.death is not None:
            verdicts[suspect.name] = Verdict(suspect, death=alone.death + _tail(alone.stderr))
        else:
            before = ", ".join(case.name for case in batch[: run.last_started]) or "none"
            verdicts[suspect.name] = Verdict(
                suspect,
                alone.outcomes.get(0, {}),
                death=f"{run.death} after the cases before it in its child ({before}), though not alone"
                + _tail(run.stderr),
            )
        start += run.last_started + 1
    return verdicts


def failures(verdicts: dict[str, Verdict]) -> list[str]:
    return [problem for verdict in verdicts.values() for problem in verdict.problems()]
