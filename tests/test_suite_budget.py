""".ci/suite_budget.py: the suite's time per module against docs/testing.md's budgets, on hand-made inputs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from conftest import REPO

_spec = importlib.util.spec_from_file_location("suite_budget", REPO / ".ci" / "suite_budget.py")
suite_budget = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite_budget)

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.test_fast" name="test_a" time="1.5"/>
<testcase classname="tests.test_fast" name="test_b" time="2.0"/>
<testcase classname="tests.test_slow.TestThing" name="test_c" time="70.25"/>
<testcase classname="tests.test_other" name="test_d" time="31"/>
</testsuite></testsuites>
"""
DOC = """# Testing

## Budgets

| module | budget (s) | measured (s) |
|---|---|---|
| `tests/test_slow.py` | 60 | 58 |
| tests/test_fast.py | 10 | 3 |
| (any other module) | 30 | |

## Next
| tests/test_other.py | 1000 | |
"""


def test_modules_over_their_budget_are_named_with_the_totals(tmp_path):
    (tmp_path / "suite.xml").write_text(JUNIT)
    (tmp_path / "testing.md").write_text(DOC)
    seconds = suite_budget.module_seconds(tmp_path / "suite.xml")
    assert seconds == {"tests/test_fast.py": 3.5, "tests/test_slow.py": 70.25, "tests/test_other.py": 31.0}
    limits = suite_budget.budgets(tmp_path / "testing.md")
    assert limits == {"tests/test_slow.py": 60.0, "tests/test_fast.py": 10.0, "(any other module)": 30.0}  # not "## Next"
    assert suite_budget.report(seconds, limits) == [
        "over budget: tests/test_slow.py 70 s (budget 60 s, docs/testing.md)",
        "over budget: tests/test_other.py 31 s (budget 30 s, docs/testing.md)",
        "suite budget: 3 modules, 105 s of test time in all, 2 over their budget",
    ]


def test_the_real_budgets_table_reads_and_the_script_never_fails_on_time(tmp_path):
    limits = suite_budget.budgets()
    assert limits[suite_budget.OTHER] > 0 and "tests/test_deploy.py" in limits
    (tmp_path / "suite.xml").write_text(JUNIT)
    res = subprocess.run([sys.executable, str(REPO / ".ci" / "suite_budget.py"), str(tmp_path / "suite.xml")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "suite budget: 3 modules" in res.stdout, res.stdout + res.stderr
    res = subprocess.run([sys.executable, str(REPO / ".ci" / "suite_budget.py"), str(tmp_path / "missing.xml")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "cannot read" in res.stderr, res.stdout + res.stderr
