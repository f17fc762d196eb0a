"""The package's floors (DESIGN.md, Layout): a module imports only from the floors below its
own and from its own package, no import forms a circle, and every environment lives in
`batchrl/environments/`.

An import counts wherever it is written, at a module's top or inside a function (a deferred
import still runs up a floor when it runs), and so does a string naming a module of batchrl
(lazy exports and moved modules import by name)."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1] / "batchrl"
# DESIGN.md's floors, from the bottom up. A part of the package is a subpackage, or a module
# of the package itself.
FLOORS = {"tools": 1, "spaces": 1,
          "environments": 2, "networks": 2, "memories": 2, "optimizers": 2, "drivers": 2,
          "algorithms": 3,
          "front": 4,  # configs, build, export (and the package's `__init__`).
          "agent": 5, "distributed": 5,
          "scripts": 6}
# Parts on floor 0, under every floor, which import nothing of batchrl (asserted): the lazy
# exports every package uses, and ConfigError, raised on floors 2 and 3 (DESIGN.md lists
# errors.py with the front; it is a leaf every floor shares).
GROUND = {"_lazy", "errors"}
# Modules of the package itself that form one part, and second names of a part.
PARTS = {"configs": "front", "build": "front", "export": "front", "__init__": "front",
         # `batchrl.native_tasks`: the public name of environments.native.
         "native_tasks": "environments"}
# The parts on or above its floor that a module may name in a string, not import: DESIGN.md's
# first names of the drivers and environments (`tools.simulate`, `tools.BatchEnv`, ...) and
# the old paths of modules that left tools/, exported lazily by name; `batchrl.Agent`.
ALIASES = {"batchrl.tools": {"drivers", "environments", "spaces"}, "batchrl": {"agent"}}
# A string that names a module of batchrl (lazy exports and moved modules import by name).
_MODULE_NAME = re.compile(r"batchrl(\.\w+)+")


def _module(path):
    relative = path.relative_to(ROOT.parent).with_suffix("")
    return ".".join(relative.parts[:-1] if relative.name == "__init__" else relative.parts)


def _part(module):
    pieces = module.split(".")
    part = pieces[1] if len(pieces) > 1 else "__init__"
    return PARTS.get(part, part)


def _floor(part):
    return 0 if part in GROUND else FLOORS[part]


def _graph():
    """The import graph of batchrl's modules: module -> {module it imports: whether only by
    a string}. A name is resolved to the module that holds it (`from batchrl.drivers import
    loop` is `batchrl.drivers.loop`, `from batchrl.drivers import Loop` the package), an old
    path to the package that keeps it; imports of a module itself and of `batchrl` (whose
    `__init__` every import runs) are left out."""
    paths = {_module(path): path for path in ROOT.rglob("*.py")}

    def resolve(name):
        while name not in paths:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for module, path in paths.items():
        targets = {}
        for node in ast.walk(ast.parse(path.read_text())):
            by_string = isinstance(node, ast.Constant)
            if by_string:
                names = [node.value] if isinstance(node.value, str) \
                    and _MODULE_NAME.fullmatch(node.value) else []
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in paths
                         else node.module for alias in node.names]
            else:
                names = []
            for name in names:
                if name.split(".")[0] != "batchrl":
                    continue
                target = resolve(name)
                if target not in (module, "batchrl"):
                    targets[target] = targets.get(target, True) and by_string
        graph[module] = targets
    return graph


def _upward(graph):
    """The imports of `graph` that break the floors: of a part on the same floor or above
    (not the module's own part, nor a string that ALIASES allows), as readable lines."""
    wrong = []
    for module, targets in sorted(graph.items()):
        part = _part(module)
        for target, by_string in sorted(targets.items()):
            other = _part(target)
            if other == part or by_string and other in ALIASES.get(module, ()):
                continue
            if _floor(other) >= _floor(part):
                wrong.append(f"{module} (floor {_floor(part)}) imports {target} "
                             f"(floor {_floor(other)})")
    return wrong


def _circle(graph):
    """A circle of `graph` (node -> nodes it points to) as the list of its nodes, the first
    repeated at the end, or None: a depth-first search that meets a node still on its path."""
    done, path = set(), []

    def visit(node):
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if target in path:
                return path[path.index(target):] + [target]
            if target not in done:
                circle = visit(target)
                if circle:
                    return circle
        done.add(path.pop())
        return None

    for node in sorted(graph):
        if node not in done:
            circle = visit(node)
            if circle:
                return circle
    return None


def test_every_part_is_on_a_floor_and_the_ground_imports_nothing():
    graph = _graph()
    parts = {_part(module) for module in graph}
    assert parts - set(FLOORS) - GROUND == set(), "parts on no floor of DESIGN.md"
    assert {module: targets for module, targets in graph.items()
            if _part(module) in GROUND and targets} == {}


def test_a_module_imports_only_from_floors_below_or_its_own_package():
    assert _upward(_graph()) == []


def test_no_import_forms_a_circle():
    circle = _circle(_graph())
    assert circle is None, "a circle of imports: " + " -> ".join(circle)


def test_the_floor_check_finds_imports_up_or_across_a_floor():
    """The floor check on the real graph with edges put in (it would pass on anything
    otherwise)."""
    graph = _graph()
    graph["batchrl.tools.streaming"]["batchrl.scripts.train"] = False
    graph["batchrl.drivers.loop"]["batchrl.environments.local"] = False  # Same floor.
    graph["batchrl.tools"]["batchrl.algorithms.base"] = True  # A string ALIASES does not allow.
    graph["batchrl.tools"]["batchrl.drivers.loop"] = True  # One it allows.
    graph["batchrl.memories.replay"]["batchrl.distributed.pool"] = True
    graph["batchrl.configs"]["batchrl.agent"] = False  # The front under the Agent.
    assert set(_upward(graph)) - set(_upward(_graph())) == {
        "batchrl.configs (floor 4) imports batchrl.agent (floor 5)",
        "batchrl.drivers.loop (floor 2) imports batchrl.environments.local (floor 2)",
        "batchrl.memories.replay (floor 2) imports batchrl.distributed.pool (floor 5)",
        "batchrl.tools (floor 1) imports batchrl.algorithms.base (floor 3)",
        "batchrl.tools.streaming (floor 1) imports batchrl.scripts.train (floor 6)"}


def test_the_circle_search_names_the_modules_of_a_circle():
    """On graphs of known answers, and on the real graph with one edge put in."""
    assert _circle({"a": {"b"}, "b": {"c", "d"}, "c": set(), "d": {"e"}, "e": {"b"}}) \
        == ["b", "d", "e", "b"]
    assert _circle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) is None
    graph = _graph()
    assert "batchrl.configs" in graph["batchrl.build"]
    graph["batchrl.configs"]["batchrl.build"] = False
    circle = _circle(graph)
    assert circle[0] == circle[-1] and set(circle) == {"batchrl.build", "batchrl.configs"}


def test_tools_holds_no_environment():
    names = {path.stem for path in (ROOT / "tools").glob("*.py")}
    assert not {name for name in names if "env" in name}, names
    assert not any("gymnasium.Env" in path.read_text() and "class " in path.read_text()
                   and "(gymnasium.Env)" in path.read_text()
                   for path in (ROOT / "tools").glob("*.py"))


def test_tests_mirror_the_package():
    """tests/ mirrors the package: a folder of tests per subpackage of batchrl (and for the
    repository's benchmarks/ and examples/); the tests of the front's modules and of the
    whole package at the top."""
    tests = pathlib.Path(__file__).resolve().parent
    folders = {path.name for path in tests.iterdir()
               if path.is_dir() and any(path.glob("test_*.py"))}
    rooms = {path.name for path in ROOT.iterdir() if (path / "__init__.py").exists()}
    assert folders <= rooms | {"benchmarks", "examples"}, folders - rooms
    assert not {f"test_{room}.py" for room in rooms} & {path.name for path in tests.glob("*.py")}
    for folder in folders:
        assert (tests / folder / "__init__.py").exists(), folder


def test_no_module_is_longer_than_600_lines():
    """One concept per file: a module past 600 lines is usually two (the bound of the
    composition issue); the list names each one over it."""
    lengths = {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
               for path in ROOT.rglob("*.py")}
    assert max(lengths.values()) > 300  # The files were read.
    assert {path: count for path, count in lengths.items() if count > 600} == {}
