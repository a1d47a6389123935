"""Tasks: what a federation learns (classes, image shape, preprocessing, model)."""

from hospitrust.tasks.task import TASK_KEY, Task, TaskOptions, resolve_task

__all__ = ["TASK_KEY", "Task", "TaskOptions", "resolve_task"]
