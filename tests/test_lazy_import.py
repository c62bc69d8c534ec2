"""``import specdec`` is cheap (PEP 562: public names are imported at first use) and the public API is whole."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import specdec


def test_import_specdec_is_cheap_and_the_public_names_resolve() -> None:
    code = "import specdec, sys; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    for name in specdec.__all__:
        assert getattr(specdec, name) is not None
    assert set(dir(specdec)) >= set(specdec.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = specdec.nope  # type: ignore[attr-defined]


@pytest.mark.slow  # a child process that imports torch and transformers: ~15 s on 2 cores
def test_specdec_runs_without_matplotlib() -> None:
    """matplotlib is the ``bench`` extra: with it unimportable, ``import specdec`` and ``specdec.run`` still work,
    and a plot asks for the extra by name."""
    code = "\n".join([
        "import sys",
        "sys.modules['matplotlib'] = None  # any import of matplotlib now raises ImportError",
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})",
        "import specdec",
        "from tiny_models import tiny_model",
        "result = specdec.run(tiny_model('llama'), [3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4], 'pld', max_new_tokens=8)",
        "assert len(result.tokens) == 8, result.tokens",
        "from specdec.bench.plot import pyplot",
        "try:",
        "    pyplot()",
        "except ImportError as error:",
        "    print('plot:', error)",
        "print('ok', 'matplotlib.pyplot' in sys.modules)",
    ])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pip install 'specdec-lossless[bench]'" in done.stdout
    assert done.stdout.strip().endswith("ok False")
