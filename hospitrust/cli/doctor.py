"""``hospitrust doctor``: the environment's checks, one line each."""

from __future__ import annotations

import argparse
import sys


def _doctor(args: argparse.Namespace) -> int:
    from hospitrust import envcheck

    checks = envcheck.all_checks()
    for check in checks:
        mark = "ok" if check.ok else ("PROBLEM" if check.required else "missing")
        print(f"{mark:8s} {check.name}: {check.detail}")
    failed = [c for c in checks if not c.ok and c.required]
    if failed:
        print(f"hospitrust doctor: {len(failed)} problem{'s' if len(failed) > 1 else ''} to fix before "
              "`hospitrust simulate` can run", file=sys.stderr)
    return 1 if failed else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    doc = sub.add_parser("doctor", help="check this environment: torch and torchvision together, Flower, data, Chromium",
                         description="One line per check: torch and torchvision load together (the same build), "
                                     "Flower's version, which MedMNIST files are in the data folder, and Chromium "
                                     "for the browser tests. Exits 1 when simulate could not run.")
    doc.set_defaults(func=_doctor)
