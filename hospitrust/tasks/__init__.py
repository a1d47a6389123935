"""Tasks: what a federation learns (classes, image shape, preprocessing, model).

The names below load on first use, so that ``tasks.cli`` (the ``--task`` options every command's
parser shares) is imported without pydantic and numpy when ``hospitrust --help`` builds the parsers.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["TASK_KEY", "Task", "TaskOptions", "resolve_task"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("hospitrust.tasks.task"), name)
    raise AttributeError(f"module 'hospitrust.tasks' has no attribute {name!r}")
