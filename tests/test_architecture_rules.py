"""Shape rules of the round's plumbing: no function in ``hospitrust/server_app/`` or
``hospitrust/features/`` is longer than 60 lines (a longer one is split into named steps), and
every round feature's run-config section is its own declaration (no central list).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hospitrust"
LIMITED = ("server_app", "features")
MAX_LINES = 60


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """``(name, first line, lines)`` of every function and method, nested ones too; a function's
    lines run from its ``def`` to its last line (decorators not counted).
    """
    return [(node.name, node.lineno, (node.end_lineno or node.lineno) - node.lineno + 1)
            for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_the_counter_counts_def_to_last_line():
    source = "@deco\ndef f(x):\n    y = x\n\n    return y\n\nclass A:\n    def g(self):\n        def h():\n            pass\n"
    assert function_lengths(source) == [("f", 2, 4), ("g", 8, 3), ("h", 9, 2)]


def test_no_function_in_the_round_plumbing_is_longer_than_60_lines():
    long = []
    for package in LIMITED:
        for path in sorted((PACKAGE / package).rglob("*.py")):
            long += [f"hospitrust/{path.relative_to(PACKAGE).as_posix()}:{line} {name} ({lines} lines)"
                     for name, line, lines in function_lengths(path.read_text()) if lines > MAX_LINES]
    assert long == [], f"split these into named steps (at most {MAX_LINES} lines each):\n" + "\n".join(long)


def test_each_feature_section_is_declared_by_its_feature():
    from hospitrust.config.sections import RUN_SECTIONS, all_sections
    from hospitrust.features.registry import feature_sections

    owned = feature_sections()
    assert {"privacy", "secagg", "contribution-scoring"} <= set(owned)
    sections = all_sections()
    for name, feature in owned.items():
        assert name not in RUN_SECTIONS  # the run parts' list names no feature's section
        assert sections[name].options is feature.Options and sections[name].kind == "service"
        assert (PACKAGE.parent / "docs" / feature.doc).is_file()
