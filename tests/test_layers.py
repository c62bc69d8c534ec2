"""The house's layer rule, read from the code (docs/architecture.md, "Layers").

    commands -> bench / integrations -> api -> engine / drafters / budget -> backends / datastores
             -> types -> ground room (cachefiles, errors);   reference/ imports only types and errors

Every import of a specdec module anywhere in ``specdec/`` counts: at the top of a module,
inside functions, under ``if TYPE_CHECKING``. A module may import its own layer or lower
ones, never a higher one; no library module imports the command wing; no modules, nor
rooms (a top-level file or a package folder), import each other in a circle; and no module
imports another's private (underscore) name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "specdec"

# Top layer first. A module belongs to the first layer with a prefix of its dotted name.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("commands", ("specdec.commands",)),
    ("bench / integrations", ("specdec.bench", "specdec.integrations")),
    ("api", ("specdec.api", "specdec.turns", "specdec.hf", "specdec.testing", "specdec.coercion",
             "specdec.model_cache", "specdec.options", "specdec.batch_rows", "specdec")),  # "specdec": __init__.py
    ("engine / drafters / budget", ("specdec.engine", "specdec.batching", "specdec.decoding", "specdec.drafters",
                                    "specdec.budget")),
    ("backends / datastores", ("specdec.backends", "specdec.datastores", "specdec.models", "specdec.gguf_weights",
                               "specdec.model_memory", "specdec.sampling", "specdec.native")),
    ("reference", ("specdec.reference",)),
    ("types", ("specdec.types",)),
    ("ground room", ("specdec.cachefiles", "specdec.errors")),
]
REFERENCE_MAY_IMPORT = ("specdec.types", "specdec.errors")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> int:
    """The index of ``module``'s layer in :data:`LAYERS` (0: the top); ``specdec`` alone names the package face."""
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or (p != "specdec" and module.startswith(p + ".")) for p in prefixes):
            return index
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS (and to docs/architecture.md)")


def imports(module: str, source: str | None = None) -> Iterator[tuple[str, int]]:
    """Every specdec module ``module`` (its file, or ``source``) imports, with the line: anywhere in
    the file, ``from X import Y`` counting ``X.Y`` when that is a module."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8") if source is None else source)
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                     for a in node.names]
        for name in names:
            while name not in MODULES and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in MODULES and name != module:
                yield name, node.lineno


def room(module: str) -> str:
    """The room a module stands in: ``specdec/<top-level file>`` or ``specdec/<package folder>``."""
    parts = module.split(".")
    return ".".join(parts[:2])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_has_a_layer() -> None:
    assert len(MODULES) > 50  # the walk found the package
    for module in MODULES:
        layer(module)


def test_no_import_runs_up_a_layer() -> None:
    wrong = [
        f"{module} ({LAYERS[layer(module)][0]}) imports {target} ({LAYERS[layer(target)][0]}), line {line}"
        for module in MODULES for target, line in imports(module) if layer(target) < layer(module)
    ]
    assert not wrong, "imports that run up a layer:\n" + "\n".join(wrong)


def test_no_library_module_imports_the_command_wing() -> None:
    wrong = [f"{module} imports {target}, line {line}" for module in MODULES if layer(module) > 0
             for target, line in imports(module) if layer(target) == 0]
    assert not wrong, "library modules importing the commands:\n" + "\n".join(wrong)


def test_the_reference_imports_only_types_and_errors() -> None:
    wrong = [f"{module} imports {target}, line {line}" for module in MODULES if module.startswith("specdec.reference")
             for target, line in imports(module)
             if not target.startswith("specdec.reference") and target not in REFERENCE_MAY_IMPORT]
    assert not wrong, "the oracle shares code with what it judges:\n" + "\n".join(wrong)


def test_no_circles_of_modules_or_rooms() -> None:
    modules = {module: {target for target, _ in imports(module)} for module in MODULES}
    rooms: dict[str, set[str]] = {}
    for module, targets in modules.items():
        rooms.setdefault(room(module), set()).update(room(t) for t in targets if room(t) != room(module))
    assert not cycles(modules), f"modules importing each other in a circle: {cycles(modules)}"
    assert not cycles(rooms), f"rooms (files, package folders) importing each other in a circle: {cycles(rooms)}"


def private_imports(module: str, source: str | None = None) -> Iterator[str]:
    """``from specdec.X import _name`` in ``module`` (its file, or ``source``): another module's private name."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8") if source is None else source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specdec") and not node.level:
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    yield f"{module} imports {node.module}.{alias.name}, line {node.lineno}"


def test_no_module_imports_another_modules_private_name() -> None:
    wrong = [found for module in MODULES for found in private_imports(module)]
    assert not wrong, "private names imported across modules:\n" + "\n".join(wrong)


def test_the_checks_see_what_they_must() -> None:
    """The walk reads imports inside functions and under TYPE_CHECKING, and the layers order as the rule says."""
    source = (
        "import typing\n"
        "from specdec import drafters\n"
        "if typing.TYPE_CHECKING:\n"
        "    from specdec.api import run\n"
        "def f():\n"
        "    import specdec.engine\n"
    )
    seen = sorted(imports("specdec.types", source))
    assert seen == [("specdec.api", 4), ("specdec.drafters", 2), ("specdec.engine", 6)]
    assert layer("specdec.commands.generate") < layer("specdec.bench.runner") < layer("specdec.api")
    assert layer("specdec.api") < layer("specdec.engine") < layer("specdec.backends.verifier") < layer("specdec.types")
    assert layer("specdec.types") < layer("specdec.cachefiles") and layer("specdec") == layer("specdec.api")
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    private = "from specdec.backends.verifier import KVState, _hidden\nfrom specdec import __version__\n"
    assert list(private_imports("specdec.types", private)) == [
        "specdec.types imports specdec.backends.verifier._hidden, line 1"]
    assert layer("specdec.coercion") == layer("specdec.model_cache") == layer("specdec.api")
    assert layer("specdec.options") == layer("specdec.batch_rows") == layer("specdec.api")
    assert layer("specdec.backends.buckets.runner") == layer("specdec.backends.buckets.forward")


# The engines' wings of specdec/backends/ (docs/architecture.md): each imports the hall and itself, never another wing.
WINGS = ("specdec.backends.hf", "specdec.backends.specdec_engine", "specdec.backends.buckets")


def wing(module: str) -> str | None:
    """The wing of :data:`WINGS` that ``module`` stands in, or None (the hall, or outside backends)."""
    return next((w for w in WINGS if module == w or module.startswith(w + ".")), None)


def test_no_wing_imports_another() -> None:
    assert wing("specdec.backends.buckets.rows") == "specdec.backends.buckets" and wing("specdec.backends.tree") is None
    assert all(w in MODULES for w in WINGS)  # the wings are packages the walk found
    wrong = [f"{module} imports {target}, line {line}" for module in MODULES if wing(module)
             for target, line in imports(module) if wing(target) not in (None, wing(module))]
    assert not wrong, "a wing reaching into another (shared code goes in the hall):\n" + "\n".join(wrong)
