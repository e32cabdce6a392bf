"""The package layout the docs promise: who may import what, no import circles, imports inside
functions only where they keep something light, `import plait` without the runtime, and a
`kernels/` folder that does not shadow the PyPI package transformers imports."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
GRAMMAR_IMPORT = re.compile(r"^\s*(?:from|import)\s+plait\.backend\.grammar(\.\S+)?", re.M)
PACKAGES = {
    "frontend": "plait",
    "backend": "plait.backend",
    "kernels/plait_kernels": "plait.kernels",
}
# Imports inside functions, each one there to keep a light path light (never to break a circle).
LAZY_IMPORTS = {
    ("plait.cli", "plait.backend.parallel.launch"),  # `plait serve --node-rank`: torch
    ("plait.cli", "plait.backend.server.launch"),  # `plait serve`: the runtime
    ("plait.backend.router.launcher", "torch"),  # `--dp N` counts GPUs only off the CPU
    ("plait.backend.router.gateway", "sglang_router.launch_router"),  # optional: the gateway
    ("plait.backend.text.tokenizer", "transformers"),  # AutoTokenizer's registry: 0.2 s
    # the grammar backends, imported when the first constrained request builds them (0.5 s)
    ("plait.backend.grammar.on_demand", "plait.backend.grammar.backend"),
    ("plait.backend.grammar.layout", "xgrammar"),
    ("plait.kernels.bitmask", "xgrammar.kernels.apply_token_bitmask_inplace_cpu"),  # no compiler
}
HEAVY = ("torch", "transformers", "xgrammar")


def production_modules() -> dict[str, Path]:
    """Every module of the three packages by its dotted name."""
    modules = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def module_imports(tree: ast.Module, known: set[str]) -> set[str]:
    """The plait modules a module imports when it is imported (not in functions or under
    TYPE_CHECKING); `from package import name` counts the submodule `name` where one exists."""
    found: set[str] = set()
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and not _is_type_checking(node):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found & known


def function_imports(tree: ast.Module) -> set[str]:
    """The modules imported inside the functions of a module."""
    found = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    found.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module:
                    found.add(node.module)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph`, or None (depth-first search with colours)."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circles() -> None:
    modules = production_modules()
    trees = {name: ast.parse(path.read_text()) for name, path in modules.items()}
    graph = {name: module_imports(tree, set(modules)) for name, tree in trees.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imports_inside_functions_are_only_the_lazy_ones() -> None:
    found = set()
    for name, path in production_modules().items():
        found.update((name, imported) for imported in function_imports(ast.parse(path.read_text())))
    assert found == LAZY_IMPORTS


def test_every_package_folder_says_what_it_holds() -> None:
    for folder in PACKAGES:
        for init in (ROOT / folder).rglob("__init__.py"):
            doc = ast.get_docstring(ast.parse(init.read_text()))
            assert doc and len(doc) > 40, f"{init.relative_to(ROOT)} has no docstring"


def test_only_the_scheduler_imports_the_grammar_package_and_only_its_public_names() -> None:
    importers = {}
    for path in production_modules().values():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("backend/grammar/"):
            continue
        for match in GRAMMAR_IMPORT.finditer(path.read_text()):
            importers[rel] = match.group(1)
    scheduler = {
        "backend/scheduler/scheduler.py",
        "backend/scheduler/step_results.py",
        "backend/scheduler/loop.py",
        "backend/speculative/step.py",
    }
    assert set(importers) == scheduler
    assert set(importers.values()) == {None}  # `from plait.backend.grammar import ...`


def loaded_after(code: str, modules: tuple[str, ...] = HEAVY, *, timeout: float = 120) -> list[str]:
    """Which of `modules` (default: the heavy packages) are loaded once `code` ran in a
    fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=timeout
    )
    return out.stdout.split()


def test_the_dsl_clients_and_router_do_not_load_the_runtime() -> None:
    code = "\n".join(
        [
            "import plait, plait.cli",
            "plait.OpenAIBackend('http://127.0.0.1:9', 'model'), plait.HttpBackend",
            "plait.system('s') + plait.user('u') + plait.assistant(plait.gen('a', regex='[ab]'))",
            "plait.cli.build_parser()",
            "import plait.backend.router.launcher, plait.backend.router.server",
        ]
    )
    assert loaded_after(code) == []
    # the engine's code, less the grammar backends (built at the first constrained request)
    assert loaded_after("from plait.backend import Engine") == ["torch", "transformers"]


def test_transformers_imports_its_own_kernels_package_from_the_repository_root() -> None:
    """`kernels/` is a plain folder: the PyPI `kernels` package (a regular one) wins over it
    when the repository root is on sys.path, as under `python -m benchmarks...`."""
    code = (
        "import sys; sys.path.insert(0, '.')\n"
        "import kernels, plait.kernels\n"
        "from transformers.integrations import hub_kernels\n"
        "print(kernels.__file__); print(plait.kernels.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    theirs, ours = (Path(line) for line in out.stdout.split())
    assert ROOT / "kernels" not in theirs.parents
    assert ours == ROOT / "kernels" / "plait_kernels" / "__init__.py"


def test_the_engine_is_importable_from_the_backend_package() -> None:
    from plait.backend import Engine
    from plait.backend.engine.engine import Engine as Defined

    assert Engine is Defined


def test_loading_a_model_loads_no_compiler_stack() -> None:
    """torch._dynamo and torch.fx's symbolic shapes (about 1.5 s of start-up together) stay
    out of an engine's import, its model load (meta skeleton, materialized without torch's
    reference ops) and its first requests, prefix-cached extend attention included."""
    code = (
        "from plait.backend import Engine\n"
        "e = Engine('plait-tiny', num_threads=1, kv_tokens=1024)\n"
        "p = {'max_new_tokens': 2}\n"
        "e.generate(['hello world ' * 8], [p]); e.generate(['hello world ' * 8 + 'x'], [p])"
    )
    compiler = ("torch._dynamo", "torch.fx.experimental.symbolic_shapes")
    assert loaded_after(code, compiler, timeout=300) == []
