"""The import rules of the package, read from its source with `ast` (nothing of edgetrain is
imported, so a cycle cannot hide behind import order).

The rules (docs/architecture.md, "Layers"):
  1. no cycle among the package's Python modules, counting the imports that run (one under
     `if TYPE_CHECKING:` only names a type for an annotation);
  2. no module imports another module's private name (`from .x import _y`, or `x._y` on a module);
  3. the compiler never imports the application wing: only app/ imports app/, and only app/
     and reports/ import reports/, apart from the edges named in REPORT_EDGES;
  4. a unit imports only units of its own floor or of the floors below (LAYERS, bottom first).

Every import statement counts, at module level or inside a function; importing `a.b.c` also
loads the packages `a.b` and `a` (their `__init__`), so those are edges too. Each failure
names the offending imports as `module (file:line) -> module`.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

PACKAGE = "edgetrain"
SRC = Path(__file__).resolve().parents[1] / "src" / PACKAGE

#: The floors of the package, bottom first: a unit imports units of its own floor or lower
#: ones, never higher (within a floor, the cycle test keeps imports one way). A unit is a
#: top-level module or subpackage of edgetrain (backends/ is one unit: the runners of compiled programs;
#: the reference interpreter the compiler runs graphs with is interpreter.py); "edgetrain" is
#: the package's own __init__, the public facade. Derived from the drawing in
#: docs/architecture.md ("Layers"), each of its floors ordered by what reads what.
LAYERS: list[tuple[str, ...]] = [
    # model: values and graphs, one OpDef per op, device profiles and targets
    ("ir", "config", "safepickle", "scale"),
    ("ops", "devices"),
    # compiler
    ("frontend", "autodiff", "interpreter"),
    ("memory",),
    ("passes",),
    ("quantize", "trainable"),
    ("pipeline",),
    # above the pipeline's phases: the search for a sparse scheme and contribution analysis
    # run them; a POET schedule is applied, and its program planned, through them
    ("sparse", "remat"),
    # programs: the frozen compiled program, its runners, the C backend
    ("runtime",),
    ("backends",),
    ("program",),
    # public API
    ("api", "models"),
    ("torch_backend",),
    ("edgetrain",),
    # application wing
    ("reports", "data", "federated"),
    ("app",),
]

#: The imports of reports/ from below it, each with why. MemoryReport.plot (prog.memory.plot,
#: the public API) draws through reports/, lazily; the plot module imports nothing of the
#: compiler (the test below keeps that true).
REPORT_EDGES = {("edgetrain.memory.report", "edgetrain.reports.memory_timeline"):
                "MemoryReport.plot(path) draws the timeline on first use"}


@dataclass(frozen=True)
class Import:
    """One edgetrain module loaded by an import statement of another."""

    importer: str
    line: int
    module: str
    name: Optional[str] = None  # the name taken from `module` by `from module import name`
    typing_only: bool = False  # under `if TYPE_CHECKING:`: names types for annotations, never runs

    def where(self, modules: dict) -> str:
        """`module (path/under/src.py:line)` of the import statement."""
        path = modules[self.importer][0]
        top = modules[self.importer.split(".")[0]][0].parent.parent
        return f"{self.importer} ({path.relative_to(top)}:{self.line})"


def find_modules(src: Path = SRC) -> dict[str, tuple[Path, bool]]:
    """{dotted module name: (file, is a package's __init__)} for every .py file under `src`."""
    out = {}
    for f in sorted(src.rglob("*.py")):
        parts = list(f.relative_to(src.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return out


def _target(modules: dict, base: str, name: str) -> str:
    """What `from base import name` loads: the submodule base.name if there is one, else base."""
    return f"{base}.{name}" if f"{base}.{name}" in modules else base


def _typing_only(tree: ast.AST) -> set[ast.AST]:
    """The import statements under `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (getattr(node.test, "id", None) == "TYPE_CHECKING"
                                         or getattr(node.test, "attr", None) == "TYPE_CHECKING"):
            out.update(n for stmt in node.body for n in ast.walk(stmt))
    return out


def direct_imports(modules: dict) -> list[Import]:
    """Every import statement of the package's modules, as the package modules it names."""
    out = []
    for mod, (path, is_pkg) in modules.items():
        here = mod.split(".") if is_pkg else mod.split(".")[:-1]
        tree = ast.parse(path.read_text(), str(path))
        typing_only = _typing_only(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                if base not in modules:
                    continue
                for alias in node.names:
                    tgt = _target(modules, base, alias.name)
                    out.append(Import(mod, node.lineno, tgt, None if tgt != base else alias.name,
                                      node in typing_only))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    found = [".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules]
                    if found:
                        out.append(Import(mod, node.lineno, found[0], None, node in typing_only))
    return out


def import_graph(modules: dict, imports: list[Import], run_time: bool = False) -> dict[str, dict[str, Import]]:
    """{module: {module it loads: the first import doing it}}, with the parent packages an
    import loads on the way (except the importer's own, which are loading already; a name taken
    from the importer's own package, `from . import register`, is an edge to its __init__).
    `run_time`: only the imports that run (not those under `if TYPE_CHECKING:`)."""
    graph: dict[str, dict[str, Import]] = {m: {} for m in modules}
    for imp in imports:
        if run_time and imp.typing_only:
            continue
        parts = imp.module.split(".")
        for i in range(2, len(parts) + 1):
            tgt = ".".join(parts[:i])
            if tgt != imp.importer and (tgt == imp.module or not imp.importer.startswith(tgt + ".")):
                graph[imp.importer].setdefault(tgt, imp)
    return graph


def tangles(graph: dict[str, dict]) -> list[set[str]]:
    """The strongly connected components of more than one module: each module of one reaches
    every other through imports (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, comps = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(set(comp))
    return comps


def cycles(graph: dict[str, dict]) -> list[list[str]]:
    """One shortest cycle (modules, the first repeated at the end) in each of `tangles(graph)`."""
    return [_a_cycle(graph, min(c), c) for c in tangles(graph)]


def _a_cycle(graph: dict, start: str, comp: set) -> list[str]:
    """The shortest path from `start` back to itself inside `comp` (breadth first)."""
    prev, todo = {}, [start]
    while todo:
        nxt = []
        for v in todo:
            for w in sorted(graph[v]):
                if w in comp and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        if start in prev:
            break
        todo = nxt
    path, v = [start], prev[start]
    while v != start:
        path.append(v)
        v = prev[v]
    return [start] + path[::-1][:-1] + [start] if len(path) > 1 else [start, start]


def private_names(modules: dict, imports: list[Import]) -> list[tuple[Import, str]]:
    """(import, private name) for `from x import _y` and for `x._y` on a module bound by an
    import statement, where x is another module of the package; dunder names are public."""
    def private(n: str) -> bool:
        return n.startswith("_") and not (n.startswith("__") and n.endswith("__"))

    out = [(imp, imp.name) for imp in imports if imp.name and private(imp.name) and imp.module != imp.importer]
    for mod, (path, is_pkg) in modules.items():
        here = mod.split(".") if is_pkg else mod.split(".")[:-1]
        tree = ast.parse(path.read_text(), str(path))
        bound = {}  # local name -> module it names
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
                for alias in node.names:
                    if f"{base}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules and alias.asname:
                        bound[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and private(node.attr) and bound[node.value.id] != mod):
                out.append((Import(mod, node.lineno, bound[node.value.id], node.attr), node.attr))
    return out


def unit_of(module: str) -> str:
    """The floor-table unit of a module: its top-level module or subpackage under edgetrain."""
    parts = module.split(".")
    if len(parts) == 1:
        return parts[0]
    return parts[1]


def floor_violations(graph: dict, layers: list[tuple[str, ...]]) -> list[tuple[Import, str, int, int]]:
    """(import, unit it reaches, importer's floor, that unit's floor) for every import of a
    unit on a higher floor than the importer's, once per statement and unit."""
    floor = {u: i for i, units in enumerate(layers) for u in units}
    out, seen = [], set()
    for mod, deps in graph.items():
        for tgt, imp in deps.items():
            a, b = unit_of(mod), unit_of(tgt)
            if a != b and floor[b] > floor[a] and (imp, b) not in seen:
                seen.add((imp, b))
                out.append((imp, b, floor[a], floor[b]))
    return out


# --- the package ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Package:
    """The package's modules, import statements and import graphs (`graph`: every import,
    `run_time`: those that run); a short repr, as pytest prints it."""

    modules: dict
    imports: list
    graph: dict
    run_time: dict

    def __repr__(self) -> str:
        return f"<{PACKAGE}: {len(self.modules)} modules, {len(self.imports)} imports>"


@pytest.fixture(scope="module")
def package() -> Package:
    modules = find_modules()
    imports = direct_imports(modules)
    return Package(modules, imports, import_graph(modules, imports), import_graph(modules, imports, run_time=True))


def _edge(modules: dict, imp: Import, tgt: Optional[str] = None) -> str:
    return f"{imp.where(modules)} -> {tgt or imp.module}" + (f" (name {imp.name})" if imp.name else "")


def test_no_import_cycle(package):
    """Among the imports that run: an import under `if TYPE_CHECKING:` only names a type for an
    annotation (printer.py annotates with Graph, whose __str__ prints through printer.py)."""
    modules, graph = package.modules, package.run_time
    found = tangles(graph)
    lines = []
    for comp in found:
        cyc = _a_cycle(graph, min(comp), comp)
        lines.append("cycle: " + " -> ".join(cyc))
        lines += [f"    {_edge(modules, graph[a][b], b)}" for a, b in zip(cyc, cyc[1:])]
        if len(comp) > len(cyc) - 1:
            lines.append(f"    (and in the same tangle: {', '.join(sorted(comp - set(cyc)))})")
    assert not found, "import cycles among the package's modules:\n" + "\n".join(lines)


def test_no_module_imports_another_ones_private_name(package):
    modules, imports = package.modules, package.imports
    found = private_names(modules, imports)
    assert not found, "private names imported across modules:\n" + "\n".join(
        f"    {imp.where(modules)}: {imp.module}.{name}" for imp, name in found)


def test_the_compiler_never_imports_the_application_wing(package):
    modules, imports = package.modules, package.imports
    bad = []
    for imp in imports:
        src, dst = unit_of(imp.importer), unit_of(imp.module)
        if dst == "app" and src != "app" or \
                dst == "reports" and src not in ("app", "reports") and (imp.importer, imp.module) not in REPORT_EDGES:
            bad.append(_edge(modules, imp))
    assert not bad, "imports of the application wing from below it:\n" + "\n".join(f"    {b}" for b in bad)


def test_the_named_report_edges_exist_and_lead_nowhere_below(package):
    """Each allowed edge into reports/ is real, and the module it reaches imports nothing of
    the package outside reports/ (so the edge adds no path back into the compiler)."""
    graph = package.graph
    for (src, dst), why in REPORT_EDGES.items():
        assert dst in graph[src], f"{src} -> {dst} ({why}) is named but no longer imported: drop it"
        outside = {t for t in graph[dst] if unit_of(t) != "reports"}
        assert not outside, f"{dst} (reached from {src}) imports {sorted(outside)}"


def test_every_unit_has_one_floor(package):
    """LAYERS names every unit of the package once, and nothing that is gone."""
    units = {unit_of(m) for m in package.modules}
    listed = [u for floor in LAYERS for u in floor]
    assert not units - set(listed), f"units with no floor in LAYERS: {sorted(units - set(listed))}"
    assert not set(listed) - units, f"LAYERS names units that do not exist: {sorted(set(listed) - units)}"
    twice = sorted({u for u in listed if listed.count(u) > 1})
    assert not twice, f"units on two floors: {twice}"


def test_lower_floors_do_not_import_upper_ones(package):
    """Every import, those under `if TYPE_CHECKING:` too: a floor does not even name an upper
    floor's types."""
    modules, graph = package.modules, package.graph
    found = [v for v in floor_violations(graph, LAYERS) if (v[0].importer, v[0].module) not in REPORT_EDGES]
    assert not found, "imports going up the floors of LAYERS:\n" + "\n".join(
        f"    {_edge(modules, imp)}  [{unit_of(imp.importer)} on floor {a} imports {unit} on floor {b}]"
        for imp, unit, a, b in found)


# --- the checker itself, on a made-up package -------------------------------------------------
def _write(root: Path, files: dict[str, str]) -> dict:
    for name, text in files.items():
        p = root / "pkg" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return find_modules(root / "pkg")


def test_the_checker_sees_cycles_in_functions_and_through_packages(tmp_path):
    modules = _write(tmp_path, {
        "__init__.py": "",
        "a.py": "def f():\n    from .b import g\n",
        "b.py": "from .sub import x\ng = 1\n",
        "sub/__init__.py": "from . import leaf\nx = 1\n",
        "sub/leaf.py": "from .. import a\n",
        "fam/__init__.py": "from . import one\ndef register(): pass\n",
        "fam/one.py": "from . import register\n",
        "c.py": "from .sub.leaf import y\n",
    })
    graph = import_graph(modules, direct_imports(modules))
    assert graph["pkg.a"].keys() == {"pkg.b"}
    assert graph["pkg.b"].keys() == {"pkg.sub"}
    assert graph["pkg.c"].keys() == {"pkg.sub", "pkg.sub.leaf"}  # the package loads with its module
    assert graph["pkg.fam.one"].keys() == {"pkg.fam"}  # a name from its own package's __init__
    found = sorted(cycles(graph), key=len)
    assert [set(c) for c in found] == [{"pkg.fam", "pkg.fam.one"}, {"pkg.a", "pkg.b", "pkg.sub", "pkg.sub.leaf"}]
    assert all(c[0] == c[-1] for c in found)


def test_the_checker_sees_private_names_and_floors(tmp_path):
    modules = _write(tmp_path, {
        "__init__.py": "",
        "low.py": "from .high import _secret, __version__\n",
        "high.py": "from . import low\nlow._hidden()\n_secret = 1\n",
        "side.py": "from . import high\n",
    })
    imports = direct_imports(modules)
    assert sorted(n for _, n in private_names(modules, imports)) == ["_hidden", "_secret"]
    [(imp, _, a, b)] = floor_violations(import_graph(modules, imports), [("low",), ("high", "side"), ("pkg",)])
    assert (imp.importer, imp.module, a, b) == ("pkg.low", "pkg.high", 0, 1)


def test_the_checker_keeps_type_only_imports_out_of_cycles_but_not_out_of_floors(tmp_path):
    modules = _write(tmp_path, {
        "__init__.py": "",
        "low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .high import Big\n",
        "high.py": "from .low import small\n",
    })
    imports = direct_imports(modules)
    assert cycles(import_graph(modules, imports)) == [["pkg.high", "pkg.low", "pkg.high"]]
    assert cycles(import_graph(modules, imports, run_time=True)) == []
    [(imp, _, _, _)] = floor_violations(import_graph(modules, imports), [("low",), ("high",), ("pkg",)])
    assert imp.typing_only and imp.module == "pkg.high"
