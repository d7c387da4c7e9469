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
