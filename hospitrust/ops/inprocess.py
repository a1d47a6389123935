"""An in-process Flower Grid: the same ServerApp and ClientApp in one process, no Ray, no SuperLink.

For fast tests and for sweeps of many small runs on a few cores, where Ray's start-up
and actor overhead would dominate. Messages are deep-copied on the way (like the wire);
a ClientApp exception becomes an error reply with Flower's own reason (``<class '...'>:<'text'>``,
no traceback: that goes to the log, as a SuperNode logs it), as in a real run. Hospitals train one
after the other, or, with ``train.batched-hospitals``, a round's hospitals train as one
computation (``hospitrust.models.batched``). Real runs (``hospitrust simulate``, SuperNodes) serialize messages and
give each hospital its own process.
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Callable, Iterable
from logging import ERROR

from flwr.app import Context, Error, Message, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from hospitrust.server_app.transport import GridTraits


class InProcessGrid(Grid):
    """A Grid whose nodes are ClientApp calls in this process (node ids deliberately unordered)."""

    # one message at a time, in push order, and every reply there at the first pull
    traits = GridTraits(pipelines=True, answers_in_one_pull=True, pull_interval=0.0, packs_arrays=False)

    def __init__(self, client_app, num_nodes: int, run_config: dict, node_configs=None, run_id: int = 1,
                 reply_filter: Callable[[int, Message, Message], Message | None] | None = None,
                 first_node_id: int = 7_000_000) -> None:
        TaskIdentity.run_id = run_id
        TaskIdentity.node_id = 1
        TaskIdentity.task_id = 1
        self._client_app, self._run = client_app, Run.create_empty(run_id)
        # node ids deliberately out of partition order: the server must map them by query
        self.node_ids = [first_node_id + 37 * (num_nodes - i) for i in range(num_nodes)]
        node_configs = node_configs or [{"partition-id": i, "num-partitions": num_nodes} for i in range(num_nodes)]
        self.contexts = {
            nid: Context(run_id=run_id, node_id=nid, node_config=dict(nc), state=RecordDict(), run_config=dict(run_config))
            for nid, nc in zip(self.node_ids, node_configs)
        }
        # train.batched-hospitals: a round's hospitals train as one computation (hospitrust.models.batched)
        self.batched_hospitals = _flag(run_config.get("train.batched-hospitals", False))
        self.reply_filter = reply_filter  # (node index, incoming message, reply) -> reply to deliver, or None to drop it
        self._ids = itertools.count(1)
        self._pending: dict[str, Message] = {}  # message id -> pushed, not yet pulled

    def set_run(self, run):
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def push_messages(self, messages):
        ids = []
        for m in messages:
            mid = f"m{next(self._ids)}"
            m.metadata.__dict__["_message_id"] = mid
            self._pending[mid] = m
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        pulled = [self._pending.pop(mid) for mid in message_ids]
        trains = sum(msg.metadata.message_type.split(".")[0] == "train" for msg in pulled)
        if self.batched_hospitals and trains > 1:  # the round's hospitals meet inside training (models.batched)
            from hospitrust.models.batched import BatchSession

            delivered = [self._delivered(msg) for msg in pulled]
            results = BatchSession().run([functools.partial(_call, self._client_app, d, self.contexts[d.metadata.dst_node_id])
                                          for d in delivered])
            replies = [self._reply(d, *result) for d, result in zip(delivered, results)]
        else:
            replies = []
            for msg in pulled:
                d = self._delivered(msg)
                replies.append(self._reply(d, *_call(self._client_app, d, self.contexts[d.metadata.dst_node_id])))
        return [r for r in replies if r is not None]

    @staticmethod
    def _delivered(msg):
        """A copy of ``msg`` as the ClientApp receives it (its metadata too, as Flower's own copy)."""
        return Message(copy.deepcopy(msg.content), metadata=copy.deepcopy(msg.metadata))

    def _reply(self, delivered: Message, reply: Message | None, ex: Exception | None) -> Message | None:
        if ex is not None:  # what flwr's run_clientapp does: the reason is the exception's text
            log(ERROR, "ClientApp raised an exception", exc_info=ex)
            reply = Message(Error(code=2, reason=str(type(ex)) + ":<'" + str(ex) + "'>"), reply_to=delivered)
        assert reply is not None
        if self.reply_filter is not None:
            return self.reply_filter(self.node_ids.index(delivered.metadata.dst_node_id), delivered, reply)
        return reply

    def send_and_receive(self, messages, *, timeout=None):
        return self.pull_messages(self.push_messages(messages))


def _call(client_app, message: Message, context: Context) -> tuple[Message | None, Exception | None]:
    """(reply, None), or (None, the exception) where the ClientApp raised."""
    try:
        return client_app(message, context), None
    except Exception as ex:  # noqa: BLE001 - becomes the error reply, as flwr's run_clientapp makes it
        return None, ex


def _flag(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def run_inprocess(run_config: dict, num_hospitals: int, reply_filter=None, node_configs=None) -> None:
    """Run the hospitrust ServerApp against ``num_hospitals`` in-process simulated hospitals
    (``node_configs``: one per hospital; default partition i of ``num_hospitals``).
    """
    from flwr.app import Context, RecordDict

    from hospitrust.client_app.clientapp import app as client_app
    from hospitrust.server_app.serverapp import app as server_app

    grid = InProcessGrid(client_app, num_hospitals, run_config, node_configs=node_configs, reply_filter=reply_filter)
    server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=dict(run_config)))
