"""The layout's rules (DESIGN §2), checked on the source: import directions, sizes.

Each package's `__init__` docstring says what it owns and what it may import; these
tests hold the imports to it, statically (every `import` statement, including those
inside functions and TYPE_CHECKING blocks), so a stray import fails here and not in
review.

Two rules hold the runtime import graph of fsd/, console/ and kernels/
(tests/import_graph.py builds it: runtime imports only, so a statement under
`if TYPE_CHECKING:` does not count, a function-local import does, and so does a
package's lazy `_EXPORTS` map):

- no import circle: no strongly connected component of more than one module. Two
  modules that need each other are one module, or a third holds what both need.
  Counting type-only imports too, no knot but the one known (`TYPED_KNOTS`).
- nothing imports upward: a module never imports an ancestor package's `__init__`,
  i.e. `fsd.engine.core` imports neither `fsd` nor `fsd.engine` itself (`from fsd
  import __version__`, `from fsd.engine import Engine`), only modules: `from
  fsd.engine import history` names the module `fsd.engine.history`, which is not
  upward. (Hence `fsd.version`: the CLI, the console and the daemon read the version
  there, not from `fsd/__init__`.)
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.import_graph import circles, graph, imports_of, upward

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _sources(*dirs: str) -> list[Path]:
    """The .py files of each directory, or the file itself when one is named."""
    paths = [ROOT / d for d in dirs]
    return sorted(q for p in paths for q in ([p] if p.is_file() else p.rglob("*.py")))


def _imports(path: Path) -> set[str]:
    """Every module a file imports (absolute names; `fsd.console` is console/)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == "fsd":  # from fsd import x
            names.update(f"fsd.{a.name}" for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


FORBIDDEN = {
    # the torch-free core shared by the engine and the simulator
    "fsd/sched": (
        "torch", "fsd.engine", "fsd.server", "fsd.console", "fsd.sim", "fsd.models", "fsd.router",
    ),
    "fsd/study": (
        "torch", "fsd.engine", "fsd.server", "fsd.console", "fsd.sim", "fsd.models", "fsd.router",
    ),
    "fsd/kv": (
        "torch", "fsd.sched", "fsd.engine", "fsd.server", "fsd.console", "fsd.sim", "fsd.models",
        "fsd.router",
    ),
    "fsd/sim": ("torch", "fsd.engine", "fsd.server", "fsd.console"),
    # the router runs in the daemon and in the simulator alike
    "fsd/router": ("torch", "fsd.engine", "fsd.server", "fsd.console", "fsd.sim"),
    # the what-if twin runs in its own process: the simulator's imports, plus the wire
    "fsd/twin": ("torch", "fsd.engine", "fsd.server", "fsd.console", "fsd.models"),
    # the engine's step history is read by the twin's process: no torch, no engine
    "fsd/engine/history.py": ("torch", "fsd.engine", "fsd.models", "fsd.layers", "fsd.kernels"),
    "fsd/workload": ("torch", "fsd.sched", "fsd.kv", "fsd.engine", "fsd.server", "fsd.console"),
    "fsd/engine": ("fsd.server", "fsd.console", "fsd.sim", "fsd.twin"),
    # iteration time, below all that reads it (of fsd: itself and fsd.errors, tested below)
    "fsd/cost": ("torch",),
    # the SDK: the wire and the errors only (a client process loads no engine code)
    "fsd/client": (
        "torch", "fsd.config", "fsd.engine", "fsd.sched", "fsd.kv", "fsd.server", "fsd.sim",
        "fsd.models", "fsd.console",
    ),
    "fsd/models": ("fsd.engine", "fsd.sched", "fsd.kv", "fsd.server", "fsd.console", "fsd.sim"),
    # replicas: engines behind one face; the server reaches them through it alone
    "fsd/cluster": ("fsd.server", "fsd.console", "fsd.sim"),
    # the daemon's network side: torch-free, the engine through its face alone
    "fsd/server": (
        "torch", "fsd.engine", "fsd.console", "fsd.kv", "fsd.sim", "fsd.models", "fsd.layers",
        "fsd.kernels", "fsd.router", "fsd.cluster", "fsd.cost",
    ),
}  # fmt: skip

# exceptions to FORBIDDEN: of the engine, the twin reads its torch-free step history
# the engine's face as a type and what it hands out (outputs, events, read-only views)
# reach the server, not the engine's face itself (the daemon builds that)
ALLOWED = {
    "fsd/twin": ("fsd.engine.history",),
    "fsd/server": (
        "fsd.engine.face_protocol", "fsd.engine.output", "fsd.engine.events", "fsd.engine.views",
    ),
}

# the rooms of fsd/server (each `__init__` says why): all that each may import of fsd.
# The modules directly in fsd/server are what the rooms share; they import no room.
_SHARED = (
    "fsd.server.audit", "fsd.server.listen", "fsd.server.log_limits", "fsd.server.loop_thread",
)  # fmt: skip
ROOM_MAY_IMPORT = {
    # the gates and everything per connection: the wire's bytes, no engine, no job
    "fsd/server/transport": (
        "fsd.server.transport", *_SHARED, "fsd.config", "fsd.credentials", "fsd.errors",
        "fsd.protocol",
    ),
    # what the daemon says of the engine's state: telemetry, /metrics, the stats log
    "fsd/server/publish": (
        "fsd.server.publish", "fsd.engine", "fsd.sched.scheduler", "fsd.metrics", "fsd.protocol",
        "fsd.config",
    ),
    # the OpenAI-compatible API: an SDK client of the daemon's own ROUTER (fsd.client)
    "fsd/server/http": (
        "fsd.server.http", "fsd.server.publish", *_SHARED, "fsd.client", "fsd.engine",
        "fsd.tokenizer", "fsd.jobs", "fsd.config", "fsd.config_checks", "fsd.errors",
    ),
    # the service loop: it builds the other rooms and drives the engine through its face
    "fsd/server/loop": (
        "fsd.server", "fsd.engine", "fsd.admission", "fsd.sched.retune", "fsd.twin.forward",
        "fsd.twin.worker", "fsd.workload", "fsd.protocol", "fsd.protocol_preview", "fsd.jobs",
        "fsd.metrics", "fsd.config", "fsd.errors", "fsd.printable", "fsd.version",
    ),
}  # fmt: skip
SERVER_ROOMS = tuple(f"fsd.server.{Path(room).name}" for room in ROOM_MAY_IMPORT)
MAX_SERVER_MODULES = 12  # directly in fsd/server, __init__ included; the rest in rooms

# the console talks to the daemon over the wire only
CONSOLE_MAY_IMPORT = (
    "fsd.console", "fsd.protocol", "fsd.client", "fsd.workload", "fsd.metrics", "fsd.config",
    "fsd.errors", "fsd.cli_options", "fsd.cli_errors", "fsd.cli_common", "fsd.credentials",
    "fsd.manual",
    "fsd.version", "fsd.progress", "fsd.local_daemon",
    "fsd.printable",  # a client's names, escaped wherever the console shows them
    # the policy names the retune dialog offers (no policy code runs in the console)
    "fsd.sched.registry", "fsd.kv.registry",
)  # fmt: skip


def _bad_imports(package: str, bad: Callable[[str], bool]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _sources(package)
        for name in sorted(_imports(path))
        if bad(name)
    ]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_nothing_its_rules_forbid(package: str) -> None:
    allowed = ALLOWED.get(package, ())
    bad = _bad_imports(
        package,
        lambda name: _under(name, FORBIDDEN[package]) and not _under(name, allowed),
    )
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("room", sorted(ROOM_MAY_IMPORT))
def test_a_server_room_imports_only_what_its_rules_allow(room: str) -> None:
    bad = _bad_imports(
        room, lambda name: name.startswith("fsd") and not _under(name, ROOM_MAY_IMPORT[room])
    )
    assert not bad, "\n".join(bad)


def test_the_server_modules_beside_the_rooms_import_no_room_and_stay_few() -> None:
    shared = sorted((ROOT / "fsd/server").glob("*.py"))
    assert len(shared) <= MAX_SERVER_MODULES, [p.name for p in shared]
    assert {p.parent.name for p in (ROOT / "fsd/server").glob("*/__init__.py")} == {
        Path(room).name for room in ROOM_MAY_IMPORT
    }, "a room of fsd/server without its rules in ROOM_MAY_IMPORT"
    bad = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in shared
        for name in sorted(_imports(path))
        if _under(name, SERVER_ROOMS)
    ]
    assert not bad, "\n".join(bad)


def test_the_console_imports_only_the_wire_the_client_and_workload_parsing() -> None:
    bad = _bad_imports(
        "console", lambda name: name.startswith("fsd") and not _under(name, CONSOLE_MAY_IMPORT)
    )
    assert not bad, "\n".join(bad)


def test_the_config_is_a_leaf_the_registries_check_policy_names() -> None:
    """fsd/config.py reads no policy: each name is checked where its policy is built."""
    bad = [n for n in _imports(ROOT / "fsd/config.py") if _under(n, ("fsd.sched", "fsd.kv"))]
    assert not bad, bad


def test_the_kernels_import_nothing_from_fsd_but_themselves() -> None:
    bad = _bad_imports(
        "kernels", lambda name: name.startswith("fsd") and not _under(name, ("fsd.kernels",))
    )
    assert not bad, "\n".join(bad)


_graph = functools.cache(graph)


def test_no_import_circle() -> None:
    """No circle of more than one module (the registry hands the Scheduler its policy's
    queue and rules, so the scheduler never imports the registry back)."""
    found = circles(_graph())
    assert not found, "\n".join(" <-> ".join(c) for c in found)


TYPED_KNOTS: list[list[str]] = []  # none: type-only imports make no knot either


def test_no_new_import_circle_when_type_hints_count() -> None:
    """Type-only imports (under `if TYPE_CHECKING:`) run no code, but a reader still
    meets the knot: there is none."""
    found = circles(graph(typed=True))
    assert found == TYPED_KNOTS, "\n".join(" <-> ".join(c) for c in found)


def test_nothing_imports_an_ancestor_package() -> None:
    bad = upward(_graph())
    assert not bad, "\n".join(bad)


def test_the_graph_counts_runtime_imports_only(tmp_path: Path) -> None:
    source = tmp_path / "core.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "from .. import Name\n"
        "if TYPE_CHECKING:\n"
        "    from fsd.typed import T\n"
        "def f():\n"
        "    import fsd.late\n"
    )
    known = {"fsd", "fsd.pkg", "fsd.pkg.sibling", "fsd.typed", "fsd.late"}
    assert imports_of("fsd.pkg.core", source, known) & known == {
        "fsd", "fsd.pkg.sibling", "fsd.late",
    }  # fmt: skip
    edges = {"a": {"b"}, "b": {"a"}, "c": {"a"}, "a.x": {"a"}}
    assert circles(edges) == [["a", "b"]]
    assert upward(edges) == ["a.x imports a"]


def test_the_cost_package_imports_nothing_of_fsd_but_itself_and_the_errors() -> None:
    bad = _bad_imports(
        "fsd/cost",
        lambda name: name.startswith("fsd") and not _under(name, ("fsd.cost", "fsd.errors")),
    )
    assert not bad, "\n".join(bad)


def test_no_module_is_over_400_lines() -> None:
    long = [
        f"{p.relative_to(ROOT)}: {n} lines"
        for p in _sources("fsd", "console", "kernels")
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, "\n".join(long)


def _function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first decorator (or the `def`) to the last: a long signature or
    docstring counts too. (A Triton kernel's many pointers and strides are packed a
    few to a line; its `@triton.jit` helpers are inlined and cost nothing.)"""
    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return (node.end_lineno or node.lineno) - start + 1


def test_no_function_is_over_60_lines() -> None:
    long = []
    for path in _sources("fsd", "console", "kernels"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = _function_lines(node)
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert not long, "\n".join(long)
