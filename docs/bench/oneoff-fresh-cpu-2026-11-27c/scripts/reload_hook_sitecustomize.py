import builtins
import sys

_real = builtins.__import__
_done = []


def _hook(name, *a, **k):
    m = _real(name, *a, **k)
    if (
        not _done
        and "specdec.bench.oneoff" in sys.modules
        and hasattr(sys.modules["specdec.bench.oneoff"], "timed_generate")
    ):
        _done.append(1)
        mod = sys.modules["specdec.bench.oneoff"]
        orig = mod.timed_generate

        def timed_generate(generator, ids, spec, max_new_tokens):
            from specdec.api import Generator

            g2 = Generator(generator.model, generator.tokenizer, drafter=spec.name, store=False)
            return orig(g2, ids, spec, max_new_tokens)

        mod.timed_generate = timed_generate
    return m


builtins.__import__ = _hook
