"""Sending messages to the hospitals and waiting for their replies, with a short poll.

Flower 1.42's deployed Grid (``HttpGrid.send_and_receive``) sleeps a fixed 3 s between pulls, so
every exchange with SuperNodes waits up to 3 s after the last reply arrived (two exchanges a
round). The ServerApp pushes and pulls through the Grid's own ``push_messages`` /
``pull_messages`` instead, polling every ``POLL_SECONDS`` (same semantics: replies until all
arrived or ``timeout``), as does the in-process grid; on the simulation's grid it pushes and pulls
as that grid's ``send_and_receive`` does (its pull interval), so a long wait can say how many
hospitals replied.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from logging import INFO

from flwr.app import Error, Message, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from hospitrust.wire import PackingError, pack_content, unpack_content

#: Seconds between pulls while replies are outstanding (Flower's deployed Grid: 3), right after the push
#: and after each reply; every pull that brings nothing stretches the next wait by POLL_BACKOFF, up to
#: POLL_MAX_SECONDS: a round whose hospitals train for minutes does not keep the SuperLink answering ten
#: pulls a second (each one a database query), and a reply waits at most POLL_MAX_SECONDS to be seen.
POLL_SECONDS = 0.1
POLL_BACKOFF = 1.5
POLL_MAX_SECONDS = 0.5
#: A wait longer than this logs "k/n hospitals replied" lines, one per this many seconds (a long
#: first round, or a slow hospital, is not silence); ``hospitrust simulate`` redraws them in place
#: on a terminal.
PROGRESS_SECONDS = 15.0
PROGRESS_MARK = "hospitrust: waiting for replies:"


#: Flower's ErrorCode.NODE_UNAVAILABLE: the SuperLink's own error reply for a message whose destination node
#: stopped sending heartbeats (its SuperNode killed, its machine down), as opposed to no reply at all
NODE_UNAVAILABLE = 5


def node_unavailable(reply: Message) -> bool:
    """Whether ``reply`` is the SuperLink's "Node Unavailable" error reply (not a hospital's own)."""
    return bool(reply.has_error() and int(reply.error.code) == NODE_UNAVAILABLE)


def progress_line(replied: int, asked: int, waited: float) -> str:
    """The progress line logged while a wait for replies lasts."""
    return f"{PROGRESS_MARK} {replied}/{asked} hospitals replied after {waited:.0f} s"


@dataclass(frozen=True)
class GridTraits:
    """What an exchange needs to know of a grid."""

    #: A node takes its messages one at a time, in push order: the next round's train messages may
    #: go out together with this round's evaluation (pushed before their pull).
    pipelines: bool
    #: Every reply is there at the first pull after the push (no polling).
    answers_in_one_pull: bool
    #: Seconds between pulls while replies are outstanding.
    pull_interval: float
    #: Messages cross a wire (a SuperLink, the simulation's message store): each ArrayRecord goes packed as one
    #: object (:mod:`hospitrust.wire`). The in-process grid hands the Message objects over and packs nothing.
    packs_arrays: bool = True


#: SuperNodes behind Flower's deployed grid: a SuperNode takes one message at a time and pulls again
#: as soon as it has replied (with the train messages already there it does not sleep its idle 3 s).
DEPLOYED = GridTraits(pipelines=True, answers_in_one_pull=False, pull_interval=POLL_SECONDS)


def grid_traits(grid: Grid) -> GridTraits:
    """The grid's traits: a grid that declares them (``traits``, as hospitrust's in-process grid
    does), else Flower's simulation grid's or its deployed grid's.

    Flower's simulation engine may run two messages of one node at once on two Ray actors, each
    with a copy of the node's context, so the second to finish would overwrite the first's state:
    no pipelining there (nor is there a sleep to save), and pulls at the grid's own interval. A grid
    of another kind is treated the same way (push, then pull), the choice that is safe everywhere.
    """
    declared = getattr(grid, "traits", None)
    if isinstance(declared, GridTraits):
        return declared
    from flwr.superlink.grid import HttpGrid

    if isinstance(grid, HttpGrid):
        return DEPLOYED
    return GridTraits(pipelines=False, answers_in_one_pull=False,
                      pull_interval=float(getattr(grid, "pull_interval", POLL_SECONDS)))


def pipelines(grid: Grid) -> bool:
    """Whether the next round's train messages may go out together with this round's evaluation."""
    return grid_traits(grid).pipelines


class Sent:
    """Messages pushed now; ``replies()`` pulls theirs until all arrived or ``timeout`` seconds
    after the push passed (the deadline runs from the push, also when pulling starts later).

    On the simulation's grid the messages go out when ``replies()`` is called (pushed, then pulled
    as its ``send_and_receive`` does), as they did before pipelining.
    """

    def __init__(self, grid: Grid, messages: Iterable[Message], timeout: float | None,
                 on_reply: Callable[[Message], None] | None = None) -> None:
        self.grid, self.timeout = grid, timeout
        self.on_reply = on_reply  # told of each reply as it arrives (the round's progress file)
        self.traits = grid_traits(grid)
        self.messages = _packed(messages) if self.traits.packs_arrays else list(messages)
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.ids = list(grid.push_messages(self.messages)) if self.messages and self.traits.pipelines else []
        #: node ids the SuperLink answered for with "Node Unavailable" (their SuperNode gone), with its reason
        self.unavailable: dict[int, str] = {}

    def node_of(self, reply: Message) -> int:
        """The hospital's node a reply is about: its sender, or for the SuperLink's own error reply the
        destination of the message it answers.
        """
        dst = dict(zip(self.ids, (int(m.metadata.dst_node_id) for m in self.messages)))
        return dst.get(reply.metadata.reply_to_message_id, int(reply.metadata.src_node_id))

    def replies(self) -> list[Message]:
        if not self.messages:
            return []
        if not self.traits.pipelines:  # the simulation's grid: push now, pull as its send_and_receive does
            self.ids = list(self.grid.push_messages(self.messages))
            self.deadline = None if self.timeout is None else time.monotonic() + self.timeout
        elif self.traits.answers_in_one_pull:
            return self._seen(list(self.grid.pull_messages(self.ids)))
        poll = self.traits.pull_interval
        pending = set(self.ids)
        replies: list[Message] = []
        started = time.monotonic()
        next_progress = started + PROGRESS_SECONDS
        while pending:
            got = self._seen(list(self.grid.pull_messages(pending)))
            replies += got
            pending -= {m.metadata.reply_to_message_id for m in got}
            now = time.monotonic()
            if not pending or (self.deadline is not None and now >= self.deadline):
                break
            if now >= next_progress:
                log(INFO, "%s", progress_line(len(self.ids) - len(pending), len(self.ids), now - started))
                next_progress = now + PROGRESS_SECONDS
            if got:  # a reply came: the others may be close behind
                poll = self.traits.pull_interval
            time.sleep(poll)
            poll = min(max(self.traits.pull_interval, POLL_MAX_SECONDS), poll * POLL_BACKOFF)  # nothing yet: back off
        return replies

    def _seen(self, replies: list[Message]) -> list[Message]:
        if self.traits.packs_arrays:
            replies = [self._unpacked(reply) for reply in replies]
        for reply in replies:
            if node_unavailable(reply):
                self.unavailable[self.node_of(reply)] = (reply.error.reason or "").strip()
            if self.on_reply is not None:
                self.on_reply(reply)
        return replies

    def _unpacked(self, reply: Message) -> Message:
        """The reply with its packed arrays unpacked, before any check or callback sees it; a packed record that
        cannot be read makes it an error reply saying why (rejected and recorded as any unusable reply).
        """
        if not reply.has_content():
            return reply
        try:
            content = unpack_content(reply.content)
        except PackingError as exc:
            sent = dict(zip(self.ids, self.messages)).get(reply.metadata.reply_to_message_id)
            if sent is None:  # not a reply to one of these messages: left as it came, the checks refuse it
                return reply
            return Message(Error(code=0, reason=f"malformed reply: its packed arrays cannot be read: {exc}"),
                           reply_to=sent)
        if content is not None:
            reply.content = content
        return reply


def _packed(messages: Iterable[Message]) -> list[Message]:
    """The messages with their arrays packed; messages that share one content share its packed form."""
    packed: dict[int, tuple[RecordDict, RecordDict | None]] = {}  # by the content's id, the content kept alive
    out = list(messages)
    for msg in out:
        if not msg.has_content():
            continue
        content = msg.content
        if id(content) not in packed:
            packed[id(content)] = (content, pack_content(content))
        packed_content = packed[id(content)][1]
        if packed_content is not None:
            msg.content = packed_content
    return out


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
    return Sent(grid, messages, timeout).replies()
