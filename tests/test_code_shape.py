"""The codebase stays walkable (issue 18): no function over ~80 lines without its reason written beside it, and no
import circle between the data modules papered over by an import inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "trainables", "analysis")  # benchmarks/ are exempt
MAX_LINES = 80
REASON = "# long:"  # on the def line or the line above it: why this function is one piece


def long_functions(root: Path = CHECKOUT, max_lines: int = MAX_LINES) -> list[str]:
    """``path:line name (n lines)`` for every function of the packages longer than ``max_lines`` (its decorators
    and docstring included) whose def line, or the line above it, carries no ``# long: reason``."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            lines = path.read_text().splitlines()
            for node in ast.walk(ast.parse("\n".join(lines), str(path))):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                n = node.end_lineno - node.lineno + 1
                beside = lines[node.lineno - 1] + (lines[node.lineno - 2] if node.lineno > 1 else "")
                if n > max_lines and REASON not in beside:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({n} lines)")
    return found


def function_level_imports(path: Path, of: str) -> list[int]:
    """Lines where a function of ``path`` imports from the module ``of``."""
    hits = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.module == of:
                    hits.append(node.lineno)
    return hits


def test_no_function_over_80_lines_without_a_reason():
    assert long_functions() == []


def test_the_scan_sees_a_long_function_and_its_reason(tmp_path):
    pkg = tmp_path / "analysis"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (pkg / "m.py").write_text(f"def long_one():\n{body}\n\n\ndef short():\n    return 1\n")
    assert long_functions(tmp_path) == [f"analysis/m.py:1 long_one ({MAX_LINES + 1} lines)"]
    (pkg / "m.py").write_text(f"# long: one table, row by row\ndef long_one():\n{body}\n")
    assert long_functions(tmp_path) == []


def test_data_modules_import_each_other_at_module_level_only():
    data = CHECKOUT / "trainables" / "data"
    assert function_level_imports(data / "datasets.py", "trainables.data.latent_store") == []
    assert function_level_imports(data / "latent_store.py", "trainables.data.datasets") == []
    assert "trainables.data.datasets" not in (data / "latent_store.py").read_text()  # the store needs only base


def _imports(path: Path, inside_functions: bool) -> list[tuple[int, str]]:
    """``(line, module)`` of the ``from X import`` statements of ``path``: at module level, or inside functions."""
    tree = ast.parse(path.read_text())
    nested = {
        id(n) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) for n in ast.walk(fn)
    }
    return [
        (n.lineno, n.module or "")
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and (id(n) in nested) == inside_functions
    ]


LAZY_OK = {"analysis.reporting"}  # `from analysis.reporting import plots`: matplotlib only when plotting


def test_analysis_has_no_import_circle_papered_over_inside_a_function():
    found = [
        f"{p.relative_to(CHECKOUT)}:{line} {mod}"
        for p in sorted((CHECKOUT / "analysis").rglob("*.py"))
        for line, mod in _imports(p, inside_functions=True)
        if mod.startswith("analysis") and mod not in LAZY_OK
    ]
    assert found == []


def test_the_analysis_core_imports_nothing_of_the_rest_of_the_analysis():
    core = CHECKOUT / "analysis" / "core"
    found = [
        f"{p.name}:{line} {mod}"
        for p in sorted(core.glob("*.py"))
        for inside in (False, True)
        for line, mod in _imports(p, inside)
        if mod.startswith("analysis") and not mod.startswith("analysis.core")
    ]
    assert found == []


def test_training_loads_only_the_analysis_core():
    """A trial imports the core, not the 6k lines of fits and reports (and not pyarrow through them)."""
    import subprocess
    import sys

    code = (
        "import sys, trainables.config, trainables.loop, trainables.nqm_trial, trainables.trial;"
        "print(sorted(k for k in sys.modules if k.startswith('analysis.') and not k.startswith('analysis.core')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=CHECKOUT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_one_name_per_module_across_packages():
    """``analysis/branch.py`` beside ``orchestrator/branch.py`` once made a traceback ambiguous; module names are
    unique across the three packages (``__init__`` aside)."""
    seen: dict[str, list[str]] = {}
    for pkg in PACKAGES:
        for p in (CHECKOUT / pkg).rglob("*.py"):
            if p.name != "__init__.py":
                seen.setdefault(p.stem, []).append(str(p.relative_to(CHECKOUT)))
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


def imports_of_tests(root: Path = CHECKOUT) -> list[str]:
    """``path:line module`` for every import of ``tests`` (or a module under it) by a product module, at module level
    or inside a function."""
    found = []
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                found += [f"{p.relative_to(root)}:{node.lineno} {n}" for n in names if n.split(".")[0] == "tests"]
    return found


def test_the_product_never_imports_the_tests():
    """The oracles and simulators with known answers (tests/oracles/: the NQM's closed form, synthetic sweeps) serve
    tests and benchmarks; the product (analysis/, trainables/, orchestrator/) runs without them."""
    assert imports_of_tests() == []


def test_the_tests_import_scan_sees_a_violation(tmp_path):
    pkg = tmp_path / "analysis"
    pkg.mkdir()
    (pkg / "m.py").write_text("import testsuite\n\n\ndef f():\n    from tests.oracles import nqm\n    import tests\n")
    assert imports_of_tests(tmp_path) == ["analysis/m.py:5 tests.oracles", "analysis/m.py:6 tests"]


# The orchestrator's house, bottom to top: a module imports only from its own layer or those before it.
# A feature folder (orchestrator/features/<name>/) is a layer of its own, named ``features.<name>``.
ORCHESTRATOR_LAYERS = (
    ("errors", "faults"),
    ("storage",),
    ("records",),
    ("specs",),
    ("cluster",),
    ("features.rehearsal",),
    ("search",),
    ("features.adaptive", "features.stop_behind"),  # the tuner plugs in their searcher and callback
    ("execution",),
    ("features.branched", "features.schedule"),  # branched runs its trials through the tuner
    ("sweep",),
    ("cli",),
)


def _layer(module: str) -> int:
    parts = module.split(".")
    part = ".".join(parts[1:3]) if parts[1] == "features" else parts[1]
    if part == "features.__init__":
        return 0  # the folder's docstring, nothing more
    return next(i for i, names in enumerate(ORCHESTRATOR_LAYERS) if part in names)


def orchestrator_imports(root: Path = CHECKOUT) -> dict[str, set[str]]:
    """``module -> {orchestrator modules it imports}``, at module level or inside functions (``from orchestrator.x
    import y`` where ``y`` is a module counts as importing ``orchestrator.x.y``)."""
    modules = {
        ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for p in (root / "orchestrator").rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for p in sorted((root / "orchestrator").rglob("*.py")):
        name = ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        out = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("orchestrator"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    out.add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.startswith("orchestrator."))
    return {k: {m for m in v if m != k and m != "orchestrator"} for k, v in graph.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_orchestrator_has_no_import_circle():
    assert import_cycles(orchestrator_imports()) == []


def test_the_orchestrator_never_imports_back_up_its_layers():
    graph = orchestrator_imports()
    found = [
        f"{m} -> {d}"
        for m, deps in sorted(graph.items())
        if m != "orchestrator"
        for d in sorted(deps)
        if _layer(d) > _layer(m)
    ]
    assert found == []


def test_every_orchestrator_module_is_in_a_named_layer_and_opens_with_its_concern():
    for p in sorted((CHECKOUT / "orchestrator").rglob("*.py")):
        name = ".".join(p.relative_to(CHECKOUT).with_suffix("").parts)
        if name != "orchestrator.__init__":
            _layer(name)  # StopIteration: a sub-package missing from ORCHESTRATOR_LAYERS
        assert ast.get_docstring(ast.parse(p.read_text())), f"{name}: no opening docstring"


def test_the_layer_and_cycle_checks_see_a_violation():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _layer("orchestrator.cli.main") > _layer("orchestrator.execution.tuner") > _layer("orchestrator.errors")


# The core's few imports of a feature, each named (docs/architecture.md, "Core and features"): the adaptive section
# of report.md, the tuner plugging in the adaptive searcher and the stop-behind callback, the branched spec checking
# its analysis's ``compare``. (The features' columns and file names are the core's: analysis/sources/schema.py.)
CORE_TO_FEATURE = {
    "analysis/reporting/report.py -> analysis.features.adaptive",
    "orchestrator/execution/run_sweep.py -> orchestrator.features.adaptive.adaptive_resume",
    "orchestrator/execution/tuner.py -> analysis.features.stop_behind.stop_behind",
    "orchestrator/execution/tuner.py -> orchestrator.features.adaptive.adaptive_resume",
    "orchestrator/execution/tuner.py -> orchestrator.features.adaptive.adaptive_search",
    "orchestrator/execution/tuner.py -> orchestrator.features.adaptive.adaptive_view",
    "orchestrator/execution/tuner.py -> orchestrator.features.stop_behind.behind_callback",
    "orchestrator/specs/branch_models.py -> analysis.features.branched.branched",
}


def core_imports_of_features(root: Path = CHECKOUT) -> set[str]:
    """``path -> module`` for every import of a feature (``analysis.features...``, ``orchestrator.features...``) by a
    module outside the feature folders and the CLI (whose commands are the features' entries), at any level."""
    found = set()
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")):
            rel = p.relative_to(root)
            if rel.parts[1:2] in (("features",), ("cli",)):
                continue
            for inside in (False, True):
                for _, mod in _imports(p, inside):
                    if mod.split(".")[1:2] == ["features"]:
                        found.add(f"{rel} -> {mod}")
    return found


def test_the_core_imports_a_feature_only_where_named():
    """The core (analysis/ but analysis/features/, trainables/, orchestrator/ but features/ and cli/) does not import
    the features, except the edges of CORE_TO_FEATURE; a new feature adds none."""
    assert core_imports_of_features() == CORE_TO_FEATURE


def test_trials_and_the_analysis_core_import_no_feature():
    found = {e for e in core_imports_of_features() if e.startswith(("trainables/", "analysis/core/", "analysis/fits/"))}
    assert found == set()
