"""Issue 21: jaxrescore.models imports point downward only. No module of the package imports
another that (directly or not) imports it back — function-level imports included — and none
imports a layer above it (rescore, index, baselines, demo, cli, quick)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "jaxrescore" / "models"
ABOVE = ("jaxrescore.rescore", "jaxrescore.index", "jaxrescore.baselines", "jaxrescore.demo",
         "jaxrescore.cli", "jaxrescore.quick")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict:
    """Every models module -> the jaxrescore modules it imports anywhere in its body."""
    mods = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jaxrescore"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in mods else node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("jaxrescore"))
        deps.discard(name)
        graph[name] = deps
    return graph


def test_models_import_nothing_above():
    upward = {m: sorted(d for d in deps if d.startswith(ABOVE)) for m, deps in imports().items()}
    assert not {m: d for m, d in upward.items() if d}


def test_models_modules_form_no_circle():
    graph = imports()
    # Package __init__ files re-export their modules; an edge into one counts as its modules.
    inits = {m for m in graph if (PACKAGE.parent.parent / Path(*m.split("."))).is_dir()}

    def targets(m):
        return {d for d in graph[m] if d in graph and d not in inits}

    def reaches(start, goal):
        seen, todo = set(), [start]
        while todo:
            m = todo.pop()
            for d in targets(m):
                if d == goal:
                    return True
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        return False

    circles = sorted(m for m in graph if m not in inits and reaches(m, m))
    assert not circles, circles
