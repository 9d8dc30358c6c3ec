"""The runtime import graph of fsd/, console/ and kernels/, read from the source.

A module is named as installed: `fsd/sched/mlfq.py` is `fsd.sched.mlfq`, a package's
`__init__.py` is the package (`fsd.sched`), console/ is `fsd.console` and kernels/ is
`fsd.kernels`. An edge A -> B means A runs `import B` or `from B import ...`:

- runtime imports only: a statement under `if TYPE_CHECKING:` is skipped; one inside a
  function counts (it runs when the function does);
- `from P import x` is an edge to the submodule `P.x` when `x` is one, else to `P`
  itself (the name is read from `P`'s `__init__`);
- a package's lazy exports (`_EXPORTS = {"Name": "module", ...}` beside
  `lazy_exports`) are imports too: the package loads each module on first use;
- importing `a.b.c` also runs `a` and `a.b`'s `__init__`; that implicit edge is not
  drawn (every module of a package would otherwise form a circle with its
  `__init__`), only the modules named.

Run it (`python tests/import_graph.py`) for the circles and the upward imports.
`loads` asks a fresh interpreter instead: what importing some modules really loads.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = {"fsd": "fsd", "console": "fsd.console", "kernels": "fsd.kernels"}


def module_files() -> dict[str, Path]:
    """Module name -> file, for every .py file of the three trees."""
    files: dict[str, Path] = {}
    for tree, prefix in TREES.items():
        for path in sorted((ROOT / tree).rglob("*.py")):
            parts = list(path.relative_to(ROOT / tree).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join([prefix, *parts])] = path
    return files


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under `node` except the bodies of `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other
                yield from _runtime_nodes(other)
            continue
        yield child
        yield from _runtime_nodes(child)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _lazy_exports(tree: ast.Module) -> set[str]:
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in targets):
            value = node.value  # type: ignore[union-attr]
            if isinstance(value, ast.Dict):
                return {v.value for v in value.values if isinstance(v, ast.Constant)}
    return set()


def imports_of(module: str, path: Path, known: set[str], typed: bool = False) -> set[str]:
    """The modules (of `known`, or outside names as written) that `module` imports
    (`typed`: those under `if TYPE_CHECKING:` too)."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    names: set[str] = set(_lazy_exports(tree))
    for node in ast.walk(tree) if typed else _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, is_package, node)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                names.add(sub if sub in known else source)
    names.discard(module)
    return names


def graph(typed: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of the three trees it imports at run time (`typed`: for
    type hints too)."""
    files = module_files()
    known = set(files)
    return {m: imports_of(m, p, known, typed) & known for m, p in files.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the module count
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found, key=lambda c: (-len(c), c))


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Imports of an ancestor package's `__init__`: `fsd.engine.core` importing `fsd`
    or `fsd.engine` itself (not a submodule of them)."""
    return [
        f"{m} imports {target}"
        for m, targets in sorted(edges.items())
        for target in sorted(targets)
        if m.startswith(target + ".")
    ]


def loads(name: str, *modules: str) -> bool:
    """Whether a fresh interpreter that imports `modules` holds the module `name` after
    (e.g. torch: a process that needs only them does not pay for it)."""
    code = f"import sys, {', '.join(modules)}; print({name!r} in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {"True": True, "False": False}[out.stdout.strip()]


if __name__ == "__main__":
    g = graph()
    cs = circles(g)
    print(f"{len(g)} modules, {sum(map(len, g.values()))} edges, {len(cs)} circles")
    for c in cs:
        print(f"  {len(c)}: {' '.join(c)}")
    for line in upward(g):
        print("  upward:", line)
