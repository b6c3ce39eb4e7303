"""Comments and docstrings of the package say what the code does and why: no issue references
(``#21``, ``issue 22``) in them. How the code came to be belongs in the commit message, where
``git log -S`` and ``git blame`` find it."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import fleetmedic

PACKAGE = Path(fleetmedic.__file__).parent

# "#21" not inside a word (PKCS#8, pods#0, &#9632;) nor a hex colour (#1f5fbf), "issue 22", "issues #21"
ISSUE_REFERENCE = re.compile(r"(?<![\w&#])#\d+(?![\w;])|\bissues? #?\d+", re.IGNORECASE)


def comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and every docstring of a module."""
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None and node.body:
                out.append((node.body[0].lineno, doc))
    return out


def issue_references(source: str) -> list[tuple[int, str]]:
    return [(line, m.group(0)) for line, text in comments_and_docstrings(source)
            for m in ISSUE_REFERENCE.finditer(text)]


def test_no_comment_or_docstring_of_the_package_names_an_issue() -> None:
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {ref}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for line, ref in issue_references(path.read_text(encoding="utf-8"))]
    assert not found, "issue references belong in commit messages:\n" + "\n".join(found)


def test_the_check_finds_issue_references_and_leaves_other_hashes_alone() -> None:
    source = '''"""Bounded memory (issue #22)."""
X = "#1f5fbf"  # a colour, in a string
# hardening, see issue 24
# PKCS#8 keys; pods#0; &#9632; colour #1d2330
def f():
    """As #21 reported."""
'''
    assert issue_references(source) == [(3, "issue 24"), (1, "issue #22"), (6, "#21")]
