"""The house as docs/architecture.md draws it, checked over the import graph of the source (every import, at module
level or inside a function or under ``TYPE_CHECKING``: a type-level import is an arrow too): no cycles, arrows only down
the layers, no production import of the scripted test engine, no memory-method hook handed the driver, no engine
capability found by ``getattr``.

Layers, bottom up: ``engine`` (0), ``grammars`` (1), the method core and storage — every ``flowstate`` module not
named below, the memory seam ``flowstate.memory.base`` included (2), the memory methods ``flowstate.memory.*`` (3),
the adapters over the one driver — the Python API, the evaluator, the benches, ``serving`` (4), the command line
(5). A module may import its own layer and those below it.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "grammars", "flowstate", "serving")
ADAPTERS = ("flowstate.agent", "flowstate.eval", "flowstate.bench", "flowstate.bench.repo", "flowstate.demo", "serving")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    if module.startswith("engine"):
        return 0
    if module.startswith("grammars"):
        return 1
    if module == "flowstate.cli" or module.startswith("flowstate.cli."):
        return 5
    if any(module == a or module.startswith(a + ".") for a in ADAPTERS):
        return 4
    if module.startswith("flowstate.memory") and module != "flowstate.memory.base":
        return 3
    return 2


def imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports (``from a.b import c`` counts a.b.c where that is a module)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.add(child.module)
                found.update(f"{child.module}.{a.name}" for a in child.names)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in found if m in modules}


def graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    return {m: imports(p, set(paths)) - {m} for m, p in paths.items()}


GRAPH = graph()


def test_the_graph_is_the_whole_source() -> None:
    assert {"engine.base", "flowstate.loop", "flowstate.config", "flowstate.memory.base", "flowstate.memory.mage",
            "serving.turns", "flowstate.cli"} <= set(GRAPH)
    assert "flowstate.memory.base" in GRAPH["flowstate.loop"]  # the driver knows the seam, and only the seam


def test_no_import_cycles() -> None:
    # a package's __init__ importing its own members is no cycle of the house (``engine`` names its backends)
    edges = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in GRAPH.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges[m]):
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if d not in state:
                walk(d)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            walk(m)


def test_arrows_point_down_only() -> None:
    upward = sorted(f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})"
                    for m, deps in GRAPH.items() for d in deps if layer(d) > layer(m)
                    and not (m == "flowstate" and d == "flowstate.agent"))  # the package re-exports the API
    assert upward == []


def test_storage_knows_nothing_of_the_method_above_it() -> None:
    # within the core layer, storage is the floor: the repository holds nodes, never the index or the loop (of the
    # engine layer it reads one thing: what FlowState is as a distribution, for a session file's header)
    above = sorted(f"{m} imports {d}" for m, deps in GRAPH.items() if m.startswith("flowstate.store")
                   for d in deps if not d.startswith(("flowstate.store", "flowstate.errors", "flowstate.nodes",
                                                      "engine.distribution")))
    assert above == []


def test_the_reference_policies_know_kinds_not_methods() -> None:
    """policies.py imports no memory method: every method declares how a reference policy answers its own calls
    (``Purpose.reference``), and each of its calls' purposes has one."""
    from engine.purpose import Purpose

    methods = {m for m in GRAPH if m.startswith("flowstate.memory.")} - {"flowstate.memory.base",
                                                                        "flowstate.memory.reference"}
    assert sorted(GRAPH["flowstate.eval.policies"] & methods) == []
    import importlib

    purposes = [(m, name, v) for m in sorted(methods) for name, v in vars(importlib.import_module(m)).items()
                if isinstance(v, Purpose)]
    assert len(purposes) >= 7 and [f"{m}.{n}" for m, n, p in purposes if p.reference is None] == []


def test_engine_and_grammars_know_nothing_above() -> None:
    for m, deps in GRAPH.items():
        if layer(m) <= 1:
            assert not [d for d in deps if d.startswith(("flowstate", "serving"))], m


def test_production_code_never_imports_the_scripted_engine() -> None:
    users = sorted(m for m, deps in GRAPH.items() if "engine.scripted" in deps and m != "engine")
    assert users == []


def test_memory_hooks_get_a_narrow_context_never_the_run() -> None:
    from flowstate.memory import METHODS, get
    from flowstate.memory.base import MemoryContext, Strategy

    hooks = ("call_tool", "observed", "finish")
    for name in METHODS:
        for hook in hooks:
            fn = getattr(type(get(name)), hook)
            params = list(inspect.signature(fn).parameters.values())[1:]
            hints = fn.__annotations__
            assert params[0].name == "ctx" and hints["ctx"] in ("MemoryContext", MemoryContext), (name, hook)
            assert all(hints.get(p.name) not in ("Any", "RequestRun") for p in params), (name, hook)
    assert issubclass(type(get("mage")), Strategy)


PROBE = re.compile(r"\b(getattr|hasattr)\((self\.)?(engine|model|inner|router|config\.engine|servers\[0\]), *[\"']")


def test_no_engine_capability_is_found_by_getattr() -> None:
    found = [f"{p.relative_to(ROOT)}:{i}" for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if PROBE.search(line)]
    assert found == []


def test_the_architecture_pages_layout_matches_the_tree() -> None:
    layout = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([a-z_]+(?:/[a-z_0-9]+)*(?:\.py|/))`", layout))
    folders = [ROOT, *(d for d in ROOT.rglob("*") if d.is_dir() and (d / "__init__.py").exists())]
    missing = [n for n in named if not any((d / n).exists() for d in folders)]
    assert missing == []  # every path the list names exists (in full, or within a package its row names)
    unlisted = []
    for pkg in PACKAGES:
        for p in (ROOT / pkg).iterdir():
            if p.suffix == ".py" and p.stem not in ("__init__", "__main__") and f"{p.name}`" not in layout:
                unlisted.append(str(p.relative_to(ROOT)))
            if p.is_dir() and (p / "__init__.py").exists() and f"{p.relative_to(ROOT)}/" not in layout \
                    and f"{p.name}/`" not in layout:
                unlisted.append(f"{p.relative_to(ROOT)}/")
    assert unlisted == []  # every module and sub-package is in the list
    rows = re.split(r"\n(?=- `)", layout)  # one entry a package or a group of modules, wrapped over lines
    assert max(len(line) for line in layout.splitlines()) <= 120  # a page a reader reads, not one line a row
    unnamed = []
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            folder = p.parent.relative_to(ROOT)
            if folder.parent == Path(".") or p.stem in ("__init__", "__main__"):
                continue  # a top-level package's modules: checked above
            # the entries of its sub-package (or of a sub-package above it) name the module
            ups = [up for up in (folder, *folder.parents) if up.parent != Path(".") and up != Path(".")]
            own = [r for r in rows for up in ups if f"`{up}/" in r]
            if not any(f"`{p.name}`" in r or f"{p.relative_to(ROOT)}`" in r for r in own):
                unnamed.append(str(p.relative_to(ROOT)))
    assert unnamed == []  # every module of every sub-package is named in its package's entry


def test_every_module_that_runs_a_real_model_shares_the_one_worker() -> None:
    """tests/conftest.py's ONE_AT_A_TIME names files that exist, and every test module that builds a real engine
    (llama.cpp, transformers, MiniLM, vLLM) or starts the CLI on the embedded one is among them."""
    import re

    from tests.conftest import ONE_AT_A_TIME

    assert all((ROOT / path.partition("::")[0]).is_file() for path in ONE_AT_A_TIME)  # a module, or one of its tests
    pages = {path.partition("[")[2].rstrip("]") for path in ONE_AT_A_TIME if "::" in path}
    assert pages and all((ROOT / page).is_file() for page in pages)  # the docs' pages that run the embedded model
    real = re.compile(r"LlamaCppEngine\(|TransformersEngine\(|SentenceEmbedder\(|LlamaCppEmbedder\(|AsyncLLM|"
                      r"\"--engine\", \"llamacpp\"|engines?\.load\(\"(?:llamacpp|transformers)\"")
    builds = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")
              if p.name != "test_architecture.py" and real.search(p.read_text(encoding="utf-8"))}
    assert builds and builds <= ONE_AT_A_TIME, sorted(builds - ONE_AT_A_TIME)


def test_no_function_is_longer_than_60_lines() -> None:
    """The house rule: a function that needs more than 60 lines, docstring included, is two functions."""
    sources = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    long = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                if (lines := node.end_lineno - node.lineno + 1) > 60:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert sources and long == []


def test_no_two_source_classes_share_a_name() -> None:
    """One name for one thing: a reader who meets a class name meets one class (a wire model is suffixed ``Out``, a
    retention policy is a ``RetentionPolicy``, a tenant's counters ``TenantUsage``)."""
    where: dict[str, list[str]] = {}
    for path in (p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert where and shared == {}


def test_the_repository_is_a_composition_root_of_at_most_15_methods() -> None:
    """``Repository`` owns the connection and M (requests, nodes, relations); each other resource is a store of its
    own made on that connection (``repo.lineage``, ``repo.catalog``, ``repo.transfer``, ``repo.records``, …), and no
    store is handed the repository's private SQL."""
    from flowstate.store.repository import Repository

    tree = ast.parse((ROOT / "flowstate/store/repository.py").read_text(encoding="utf-8"))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Repository").body
    public = {n.name for n in body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    assert 0 < len(public) <= 15, sorted(public)
    with Repository.open(":memory:") as repo:
        stores = {"lineage", "catalog", "transfer", "records", "waiting", "conversations", "responses"}
        assert stores <= vars(repo).keys()
    for name in ("search.py", "transfer.py", "catalog.py"):
        assert not re.search(r"\b_LINE\b", (ROOT / "flowstate/store" / name).read_text(encoding="utf-8"))


ROUTE_HOME = (  # an endpoint family's routes (by path, first match) and the one module that defines them
    (re.compile(r"^/v1/chat/"), "serving/chat/routes.py"),
    (re.compile(r"/feedback$"), "serving/feedback.py"),  # feedback on a request, of either family
    (re.compile(r"^/v1/(responses|conversations)\b"), "serving/responses/routes.py"),
    (re.compile(r"^/v1/(sessions|memory)\b"), "serving/sessions/routes.py"),
    (re.compile(r"^/v1/admin\b"), "serving/admin.py"),
    (re.compile(r"^/v1/erasure\b"), "serving/erasure.py"),
    (re.compile(r"^/ui\b"), "serving/console/__init__.py"),
    (re.compile(r"^/(health|openapi\.json|metrics|v1/usage|v1/models)$"), "serving/operations.py"),
)


def test_every_route_is_defined_in_its_endpoints_folder() -> None:
    """One answer of one shape to "where is this route handled": its family's module (``routes.py`` of its folder
    where the family has one); serving/app.py only assembles routers and defines none."""
    found: list[tuple[str, str]] = []
    for path in (ROOT / "serving").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.args and \
                        isinstance(d.args[0], ast.Constant) and d.func.attr in ("get", "post", "patch", "delete"):
                    found.append((str(path.relative_to(ROOT)), str(d.args[0].value)))
    assert len(found) > 40
    misplaced = []
    for module, route in found:
        full = ("/v1/admin" + route) if module == "serving/admin.py" else route  # its router's prefix
        home = next((where for pattern, where in ROUTE_HOME if pattern.search(full)), None)
        if home != module:
            misplaced.append(f"{full} in {module}, not {home}")
    assert misplaced == []
