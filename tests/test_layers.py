"""The package layering (docs/architecture.md, "Packages"): no import from a lower layer to a
higher one, no cycle between packages, and no actor or HTTP library in the pure RL math.

Read with ``ast`` from the source, imports inside functions included: a lazy import is still
a dependency.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "actorjet"

# lowest first; a unit is a package (directory) or a top-level module of actorjet
LAYERS = [
    {"errors", "signing", "checks", "disk"},                                 # no ActorJet import
    {"rl", "monitor", "behaviors", "config", "job_schema"},                  # math, files, formats, the job schema
    {"runtime"},                                                             # actor system, transport
    {"store"},                                                               # the episode store
    {"serving"},                                                             # engines, gateway (HTTP APIs)
    {"models"},                                                              # zoo, evaluation, preparing a job
    {"registry", "runner"},                                                  # desks; the runner side
    {"actors"},                                                              # thin actor shells
    {"research"},                                                            # studies of many jobs
    {"cli", "__init__"},                                                     # what users call
]
NO_ACTORS_OR_HTTP = {"rl": ("thespian", "aiohttp", "urllib", "http", "requests", "openai", "actorjet.runtime")}


def unit_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imports(path: Path) -> list[str]:
    """Every module a file imports (``from actorjet import x`` counts as ``actorjet.x``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [f"actorjet.{a.name}" for a in node.names] if node.module == "actorjet" else [node.module]
    return out


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        src = unit_of(path)
        for name in imports(path):
            parts = name.split(".")
            if parts[0] == "actorjet" and len(parts) > 1 and parts[1] != src:
                edges.setdefault(src, set()).add(parts[1])
    return edges


def layer(unit: str) -> int:
    for i, units in enumerate(LAYERS):
        if unit in units:
            return i
    raise AssertionError(f"actorjet/{unit} is in no layer: add it to LAYERS (and to docs/architecture.md)")


def test_every_unit_has_a_layer():
    for path in ROOT.rglob("*.py"):
        layer(unit_of(path))


def upward(edges: dict[str, set[str]]) -> list[str]:
    return [f"{src} (layer {layer(src)}) imports {dst} (layer {layer(dst)})"
            for src, dsts in edges.items() for dst in dsts if layer(dst) > layer(src)]


def cycle(edges: dict[str, set[str]]) -> list[str]:
    """One import cycle as a path (first node repeated at the end), or []."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = "done"
        return []

    for node in sorted(edges):
        if node not in state and (found := visit(node, [node])):
            return found
    return []


def test_no_import_from_a_lower_layer_to_a_higher_one():
    bad = upward(graph())
    assert not bad, "\n".join(bad)


def test_no_cycle_between_packages():
    found = cycle(graph())
    assert not found, "import cycle: " + " -> ".join(found)


def test_the_checks_catch_what_they_are_for(tmp_path):
    """Each rule fails on the shape it forbids (the graph before packages by role had both)."""
    assert upward({"runtime": {"registry"}}) == ["runtime (layer 2) imports registry (layer 6)"]
    assert cycle({"runtime": {"registry"}, "registry": {"serving"}, "serving": {"runtime"}}) == \
        ["registry", "serving", "runtime", "registry"]
    assert cycle({"a": {"b"}, "b": set()}) == []
    scratch = tmp_path / "probe.py"
    scratch.write_text("from actorjet import signing\nimport aiohttp\n\ndef f():\n    import thespian.actors\n")
    assert imports(scratch) == ["actorjet.signing", "aiohttp", "thespian.actors"]


def test_pure_rl_math_imports_no_actor_or_http_library():
    for unit, banned in NO_ACTORS_OR_HTTP.items():
        for path in (ROOT / unit).rglob("*.py"):
            bad = [name for name in imports(path) if name.startswith(banned)]
            assert not bad, f"{path.relative_to(ROOT.parent)} imports {bad}"


def test_no_two_modules_share_a_name():
    """A name says which module it is: ``engine.py`` in two packages makes every mention ambiguous."""
    seen: dict[str, Path] = {}
    for path in sorted(ROOT.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        assert path.name not in seen, f"{path.relative_to(ROOT)} and {seen[path.name].relative_to(ROOT)} share a name"
        seen[path.name] = path
