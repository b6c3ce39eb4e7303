"""The test tree's conventions (docs/development.md, "The test tree"): every module under tests/ is
a test module (``test_*.py``), a fixture module (``conftest.py``) or a helper module
(``helpers_*.py``); the benches import no test module; a test imports its helpers, not another
test module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
BENCH = ROOT / "bench"

def _modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "data" not in p.relative_to(root).parts)


def _imported(path: Path) -> set[str]:
    """The modules ``path`` imports (``from a.b import c`` gives ``a.b`` and ``a.b.c``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{alias.name}" for alias in node.names}
    return out


def _dotted(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_every_module_under_tests_is_a_test_a_conftest_or_a_helper_module() -> None:
    odd = [str(p.relative_to(ROOT)) for p in _modules(TESTS)
           if not (p.name.startswith(("test_", "helpers_")) or p.name == "conftest.py")]
    assert not odd, f"name these test_*.py (tests) or helpers_*.py (no tests): {odd}"


def test_no_helper_module_holds_a_test() -> None:
    holding = [str(p.relative_to(ROOT)) for p in _modules(TESTS) if p.name.startswith("helpers_")
               for node in ast.parse(p.read_text()).body
               if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
               and node.name.startswith(("test_", "Test"))]
    assert not holding, f"tests in helper modules (pytest never collects them): {holding}"


def test_the_benches_import_no_test_module() -> None:
    found = {str(p.relative_to(ROOT)): sorted(m for m in _imported(p) if m == "tests" or m.startswith("tests."))
             for p in _modules(BENCH)}
    assert not {k: v for k, v in found.items() if v}, found


def test_a_test_imports_helpers_not_another_test_module() -> None:
    edges = {(_dotted(p), m) for p in _modules(TESTS) for m in _imported(p)
             if m.startswith("tests.") and m.rsplit(".", 1)[-1].startswith("test_")}
    assert not edges, f"move what they share into a helpers_*.py module: {sorted(edges)}"
