"""Sending messages to the hospitals and waiting for their replies, with a short poll.

Flower 1.42's deployed Grid (``HttpGrid.send_and_receive``) sleeps a fixed 3 s between pulls, so
every exchange with SuperNodes waits up to 3 s after the last reply arrived (two exchanges a
round). The ServerApp pushes and pulls through the Grid's own ``push_messages`` /
``pull_messages`` instead, polling every ``POLL_SECONDS`` (same semantics: replies until all
arrived or ``timeout``). Other grids (simulation's, the in-process one) keep their own.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid

#: Seconds between pulls while replies are outstanding (Flower's deployed Grid: 3).
POLL_SECONDS = 0.1


def exchange(grid: Grid, messages: Iterable[Message], timeout: float | None) -> list[Message]:
    """Push ``messages`` and pull their replies until all arrived or ``timeout`` seconds passed.

    Parameters
    ----------
    grid : Grid
        The ServerApp's grid.
    messages : Iterable[Message]
        Messages to the hospitals.
    timeout : float or None
        Seconds to wait for replies (None: until all arrived).

    Returns
    -------
    list[Message]
        The replies that arrived.
    """
    if type(grid).__name__ != "HttpGrid":  # only the deployed Grid sleeps 3 s between pulls
        return list(grid.send_and_receive(messages, timeout=timeout))
    pending = set(grid.push_messages(messages))
    deadline = None if timeout is None else time.monotonic() + timeout
    replies: list[Message] = []
    while pending:
        got = list(grid.pull_messages(pending))
        replies += got
        pending -= {m.metadata.reply_to_message_id for m in got}
        if not pending or (deadline is not None and time.monotonic() >= deadline):
            break
        time.sleep(POLL_SECONDS)
    return replies
