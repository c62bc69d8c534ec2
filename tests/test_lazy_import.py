"""``import specdec`` is cheap (PEP 562: public names are imported at first use) and the public API is whole."""

from __future__ import annotations

import subprocess
import sys

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
