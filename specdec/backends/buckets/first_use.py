"""The bucket runners of a fixed-shape forward, each checked at its first use against the eager forward.

A compiled or captured forward that fails to build, or whose first output disagrees with the
eager forward's on the same inputs (:func:`~specdec.backends.buckets.shared.disagreement`), must
not emit a token: :class:`CheckedRunners` then runs that step and every later one of its forward
(and of the model's later forwards in that mode) eagerly, with one warning naming the engine.
"""

from __future__ import annotations

import warnings
from typing import Protocol

import torch

from specdec.backends.buckets import compile_cache
from specdec.backends.buckets.device_set import DeviceSet
from specdec.backends.buckets.runner import BucketHost, BucketRunner
from specdec.backends.buckets.shared import ForwardStore, disagreement
from specdec.backends.buckets.sizes import bucket_for


class RunnersHost(BucketHost, Protocol):
    """What :class:`CheckedRunners` reads of the forward it serves."""

    engine: str
    mode: str
    buckets: tuple[int, ...]

    @property
    def held(self) -> DeviceSet: ...

    def shared_store(self) -> ForwardStore: ...


class CheckedRunners:
    """The runners of ``host``'s buckets (made at first use, by ``runner_class``), and the first-use check
    of the compiled or captured ones (module docstring)."""

    def __init__(self, host: RunnersHost, runner_class: type[BucketRunner]) -> None:
        self.host = host
        self.runner_class = runner_class
        self.fallback_reason: str | None = None  # why the forwards gave way to eager ones (None: they did not)

    def runner(self, size: int) -> BucketRunner:
        """The runner of the bucket that holds ``size`` nodes (made on first use)."""
        host = self.host
        bucket = bucket_for(size, host.buckets)
        runners = host.held.runners
        runner = runners.get(bucket)
        if runner is None:
            failed = host.shared_store().failed.get(host.mode) if host.mode != "eager" else None
            if failed is not None and self.fallback_reason is None:  # an earlier forward of the model found it
                self._fall_back(failed, "failed for this model earlier in this process")
            mode = host.mode if self.fallback_reason is None else "eager"
            runner = runners[bucket] = self.runner_class(host, bucket, mode)
        return runner

    def run(self, runner: BucketRunner) -> torch.Tensor:
        """``runner.run()``, checked at its first use against the eager forward on the same inputs.

        The eager forward runs first, so the cache ends up holding what the checked forward wrote, as
        on any later step; a failure or a disagreement falls back (module docstring).
        """
        if runner.checked:
            return runner.run()
        reference = runner.eager()
        try:
            logits = runner.run()
        except Exception as error:  # any compiler or capture failure: fall back, loudly
            first_line = str(error).splitlines()[0] if str(error) else ""
            reason = f"{type(error).__name__}: {first_line}"
            retried = self._compile_again(runner, reason)
            if retried is None:
                self._fall_back(reason, "are not possible for this model")
                return runner.eager()  # a failed forward may have written the slots: write them again
            logits = retried
        problem = disagreement(logits[: runner.filled], reference[: runner.filled])
        if problem is not None:
            self._fall_back(f"the {runner.size}-node bucket, {problem}", "disagree with the eager forward")
            return runner.eager()  # the cache holds what the wrong forward wrote: write it again
        runner.checked = True
        if runner.shared is not None and runner.mode == "inductor":  # later forwards take it as checked
            runner.shared.checked = True
        return logits

    def _compile_again(self, runner: BucketRunner, reason: str) -> torch.Tensor | None:
        """A compile that failed while reading compiled code from disk: empty that folder and compile the
        bucket once more without it (:func:`~specdec.backends.buckets.compile_cache.discard`, once per process);
        the retry's logits, or None (nothing to retry, or it failed too: the caller falls back)."""
        if runner.shared is None or runner.mode != "inductor" or not compile_cache.discard(reason):
            return None
        host = self.host
        host.shared_store().drop(runner.mode, runner.size, host.cache.capacity)
        runner.shared = host.shared_forward(runner.size, runner.mode)
        runner.reset_compiled()
        try:
            with compile_cache.disabled():
                return runner.run()
        except Exception:
            return None

    def _fall_back(self, reason: str, what: str) -> None:
        """Run eager forwards from now on (this forward, and the model's later ones in this mode), saying why."""
        host = self.host
        self.fallback_reason = reason
        host.shared_store().failed.setdefault(host.mode, reason)
        warnings.warn(
            f"engine={host.engine!r}: its forwards {what} ({reason}); verifying with eager forwards "
            "on the static cache instead",
            RuntimeWarning,
            stacklevel=5,
        )
        runners = host.held.runners
        buckets = list(runners)
        host.held.drop_runners()  # their graphs go, and a fresh pool serves any later capture
        for bucket in buckets:
            runners[bucket] = self.runner_class(host, bucket, "eager")
