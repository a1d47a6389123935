"""The suite's time per test module against its budget in docs/testing.md; prints, never fails on noise.

Usage (what .ci/run does after the suite)::

    python .ci/suite_budget.py test-artifacts/suite.xml

Reads pytest's JUnit XML (``--junitxml``; each test case carries its time and its module), sums the time of
each module's tests (setup and teardown included, as pytest counts them), and prints one line per module that
went over its budget, then the totals. The budgets are the table under "## Budgets" in docs/testing.md
(``| tests/test_x.py | 60 | ... |``); a module not in the table has the budget of the row ``(any other
module)``. Exit status 0 whatever it finds (a noisy machine must not fail CI), 2 when the XML or the table
cannot be read.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "testing.md"
OTHER = "(any other module)"
_ROW = re.compile(r"^\|\s*`?([^|`]+?)`?\s*\|\s*(\d+(?:\.\d+)?)\s*\|")


def budgets(doc: Path = DOC) -> dict[str, float]:
    """``module path -> budget in seconds`` from the "## Budgets" table of ``doc``."""
    text = doc.read_text()
    if "## Budgets" not in text:
        raise ValueError(f"{doc}: no '## Budgets' section")
    section = text.split("## Budgets", 1)[1].split("\n## ", 1)[0]
    out = {m.group(1).strip(): float(m.group(2)) for line in section.splitlines() if (m := _ROW.match(line))}
    if OTHER not in out:
        raise ValueError(f"{doc}: the budgets table has no '{OTHER}' row")
    return out


def module_seconds(junit: Path) -> dict[str, float]:
    """``tests/test_x.py -> seconds`` summed over the module's test cases in a JUnit XML file."""
    out: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        classname = case.get("classname", "")  # tests.test_x or tests.test_x.TestClass
        parts = classname.split(".")
        module = "/".join(parts[:2]) + ".py" if len(parts) >= 2 else classname
        out[module] += float(case.get("time") or 0.0)
    return dict(out)


def report(seconds: dict[str, float], limits: dict[str, float]) -> list[str]:
    """The lines to print: each module over its budget (slowest first), then the totals."""
    over = []
    for module, spent in sorted(seconds.items(), key=lambda kv: -kv[1]):
        limit = limits.get(module, limits[OTHER])
        if spent > limit:
            over.append(f"over budget: {module} {spent:.0f} s (budget {limit:.0f} s, docs/testing.md)")
    total = sum(seconds.values())
    return over + [f"suite budget: {len(seconds)} modules, {total:.0f} s of test time in all, "
                   f"{len(over)} over their budget"]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    try:
        lines = report(module_seconds(Path(argv[0])), budgets())
    except (OSError, ET.ParseError, ValueError) as exc:
        print(f"suite budget: cannot read {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
