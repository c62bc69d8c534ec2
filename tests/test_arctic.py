"""The ``arctic`` peer drafter (Arctic Inference's suffix decoding), where it is installed.

Layers: registration follows installation; the conversion of Arctic's drafts to our trees;
bad options; token identity with plain greedy decoding on tiny fp64 models, per request
and with the shared cache (whose repeated prompt is drafted from the earlier answer).
Skipped, with the reason, where ``arctic-inference`` is not installed (an optional peer); with
``SPECDEC_REQUIRE_ARCTIC=1`` (CI, which installs it beside the suite: ``.ci/run``) its absence fails instead.
"""

from __future__ import annotations

import os
import random

import pytest
from conftest import IDENTITY_COUNTS
from tiny_models import VOCAB, tiny_model

import specdec
from specdec.drafters import REGISTRY, make_factory
from specdec.drafters import arctic as arctic_module
from specdec.errors import SpecDecError


def test_registered_exactly_when_installed() -> None:
    assert ("arctic" in REGISTRY) == arctic_module.installed()


def test_conversion_to_our_tree() -> None:
    tree = arctic_module.arctic_tree(7, [8, 9, 5, 6], [-1, 0, -1, 2], [0.9, 0.45, 0.1, 1.0])
    assert tree.tokens == (7, 8, 9, 5, 6) and tree.parents == (-1, 0, 1, 0, 3)
    assert tree.node_features == (10, 9, 4, 1, 10) and tree.source == "arctic"


arctic_installed = pytest.mark.skipif(not arctic_module.installed(),
                                      reason=f"arctic-inference is not installed ({arctic_module.INSTALL_HINT})")


def test_installed_where_required() -> None:
    if os.environ.get("SPECDEC_REQUIRE_ARCTIC") == "1":
        assert arctic_module.installed(), f"SPECDEC_REQUIRE_ARCTIC=1 but {arctic_module.INSTALL_HINT} did not"


@arctic_installed
def test_bad_options_are_refused() -> None:
    with pytest.raises(SpecDecError, match="max_spec_factor must be a number >= 0, got -1"):
        make_factory("arctic", {"max_spec_factor": -1})
    with pytest.raises(SpecDecError, match="max_cached_requests must be -1 .* got 0"):
        make_factory("arctic", {"shared": True, "max_cached_requests": 0})
    with pytest.raises(SpecDecError, match="shared and use_tree_spec must be True or False"):
        make_factory("arctic", {"shared": "yes"})
    with pytest.raises(SpecDecError, match="no option 'depth'"):
        make_factory("arctic", {"depth": 3})


@arctic_installed
@pytest.mark.parametrize("arch", ["llama", "gpt_neox", "qwen3"])
def test_arctic_matches_plain_greedy(arch: str) -> None:
    from test_lossless import hf_greedy

    model = tiny_model(arch)
    rng = random.Random(f"arctic-{arch}")
    prompts = [[rng.randrange(2, VOCAB) for _ in range(rng.randrange(4, 16))] for _ in range(2)]
    truths = [hf_greedy(model, prompt, 24) for prompt in prompts]
    for options in ({}, {"shared": True, "max_spec_factor": 4.0}):
        generator = specdec.Generator(model, drafter="arctic", drafter_options=options, budget="full")
        steps = []
        for index in (0, 1, 0):
            result = generator.generate(prompts[index], max_new_tokens=24)
            assert result.tokens == truths[index], f"{arch}: options {options}, prompt {prompts[index]}"
            IDENTITY_COUNTS[f"{arch}/arctic"] += 1
            steps.append(result.stats.steps)
        if options.get("shared"):
            assert steps[2] < steps[0]  # the repeated prompt's answer came from the shared cache
        else:
            assert steps[2] == steps[0]  # per request: nothing carried over
