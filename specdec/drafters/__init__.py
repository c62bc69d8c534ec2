"""Production drafters and the registry that maps names to them.

``make_factory("pld", num_draft=8)`` returns a factory of per-sequence drafters; names
join with ``+`` for composites (``"sam+recycling"``) once both parts are registered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from specdec.drafters import arctic
from specdec.drafters.base import DrafterContext, Factory, parse_options
from specdec.drafters.composite import composite_factory
from specdec.drafters.eagle import eagle_factory
from specdec.drafters.model_draft import draft_model_factory, early_exit_factory
from specdec.drafters.none import NoDrafter
from specdec.drafters.pld import PLDConfig, PromptLookupDrafter
from specdec.drafters.recycling import RecyclingConfig, RecyclingDrafter, check_template
from specdec.drafters.recycling_templates import resolve_template
from specdec.drafters.rest import rest_factory
from specdec.drafters.sam import sam_factory
from specdec.errors import SpecDecError
from specdec.types import Drafter, DrafterFactory


def _none_factory(options: Mapping[str, Any], context: DrafterContext) -> DrafterFactory:
    if options:
        raise SpecDecError(f"drafter 'none' takes no options, got {sorted(options)}")
    return Factory("none", NoDrafter)


def _pld_factory(options: Mapping[str, Any], context: DrafterContext) -> DrafterFactory:
    config = parse_options(PLDConfig, "pld", options)
    return Factory("pld", lambda: PromptLookupDrafter(config))


def _recycling_factory(options: Mapping[str, Any], context: DrafterContext) -> DrafterFactory:
    config = parse_options(RecyclingConfig, "recycling", options)
    template = resolve_template(config.template, config.k)  # read once, shared by every drafter
    check_template(template, config.k)
    shared = context.recycling

    def build() -> RecyclingDrafter:
        state = None if shared is None else shared.get(config.k)
        return RecyclingDrafter(config, context.vocab_size, template, state)

    return Factory("recycling", build)


# name -> builder of a factory from the user's options and what is known of the target
REGISTRY: dict[str, Callable[[Mapping[str, Any], DrafterContext], DrafterFactory]] = {
    "eagle": eagle_factory,
    "early-exit": early_exit_factory,
    "model": draft_model_factory,
    "none": _none_factory,
    "pld": _pld_factory,
    "recycling": _recycling_factory,
    "rest": rest_factory,
    "sam": sam_factory,
}
# The drafters that run a model (the target's first layers, a draft model, a head over its features): they need
# the target or a draft model, so suites that build every registered drafter from a name alone leave these out.
MODEL_DRAFTERS = ("eagle", "early-exit", "model")
# Arctic Inference's suffix decoding, a peer to measure against: listed only where it is installed.
if arctic.installed():
    REGISTRY["arctic"] = arctic.arctic_factory


def available_drafters() -> list[str]:
    """Names :func:`make_factory` accepts."""
    return sorted(REGISTRY)


def make_factory(
    name: str, options: Mapping[str, Any] | None = None, context: DrafterContext | None = None
) -> DrafterFactory:
    """The factory for drafter ``name`` with ``options``; a clear error lists the valid names."""
    if not isinstance(name, str):
        raise SpecDecError(f"drafter must be a name or a Drafter object, got {type(name).__name__}")
    if "+" in name:  # a composite "A+B": retrieval drafter A, auxiliary drafter B
        return composite_factory(name.strip().lower(), dict(options or {}), context or DrafterContext(), REGISTRY)
    builder = REGISTRY.get(name.strip().lower())
    if builder is None:
        raise SpecDecError(f"unknown drafter {name!r}; valid names: {', '.join(available_drafters())}")
    return builder(dict(options or {}), context or DrafterContext())


def resolve_drafter(
    spec: str | Drafter | DrafterFactory,
    options: Mapping[str, Any] | None = None,
    context: DrafterContext | None = None,
) -> Drafter:
    """A drafter instance from a name, a factory, or an instance (used as is, keeping its state)."""
    if isinstance(spec, str):
        return make_factory(spec, options, context).create()
    if options:
        raise SpecDecError("drafter options apply only when the drafter is given by name")
    if isinstance(spec, Drafter):
        return spec
    create = getattr(spec, "create", None)
    if callable(create):
        drafter = create()
        if isinstance(drafter, Drafter):
            return drafter
    raise SpecDecError(f"drafter must be a name, a Drafter or a factory, got {type(spec).__name__}")


__all__ = [
    "MODEL_DRAFTERS",
    "REGISTRY",
    "DrafterContext",
    "NoDrafter",
    "PromptLookupDrafter",
    "available_drafters",
    "make_factory",
    "resolve_drafter",
]
