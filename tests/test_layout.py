"""The house's layout, checked from the code's own imports: no import circles inside
the package, doors that point one way (server -> engine -> memory), ``server/`` going
through ``engine``'s one door, and every engine room a package with its docstring.

Every import counts, wherever it stands: at the top, inside a function, or under
``TYPE_CHECKING`` (a circle hidden in a function is still a circle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("server", "engine", "memory")
ROOMS = {
    "engine": ("core", "scheduling", "prompt_cache", "sampling", "text", "loading", "models", "kernels"),
    "server": ("config", "middleware", "schemas", "pipeline", "routes", "telemetry", "router"),
    "memory": ("attention", "recurrent", "composite", "files"),
}
# Inside server/ and memory/: each room or top module, lowest first. A module imports only
# what stands before its own place (or in its own room): imports point one way.
ORDER = {
    "server": (
        "__init__",  # the version only
        "errors",
        "engine_errors",  # the engine's errors as HTTP answers (the model server's app alone)
        "listen",  # the listening sockets of a server or a router
        "middleware",
        "config",
        "telemetry",
        "state",
        "schemas",
        "pipeline",
        "routes",
        "app",
        "serve",
        "router",  # router mode: proxies to child servers (started as ``cli``), imports no model, no torch
        "cli",
    ),
    "memory": (
        "kv_codec",
        "spec",
        "protocol",
        "snapshot_shelf",
        "kind_base",
        "attention",
        "recurrent",
        "composite",
        "files",
        "registry",
        "__init__",
    ),
}
TOP = {  # the modules a package may hold outside its rooms
    "engine": 8,
    "server": len(ORDER["server"]) - len(ROOMS["server"]),
    "memory": len(ORDER["memory"]) - len(ROOMS["memory"]),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules this file imports (``from a.b import c`` is ``a.b.c``
    when that is a module, else ``a.b``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return {m for m in found if m in modules}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), plus self-loops."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles(graph):
    cycles = _cycles(graph)
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_doors_point_one_way(graph):
    wrong = []
    for module, imported in graph.items():
        top = module.split(".")[0]
        for target in imported:
            to = target.split(".")[0]
            if top == "memory" and to != "memory":
                wrong.append(f"{module} -> {target} (memory imports no engine or server code)")
            if top == "engine" and to == "server":
                wrong.append(f"{module} -> {target} (the engine knows no HTTP)")
            if top == "server" and to == "memory":
                wrong.append(f"{module} -> {target} (server reaches memory only through the engine)")
            if top == "server" and to == "engine" and target != "engine":
                wrong.append(f"{module} -> {target} (server goes through engine's one door: `from engine import`)")
    assert not wrong, "\n".join(sorted(wrong))


def test_nothing_inside_engine_goes_through_its_door(graph):
    """``engine/__init__`` is the door for ``server/``; modules inside the engine import
    each other directly (through the door they would import the whole engine)."""
    inside = [m for m, imported in graph.items() if m.startswith("engine.") and "engine" in imported]
    assert not inside, inside


@pytest.mark.parametrize("package", sorted(ROOMS))
def test_rooms_are_packages_that_say_what_they_own(package):
    for room in ROOMS[package]:
        init = ROOT / package / room / "__init__.py"
        assert init.is_file(), f"{package}/{room}/ is not a package"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{package}/{room}/__init__.py has no docstring"
    rooms = sorted(p.name for p in (ROOT / package).iterdir() if (p / "__init__.py").is_file())
    assert rooms == sorted(ROOMS[package]), f"{package}/ has rooms {rooms}, the layout names {ROOMS[package]}"
    flat = sorted(p.name for p in (ROOT / package).glob("*.py"))
    assert len(flat) <= TOP[package], f"{package}/ holds {len(flat)} modules at its top: {flat}"


def _place(module: str) -> str:
    """``server.routes.slot_api`` -> ``routes``; ``server.app`` -> ``app``; ``server`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _wrong_way(graph: dict[str, set[str]], package: str) -> list[str]:
    order = ORDER[package]
    wrong = []
    for module, imported in graph.items():
        if module.split(".")[0] != package:
            continue
        here = order.index(_place(module))
        for target in imported:
            if target.split(".")[0] == package and _place(target) != _place(module):
                if order.index(_place(target)) > here:
                    wrong.append(f"{module} -> {target}")
    return wrong


def test_the_order_check_finds_an_import_that_points_up():
    fake = {"server.errors": {"server.routes.slot_api"}, "server.routes.slot_api": {"server.errors"}}
    assert _wrong_way(fake, "server") == ["server.errors -> server.routes.slot_api"]


@pytest.mark.parametrize("package", sorted(ORDER))
def test_rooms_import_one_way(graph, package):
    modules = [m for m in graph if m.split(".")[0] == package]
    unplaced = sorted({_place(m) for m in modules} - set(ORDER[package]))
    assert not unplaced, f"{package}/: {unplaced} stand in no place of ORDER (name them there)"
    wrong = _wrong_way(graph, package)
    assert not wrong, "imports that point up: " + "; ".join(sorted(wrong))


def test_no_route_calls_another_route(graph):
    """Routes share the pipeline (server/pipeline/), never each other."""
    routes = [m for m in graph if m.startswith("server.routes.")]
    calls = sorted(f"{m} -> {t}" for m in routes for t in graph[m] if t.startswith("server.routes.") and t != m)
    assert not calls, calls


def test_the_router_and_the_command_line_import_no_torch():
    """A router process proxies to its children and never runs a model: the router, the
    settings and the console script's parser import neither torch nor the engine's rooms
    (it once imported all of them through the engine's door and the error handlers:
    5.5 s of start and 284 MB resident, now 1.2 s and 66 MB on the 2-core Xeon)."""
    import subprocess
    import sys

    code = (
        "import sys; import server.cli, server.config.flags, server.router.serve; "
        "from engine import DEMO_MODEL; server.cli.build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m.startswith('engine.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['engine.demo']"
