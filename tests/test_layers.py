"""Imports point down only (an AST scan of every module, imports inside functions included).

- Between packages: flows -> tasks -> trainers -> storage, and Prefect and Ray only where they belong.
- Into trainers: code outside ``trainers/`` uses its public modules, never ``trainers._internal``.
- Inside trainers: ``trainers/_internal`` (and ``storage``) never import a framework module
  (``trainers.torch``, ``trainers.xgboost``, ...), ``tasks`` or ``flows``; those build on them.
- Inside ``trainers/_internal``: its parts import only the parts below them (``PARTS``, lowest
  first; the modules at its top level are the ground every part stands on).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("trainers", "storage", "tasks", "flows")

FORBIDDEN = {
    "storage": {"trainers", "tasks", "flows", "prefect", "ray"},
    "trainers": {"tasks", "flows", "prefect"},
    "tasks": {"flows"},
    "flows": {"ray"},
}

INTERNAL = "trainers._internal"
#: Modules that build on ``trainers/_internal`` and ``storage``, so neither may import them. The
#: package itself (``import trainers``, ``from trainers import x``) is among them: its face
#: imports every public module, ``DataParallelTrainer`` included.
UPPER = (
    "trainers.data_parallel_trainer",
    "trainers.cluster",
    "trainers.doctor",
    "trainers.torch",
    "trainers.xgboost",
    "trainers.lightgbm",
    "trainers.lightning",
    "trainers.huggingface",
    "trainers.tensorflow",
    "trainers.jax",
    "trainers.tune",
    "tasks",
    "flows",
)


#: The parts of ``trainers/_internal`` (its sub-packages), lowest first: a part imports only parts
#: before it in this list, and the modules at the top of ``trainers/_internal``.
PARTS = ("events", "health", "session", "workers", "run")


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    """``trainers/_internal/workers/run_workers.py`` -> ``trainers._internal.workers.run_workers`` (a package's ``__init__`` is the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: pathlib.Path, root: pathlib.Path) -> list[tuple[int, list[str]]]:
    """Every import statement of ``path`` as (line, the modules it may import): top level, inside
    functions and under ``TYPE_CHECKING`` alike. ``from a import b`` may import ``a`` and ``a.b``
    (b may be a submodule); relative imports are resolved against the file's package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, [alias.name]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, [module] + [f"{module}.{a.name}" for a in node.names if a.name != "*"]))
    return found


def _within(module: str, prefixes: tuple[str, ...]) -> str | None:
    return next((p for p in prefixes if module == p or module.startswith(p + ".")), None)


def _upper(module: str) -> str | None:
    """The module above ``trainers/_internal`` and ``storage`` that ``module`` is, or lives in."""
    return "trainers (the package's face)" if module == "trainers" else _within(module, UPPER)


def layer_violations(root: pathlib.Path) -> list[str]:
    """``file:line imports module (the rule it breaks)`` for every import that points the wrong way."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            where = path.relative_to(root).as_posix()
            inside_trainers = where.startswith("trainers/")
            low = next((layer for layer in ("trainers/_internal/", "storage/") if where.startswith(layer)), None)
            for line, modules in imports(path, root):
                if not inside_trainers and (module := next((m for m in modules if _within(m, (INTERNAL,))), None)):
                    found.append(
                        f"{where}:{line} imports {module} (outside trainers/: use a public module of trainers)"
                    )
                elif low and (module := next((m for m in modules if _upper(m)), None)):
                    found.append(f"{where}:{line} imports {module} ({low} is below {_upper(module)})")
    return sorted(found)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_lower_layers(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no modules"
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            {m.split(".")[0] for _, ms in imports(path, ROOT) for m in ms} & FORBIDDEN[package]
        )
        for path in files
    }
    offenders = {path: bad for path, bad in offenders.items() if bad}
    assert not offenders, f"{package}/ must not import {sorted(FORBIDDEN[package])}: {offenders}"


def test_internals_are_reached_through_public_modules_and_never_import_upward():
    violations = layer_violations(ROOT)
    assert not violations, "imports pointing the wrong way:\n" + "\n".join(violations)


def _part(module: str) -> str | None:
    """The part of ``trainers/_internal`` that ``module`` lives in (None: its top level, or outside)."""
    rest = module.removeprefix(INTERNAL + ".")
    part = rest.split(".")[0]
    return part if rest != module and part in PARTS else None


def part_order_violations(root: pathlib.Path) -> list[str]:
    """``file:line imports module (part a is below part b)`` for every import inside
    ``trainers/_internal`` that points to a part above the importer's, and every import of a part
    from the ground (the modules at its top level)."""
    found = []
    for path in sorted((root / "trainers" / "_internal").rglob("*.py")):
        here = _part(module_name(path, root))
        rank = PARTS.index(here) if here else -1
        for line, modules in imports(path, root):
            for module in modules:
                there = _part(module)
                if there is not None and PARTS.index(there) > rank:
                    where = path.relative_to(root).as_posix()
                    found.append(f"{where}:{line} imports {module} ({here or 'the ground'} is below {there})")
                    break
    return found


def test_the_parts_of_internal_import_only_the_parts_below_them():
    violations = part_order_violations(ROOT)
    assert not violations, "imports against the order of the parts (tests/test_layers.py PARTS):\n" + "\n".join(
        violations
    )


def test_part_order_scan_catches_an_import_up(tmp_path):
    files = {
        "trainers/_internal/ray_private.py": "from trainers._internal.workers.warm_workers import kill_actors\n",
        "trainers/_internal/events/messages.py": "from trainers._internal.ray_private import x\n",
        "trainers/_internal/health/goodput.py": "from trainers._internal.events import messages\n",
        "trainers/_internal/session/data.py": "def f():\n    from trainers._internal.run.controller import Controller\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert part_order_violations(tmp_path) == [
        "trainers/_internal/ray_private.py:1 imports trainers._internal.workers.warm_workers (the ground is below workers)",
        "trainers/_internal/session/data.py:2 imports trainers._internal.run.controller (session is below run)",
    ]


#: The frameworks a backend brings: the core (``trainers/_internal``) asks its backend instead.
FRAMEWORKS = ("torch", "tensorflow", "keras", "jax", "xgboost", "lightgbm", "deepspeed", "lightning")


def test_the_core_imports_no_framework():
    """What the framework must do at a stop, a reset, the pre-flight probe or a memory failure is
    the backend's ``FrameworkProcess`` (torch's in ``trainers/torch/process.py``)."""
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / "trainers" / "_internal").rglob("*.py"))
        for line, modules in imports(path, ROOT)
        for module in modules[:1]
        if module.split(".")[0] in FRAMEWORKS
    ]
    assert not found, "trainers/_internal imports a framework:\n" + "\n".join(found)


def test_each_part_is_a_package_that_says_what_it_holds():
    internal = ROOT / "trainers" / "_internal"
    assert sorted(p.name for p in internal.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(PARTS)
    for part in PARTS:
        doc = ast.get_docstring(ast.parse((internal / part / "__init__.py").read_text()))
        assert doc and len(doc.split()) >= 20, (
            f"trainers/_internal/{part}/__init__.py needs a paragraph saying what it holds"
        )
    top = sorted(p.name for p in internal.glob("*.py"))
    assert len(top) <= 12, f"trainers/_internal has {len(top)} modules at its top level: {top}"


def test_scan_catches_a_forbidden_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom prefect import flow\nimport ray.data\n")
    assert {m.split(".")[0] for _, ms in imports(module, tmp_path) for m in ms} == {"os", "prefect", "ray"}


def test_scan_catches_planted_wrong_way_imports(tmp_path):
    files = {
        "trainers/__init__.py": "",
        "trainers/cluster.py": "from trainers._internal.workers.resources import cluster_nodes\n",  # allowed: inside trainers
        "trainers/_internal/__init__.py": "",
        "trainers/_internal/fine.py": "from trainers.config import ScalingConfig\nfrom storage import Checkpoint\n",
        "trainers/_internal/face.py": "import trainers\n",
        "trainers/_internal/late.py": "def f():\n    from trainers.torch.devices import get_device\n",
        "trainers/_internal/relative.py": "from ..xgboost import config\n",
        "storage/__init__.py": "",
        "storage/up.py": "import tasks.train\n",
        "tasks/__init__.py": "",
        "tasks/train.py": "from trainers import _internal\nfrom trainers.cluster import ensure_ray\n",
        "flows/__init__.py": "",
        "flows/pipeline.py": "def g():\n    import trainers._internal.session.worker_session as session\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert layer_violations(tmp_path) == [
        "flows/pipeline.py:2 imports trainers._internal.session.worker_session (outside trainers/: use a public module of trainers)",
        "storage/up.py:1 imports tasks.train (storage/ is below tasks)",
        "tasks/train.py:1 imports trainers._internal (outside trainers/: use a public module of trainers)",
        "trainers/_internal/face.py:1 imports trainers (trainers/_internal/ is below trainers (the package's face))",
        "trainers/_internal/late.py:2 imports trainers.torch.devices (trainers/_internal/ is below trainers.torch)",
        "trainers/_internal/relative.py:1 imports trainers.xgboost (trainers/_internal/ is below trainers.xgboost)",
    ]


def import_circles(root: pathlib.Path) -> list[list[str]]:
    """Every group of our modules that import each other, directly or round a longer loop
    (imports inside functions count: a lazy import only hides a circle)."""
    files = {module_name(p, root): p for package in PACKAGES for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        edges = set()
        for _, candidates in imports(path, root):
            known = [c for c in candidates if c in files]
            submodules = [c for c in known if c != candidates[0]]  # "from a import b" with b a module
            edges.update(c for c in (submodules or known[:1]) if c != module)
        graph[module] = edges
    # Tarjan's strongly connected components: a component of two or more modules is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(circles)


def test_no_import_circles():
    circles = import_circles(ROOT)
    assert not circles, "modules that import each other (move the shared part down a floor):\n" + "\n".join(
        map(str, circles)
    )


def test_circle_scan_finds_a_planted_circle(tmp_path):
    files = {
        "storage/__init__.py": "from storage.a import x\n",
        "storage/a.py": "from storage.b import y\n",
        "storage/b.py": "def f():\n    from storage.c import z\n",
        "storage/c.py": "import storage.a\n",
        "storage/d.py": "from storage import a\n",  # a submodule named in "from package import": one arrow, no circle
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert import_circles(tmp_path) == [["storage.a", "storage.b", "storage.c"]]
