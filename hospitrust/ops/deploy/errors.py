"""The deployment commands' error."""

from __future__ import annotations


class DeployError(RuntimeError):
    """A deployment step cannot be done; the message says why and what to do."""
