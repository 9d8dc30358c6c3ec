"""Admission is decided in one module (fsd.admission): every caller named, no other decider.

Scans the source with ast, so a new path that decides on its own (raises a refusal
of a request, checks lengths, tokenizes a prompt) fails here, and one that starts
calling the deciding functions must be named below (and in docs/daemon.md).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DECIDERS = ("admit", "check_open", "check_room", "check_request", "refuse_late")

# who calls each deciding function of fsd.admission, and why there
CALLERS = {
    # a request with a prompt: tokenized and checked once, where it enters
    "admit": {
        "fsd/engine/core.py",  # Engine.enqueue: one engine (the daemon's, fsd.LLM)
        "fsd/cluster/face.py",  # ReplicaSetFace.admit: replicas (their engines trust it)
    },
    # the drain: a submit, an inject, each scenario arrival, a checked scenario
    "check_open": {"fsd/server/loop/job_admission.py", "fsd/server/loop/injector.py"},
    # the job caps, per client and daemon-wide
    "check_room": {"fsd/server/loop/clients.py"},
    # the length rule on requests that are lengths only (no prompt yet, or ever)
    "check_request": {
        "fsd/admission.py",  # admit
        "fsd/server/loop/control.py",  # a burst, before its prompts are made
        "fsd/server/loop/injector.py",  # a scenario, as a whole before it runs
        "fsd/sim/engine.py",  # the simulator's workload
    },
    # a job just queued, predicted to wait or run too long (needs the scheduler's
    # queue): the engine's and the simulator's arrivals
    "refuse_late": {"fsd/engine/core.py", "fsd/sim/loop.py"},
}

REFUSALS = ("PromptTooLongError", "OverloadedError", "DrainingError")
# refusals of something other than a request: a busy preview, a busy scenario checker
OTHER_REFUSALS = {"fsd/server/loop/preview.py", "fsd/server/loop/injector.py"}
# where a prompt's text becomes token ids: fsd.admission, and the HTTP API's chat
# (its template writes the special tokens: it sends ids, which admit only checks)
TOKENIZERS = {"fsd/admission.py", "fsd/server/http/api.py"}


def _sources() -> dict[str, ast.Module]:
    paths = [*(ROOT / "fsd").rglob("*.py"), *(ROOT / "console").rglob("*.py")]
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(), str(p)) for p in paths}


def _called(tree: ast.Module) -> set[str]:
    """The names this module imports from fsd.admission and calls."""
    imported = {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "fsd.admission"
        for a in node.names
    }
    called = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    return imported & called


def test_every_caller_of_the_deciding_functions_is_named() -> None:
    found: dict[str, set[str]] = {name: set() for name in DECIDERS}
    for path, tree in _sources().items():
        names = set(DECIDERS) if path == "fsd/admission.py" else _called(tree)
        for name in names & set(DECIDERS):
            if path != "fsd/admission.py" or name == "check_request":
                found[name].add(path)
    assert found == CALLERS


def _raised(tree: ast.Module) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            func = node.exc.func
            if isinstance(func, ast.Name):
                out.add(func.id)
    return out


def test_no_other_module_refuses_a_request() -> None:
    raisers = {path for path, tree in _sources().items() if _raised(tree) & set(REFUSALS)}
    assert raisers - OTHER_REFUSALS == {"fsd/admission.py"}


def test_no_other_module_tokenizes_a_prompt() -> None:
    def encodes(tree: ast.Module) -> bool:
        return any(
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "encode"
            and "tokenizer" in ast.unparse(node.func.value)
            for node in ast.walk(tree)
        )

    assert {path for path, tree in _sources().items() if encodes(tree)} == TOKENIZERS


def test_no_module_checks_a_request_in_its_own_words() -> None:
    """The refusals' words live in fsd.admission alone (clients and tests match them)."""
    words = (
        "max_client_jobs is",
        "max_jobs is",
        "accepts no new jobs",
        "at least one must be left",
    )
    holders = {
        path
        for path, tree in _sources().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and any(w in node.value for w in words)
    }
    assert holders == {"fsd/admission.py"}
