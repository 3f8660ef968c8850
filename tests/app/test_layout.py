"""The shape of the code, checked from its source: the import graph (no
circles, layers point down), module and function sizes, the installed
package list, and NOTE blocks that every reference can find."""

from __future__ import annotations

import ast
import re
import tomllib
from collections import defaultdict
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
# repository folder -> installed package
FOLDERS = {
    "memplan": "memplan",
    "traces": "memplan.traces",
    "hwmodels": "memplan.hwmodels",
    "planners": "memplan.planners",
    "sim": "memplan.sim",
    "validate": "memplan.validate",
}
LAYERS = ["memplan.traces", "memplan.hwmodels", "memplan.planners", "memplan.sim",
          "memplan.validate"]  # fmt: skip


def modules() -> dict[str, Path]:
    """Installed module name -> source file, for every module of the project."""
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


MODULES = modules()


def imports(name: str, path: Path) -> set[str]:
    """The project modules `name` imports anywhere in its source: inside
    functions too (a deferred import still closes a circle), and under `if
    TYPE_CHECKING:` (an annotation naming a module that imports this one is a
    back-reference, a circle in the design)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            for a in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{base}.{a.name}"
                found.add(sub if sub in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = nx.DiGraph()
for _name, _path in MODULES.items():
    GRAPH.add_node(_name)
    GRAPH.add_edges_from((_name, m) for m in imports(_name, _path))


def layer(module: str) -> int:
    """0 traces .. 4 validate; 5 the app shell (memplan.cli, memplan.commands, ...)."""
    for i, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            return i
    return len(LAYERS)


def test_no_import_circles():
    cycles = list(nx.simple_cycles(GRAPH))
    assert cycles == [], "import circles: " + "; ".join(" -> ".join(c) for c in cycles[:5])


def test_layers_only_point_down():
    up = [(a, b) for a, b in GRAPH.edges if layer(b) > layer(a)]
    assert up == []


def test_planners_never_import_sim_and_the_runtime_stays_light():
    bad = [(a, b) for a, b in GRAPH.edges if a.startswith("memplan.planners") and layer(b) >= 3]
    assert bad == []
    runtime = [m for m in MODULES if m.startswith("memplan.validate.runtime")]
    assert runtime, "validate/runtime/ exists"
    reach = set().union(*(nx.descendants(GRAPH, m) for m in runtime))
    heavy = sorted(
        m for m in reach if m.startswith(("memplan.sim", "memplan.validate.replay",
                                          "memplan.validate.calibrate"))
    )  # fmt: skip
    assert heavy == []


# The planners' rooms: what each may import (besides traces and hwmodels).
ROOMS = {
    "memplan.planners.core": {"memplan.planners.core"},
    "memplan.planners.analysis": {"memplan.planners.core", "memplan.planners.analysis"},
    "memplan.planners.heuristics": {
        "memplan.planners.core", "memplan.planners.analysis", "memplan.planners.heuristics"},
    "memplan.planners.cpsat": {
        "memplan.planners.core", "memplan.planners.analysis", "memplan.planners.heuristics",
        "memplan.planners.cpsat"},
    "memplan.planners.search": {
        "memplan.planners.core", "memplan.planners.analysis", "memplan.planners.heuristics",
        "memplan.planners.search"},
}  # fmt: skip


def room(module: str) -> str | None:
    return next((r for r in ROOMS if module == r or module.startswith(r + ".")), None)


def top_level_imports(path: Path) -> set[str]:
    """Imports at module level (what loading the module runs)."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            out.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES
                       else node.module for a in node.names)  # fmt: skip
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in MODULES}


def test_planner_rooms_point_down():
    """core <- analysis <- heuristics <- cpsat, registry on top. CP-SAT's hint
    option looks another planner up in the registry by name, inside a function."""
    bad = []
    for name, path in MODULES.items():
        r = room(name)
        if r is None:
            continue
        for m in top_level_imports(path):
            if m.startswith("memplan.planners") and room(m) not in ROOMS[r]:
                bad.append((name, m))
    assert bad == []


def long_functions(path: Path) -> list[tuple[str, int]]:
    """(name, lines) of the functions in `path` longer than 100 lines."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = node.end_lineno - node.lineno + 1
            if n > 100:
                out.append((node.name, n))
    return out


def test_no_function_over_100_lines():
    """Modules are split by concept, not by length (no cap on a module);
    a function stays readable on a screen or two."""
    long = [(name, f, k) for name, path in MODULES.items() for f, k in long_functions(path)]
    assert long == []


def test_pyproject_lists_every_package():
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(doc["tool"]["setuptools"]["packages"])
    packages = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    assert listed == packages
    assert doc["tool"]["setuptools"]["package-dir"] == {p: f for f, p in FOLDERS.items()}


# ---- NOTE blocks ---------------------------------------------------------------------
NOTE = re.compile(r"NOTE \[ ([^\]]+?) \]")
DEFINITION = re.compile(r"^\s*# NOTE \[ ([^\]]+?) \]\s*$")


def note_sites() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(name -> definition sites, name -> reference sites) over the project's
    code, tests, benchmarks, README and docs."""
    defs: dict[str, list[str]] = defaultdict(list)
    refs: dict[str, list[str]] = defaultdict(list)
    files = [p for p in MODULES.values()]
    files += [p for p in sorted((ROOT / "tests").rglob("*.py")) if p != Path(__file__)]
    files += sorted((ROOT / "benchmarks").glob("*.py"))
    files += [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for path in files:
        if not path.exists():
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            site = f"{path.relative_to(ROOT)}:{i}"
            d = DEFINITION.match(line)
            if d and path.suffix == ".py":
                defs[d.group(1)].append(site)
                continue
            for m in NOTE.finditer(line):
                refs[m.group(1)].append(site)
    return defs, refs


def test_every_note_reference_resolves_to_one_definition():
    defs, refs = note_sites()
    twice = {k: v for k, v in defs.items() if len(v) > 1}
    dangling = {k: v[:3] for k, v in refs.items() if k not in defs}
    assert (twice, dangling) == ({}, {})


@pytest.mark.parametrize("name", sorted(note_sites()[0]))
def test_a_note_is_a_comment_next_to_code(name):
    """A definition is a `# NOTE [ X ]` comment line followed by more comment
    lines, never part of a docstring."""
    defs, _ = note_sites()
    path, line = defs[name][0].rsplit(":", 1)
    lines = (ROOT / path).read_text().splitlines()
    following = lines[int(line)] if int(line) < len(lines) else ""
    assert following.strip().startswith("#"), f"{defs[name][0]}: NOTE [ {name} ] has no body"
