"""The layout's rules (DESIGN §2), checked on the source: import directions, sizes.

Each package's `__init__` docstring says what it owns and what it may import; these
tests hold the imports to it, statically (every `import` statement, including those
inside functions and TYPE_CHECKING blocks), so a stray import fails here and not in
review.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _sources(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


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
    "fsd/sched": ("torch", "fsd.engine", "fsd.server", "fsd.console", "fsd.sim", "fsd.models"),
    "fsd/kv": (
        "torch", "fsd.sched", "fsd.engine", "fsd.server", "fsd.console", "fsd.sim", "fsd.models",
    ),
    "fsd/sim": ("torch", "fsd.engine", "fsd.server", "fsd.console"),
    # the what-if twin runs in its own process: the simulator's imports, plus the wire
    "fsd/twin": ("torch", "fsd.engine", "fsd.server", "fsd.console", "fsd.models"),
    "fsd/workload": ("torch", "fsd.sched", "fsd.kv", "fsd.engine", "fsd.server", "fsd.console"),
    "fsd/engine": ("fsd.server", "fsd.console", "fsd.sim"),
    # the SDK: the wire and the errors only (a client process loads no engine code)
    "fsd/client": (
        "torch", "fsd.config", "fsd.engine", "fsd.sched", "fsd.kv", "fsd.server", "fsd.sim",
        "fsd.models", "fsd.console",
    ),
    "fsd/models": ("fsd.engine", "fsd.sched", "fsd.kv", "fsd.server", "fsd.console", "fsd.sim"),
}  # fmt: skip

# the console talks to the daemon over the wire only
CONSOLE_MAY_IMPORT = (
    "fsd.console", "fsd.protocol", "fsd.client", "fsd.workload", "fsd.metrics", "fsd.config",
    "fsd.errors", "fsd.cli_options", "fsd.cli_errors", "fsd.credentials", "fsd.manual",
    "fsd.__version__", "fsd.progress", "fsd.local_daemon",
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
    bad = _bad_imports(package, lambda name: _under(name, FORBIDDEN[package]))
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


def test_no_module_is_over_400_lines() -> None:
    long = [
        f"{p.relative_to(ROOT)}: {n} lines"
        for p in _sources("fsd", "console", "kernels")
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, "\n".join(long)


def _is_triton_kernel(path: Path, node: ast.AST) -> bool:
    """A `@triton.jit` body (kernels/ wrap them lazily: they are named `*_kernel`)."""
    return path.parent.name == "kernels" and getattr(node, "name", "").endswith("_kernel")


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the signature and docstring to the end
    (a typer command's long signature does not count)."""
    body = node.body
    if (
        len(body) > 1
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    return (node.end_lineno or body[-1].end_lineno or 0) - body[0].lineno + 1


def test_no_function_is_over_60_lines() -> None:
    long = []
    for path in _sources("fsd", "console", "kernels"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not _is_triton_kernel(
                path, node
            ):
                n = _body_lines(node)
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert not long, "\n".join(long)
