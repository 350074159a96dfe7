"""The layout of DESIGN.md §2, checked: imports point downward, no import circle (function-level
imports included), one concept per file (no file over ~600 lines)."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "jaxrescore"
MAX_LINES = 600

# Layers, bottom to top; a module imports only from its own layer's package or lower layers.
LAYERS = [
    {"_checks", "_version", "quantize", "sequences", "typing", "files", "compilation_cache"},
    {"models"},
    {"constraints"},  # automata over a model's tokens, and models restricted by them
    {"index", "rescore", "baselines", "data"},
    {"quick", "demo"},
    {"cli"},
    {"__init__", "__main__"},
]


def _package(module: str) -> str:
    """The top-level part of a ``jaxrescore.x.y`` module name."""
    return module.split(".")[1] if module.count(".") else "__init__"


def _layer(module: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if _package(module) in names)


def _modules() -> dict:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: pathlib.Path, name: str, known: set) -> set:
    """Every jaxrescore module ``path`` imports, at any level of the file."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("jaxrescore")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if not base.startswith("jaxrescore"):
                continue
            for a in node.names:  # `from jaxrescore.x import y` may name a submodule y
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return found - {name}


def _graph() -> dict:
    mods = _modules()
    return {name: _imports(path, name, set(mods)) for name, path in mods.items()}


def test_no_file_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_imports_point_downward():
    graph = _graph()
    up = [(a, b) for a, deps in graph.items() for b in deps
          if b in graph and _layer(b) > _layer(a)]
    sideways = [(a, b) for a, deps in graph.items() for b in deps
                if b in graph and _layer(b) == _layer(a) == 2 and _package(a) != _package(b)]
    assert not up, f"upward imports: {up}"
    assert not sideways, f"imports between index/, rescore/, baselines/, data/: {sideways}"


def test_no_import_circle():
    graph = _graph()
    state: dict = {}

    def visit(node, path):
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if dep not in graph:
                continue
            if state.get(dep) == "open":
                pytest.fail(f"import circle: {' -> '.join(path[path.index(dep):] + [dep])}")
            if dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_the_shell_is_thin():
    """RescoredIndex validates, locks, stores and converts: under 250 lines, and no loop (the
    searches live in rescore/run.py and rescore/search.py)."""
    shell = ROOT / "rescore" / "rescored_index.py"
    tree = ast.parse(shell.read_text())
    assert len(shell.read_text().splitlines()) < 250
    loops = [n.lineno for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While, ast.AsyncFor))]
    assert not loops, f"loops in the shell at lines {loops}"
