"""The package's layers, top to bottom: a module imports only from its own layer or the
layers below it, and no modules import each other in a circle.

Every import counts: at the top of a module, inside a function, and under
``TYPE_CHECKING`` (an annotation is a dependency too). Read with ``ast``; nothing is
imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "proxy"

# Top to bottom: (layer, the modules and packages in it). A module is in the layer of the
# longest name that holds it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("process", ("proxy.__main__", "proxy.process", "proxy.showcase", "proxy.fake_upstream")),
    ("api", ("proxy.api",)),
    ("pipeline", ("proxy.pipeline", "proxy.keys")),
    ("observability", ("proxy.observability",)),
    ("routing", ("proxy.routing",)),
    ("upstream", ("proxy.upstream",)),
    ("request", ("proxy.request",)),
    ("catalog", ("proxy.catalog",)),
    ("money, providers, translation", ("proxy.money", "proxy.providers", "proxy.translate")),
    ("shapes", ("proxy.shapes",)),
    ("limiter", ("proxy.limiter",)),
    ("config", ("proxy.config",)),
    ("base", ("proxy", "proxy.errors", "proxy.values", "proxy.costs", "proxy.background")),
)


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = modules()


def owner(name: str) -> str | None:
    """The module that ``name`` (a module, or a name in one) is, or is defined in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imported(module: str, path: Path) -> Iterator[str]:
    """The package's modules that ``module`` imports, anywhere in it."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            target = owner(name) if name.split(".")[0] == "proxy" else None
            if target is not None and target != module:
                yield target


GRAPH = {module: sorted(set(imported(module, path))) for module, path in MODULES.items()}


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (length of the name that holds it, layer)
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (
                best is None or len(name) > best[0]
            ):
                best = (len(name), index)
    return None if best is None else best[1]


def circles() -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in GRAPH[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            part = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                part.append(other)
                if other == module:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for module in GRAPH:
        if module not in index:
            visit(module)
    return found


def test_every_module_has_a_layer() -> None:
    assert [module for module in MODULES if layer_of(module) is None] == []


def test_imports_point_down() -> None:
    upward = []
    for module, targets in GRAPH.items():
        own = layer_of(module)
        for target in targets:
            theirs = layer_of(target)
            if own is not None and theirs is not None and theirs < own:
                upward.append(f"{module} ({LAYERS[own][0]}) imports {target} ({LAYERS[theirs][0]})")
    assert upward == []


def test_no_import_circles() -> None:
    described = []
    for part in circles():
        ties = [f"{a} -> {b}" for a in part for b in GRAPH[a] if b in part]
        layers = sorted({LAYERS[i][0] for m in part if (i := layer_of(m)) is not None})
        described.append(f"{', '.join(part)} (layers: {', '.join(layers)}): {'; '.join(ties)}")
    assert described == []


def test_the_reading_sees_the_imports() -> None:
    """The graph is read, not empty: the pipeline imports the dispatcher, relative imports
    resolve, a name imported from a package is its module's."""
    assert "proxy.routing.dispatcher" in GRAPH["proxy.pipeline.pipeline"]
    assert "proxy.fake_upstream.bodies" in GRAPH["proxy.fake_upstream.windows"]
    assert owner("proxy.config.settings.Settings") == "proxy.config.settings"
