"""Every drafter specdec ships is registered, by name (issue 29).

Tests elsewhere iterate over drafter lists without asking whether each one exists; a drafter
dropped from the registry must fail here, by name, not turn into a skip or a shorter loop.
"""

from __future__ import annotations

import pytest

import specdec
from specdec.drafters import REGISTRY, arctic, make_factory
from specdec.drafters.composite import CompositeDrafter
from specdec.errors import SpecDecError

# Every drafter that must exist in every checkout; "arctic" (a peer to measure against) is listed
# exactly where Arctic Inference is installed.
MUST_EXIST = ("eagle", "early-exit", "model", "none", "pld", "recycling", "rest", "sam")


def test_every_drafter_is_registered() -> None:
    expected = sorted(MUST_EXIST + (("arctic",) if arctic.installed() else ()))
    assert sorted(REGISTRY) == expected
    assert specdec.available_drafters() == expected


@pytest.mark.parametrize("name", ["none", "pld", "recycling", "sam"])
def test_each_drafter_builds_without_options(name: str) -> None:
    """Each one that needs no datastore builds from its name alone (rest needs a datastore: its own tests)."""
    drafter = make_factory(name).create()
    assert drafter.name == name


@pytest.mark.parametrize("name", ["sam+recycling", "pld+recycling"])
def test_the_composites_build(name: str) -> None:
    assert isinstance(make_factory(name).create(), CompositeDrafter)


def test_an_unknown_drafter_names_the_valid_ones() -> None:
    with pytest.raises(SpecDecError, match="(?s)'pdl'.*none.*pld.*recycling.*rest.*sam"):
        make_factory("pdl")
