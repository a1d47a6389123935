"""Who is in the federation: node ids -> hospitals (node ids are random each run), and who is online."""

from __future__ import annotations

import re
import time
from logging import WARNING
from typing import Any, cast

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from hospitrust.config import RunConfig
from hospitrust.records import RoundRecord
from hospitrust.server_app.transport import Sent, node_unavailable


def wait_for_nodes(grid: Grid, minimum: int, timeout: float, poll: float = 1.0) -> list[int]:
    """Connected node ids once at least ``minimum`` are online; a clear error after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= minimum:
            return nodes
        if time.monotonic() >= deadline:
            raise TimeoutError(f"only {len(nodes)} hospital(s) connected after {timeout:.0f} s; min-hospitals is {minimum}")
        time.sleep(poll)


#: What the ClientApp raises for data that does not fit the task (client_app.context.load_hospital),
#: inside Flower's "<class '...'>:<'message'>" error reason.
_CANNOT_JOIN = re.compile(r"hospital '(?P<name>[^']+)' cannot join: (?P<why>.*?)'?>?\s*$", re.S)


def failure_reason(reason: str) -> tuple[str | None, str]:
    """A query error reply's reason -> (hospital name if the ClientApp named it, the readable reason).

    Parameters
    ----------
    reason : str
        The error reply's reason (Flower wraps the exception as ``<class '...'>:<'message'>``).

    Returns
    -------
    tuple[str | None, str]
        The hospital's name (None when it did not get that far) and the reason without Flower's wrapping.
    """
    text = (reason or "").strip()
    match = _CANNOT_JOIN.search(text)
    if match:
        return match.group("name"), match.group("why").strip().split("\n")[0].rstrip("'>")  # not the traceback
    inner = re.search(r":<'(.*)'>\s*$", text, re.S)
    return None, (inner.group(1) if inner else text)[-500:].strip()


def discover_hospitals(grid: Grid, cfg: RunConfig, task: Any = None,
                       failed: list[dict[str, Any]] | None = None) -> tuple[dict[int, str], list[dict[str, Any]]]:
    """Query round: node id -> hospital name (node ids are random each run), plus class counts and
    data cards. The query carries the task (``task``: the resolved Task), so no hospital needs a
    file of its own. A hospital that cannot join (its data does not fit the task) is left out and
    appended to ``failed`` with its reason; the run goes on with the others.
    """
    from hospitrust.tasks.task import TASK_KEY

    nodes = wait_for_nodes(grid, cfg.min_hospitals, cfg.reply_timeout)
    content = RecordDict({"config": ConfigRecord({TASK_KEY: task.to_json()})}) if task is not None else RecordDict()
    queries = [Message(content, dst_node_id=nid, message_type=MessageType.QUERY) for nid in nodes]
    hospitals: dict[int, str] = {}
    rows: list[dict[str, Any]] = []
    replied: set[int] = set()
    sent = Sent(grid, queries, cfg.reply_timeout)
    for reply in sent.replies():
        nid = sent.node_of(reply)  # the SuperLink's own error replies come from its node 1: named by their message
        replied.add(nid)
        if node_unavailable(reply):
            log(WARNING, "hospitrust: node %d is unavailable (Flower: %s) and is left out", nid,
                (reply.error.reason or "").strip())
            if failed is not None:
                failed.append({"node_id": nid, "hospital": f"node {nid}", "reason": (
                    "node unavailable: Flower's SuperLink answered for it (its SuperNode stopped sending heartbeats: "
                    "killed, or its machine down)")})
            continue
        if reply.has_error():
            name, why = failure_reason(reply.error.reason or "")
            log(WARNING, "hospitrust: %s could not join and is left out: %s", name or f"node {nid}", why)
            if failed is not None:
                failed.append({"node_id": nid, "hospital": name or f"node {nid}", "reason": why})
            continue
        info = reply.content.config_records.get("info")
        name = str(info["hospital"]) if info is not None and "hospital" in info else None
        if not name:
            log(WARNING, "Node %d sent no hospital name and is left out", nid)
            continue
        if name in hospitals.values():
            log(WARNING, "Node %d claims hospital name %r, already taken by another node: left out", nid, name)
            continue
        hospitals[nid] = name
        assert info is not None  # the name came from it
        rows.append(_query_row(name, nid, info))
    # online at the SuperLink but silent for the whole reply-timeout: on the record, not just absent
    for name in unresponsive_hospitals(0, grid, {nid: f"node {nid}" for nid in nodes if nid not in replied}):
        if failed is not None:
            failed.append({"node_id": int(name.split()[1]), "hospital": name, "reason": (
                f"unresponsive: online at the SuperLink but did not answer the query within reply-timeout "
                f"({cfg.reply_timeout:g} s)")})
    if len(hospitals) < cfg.min_hospitals:
        left_out = "".join(f"\n  {f['hospital']}: {f['reason']}" for f in (failed or []))
        raise RuntimeError(f"only {len(hospitals)} hospital(s) answered the query round; min-hospitals is "
                           f"{cfg.min_hospitals}" + (f"; left out:{left_out}" if left_out else ""))
    rows.sort(key=lambda r: (r["partition_id"], r["hospital"]))
    return hospitals, rows


def _query_row(name: str, nid: int, info: Any) -> dict[str, Any]:
    """A hospital's query reply (client_app.context: ints and lists of ints) as its class-count row."""
    return {
        "hospital": name,
        "node_id": nid,
        "partition_id": int(cast(int, info.get("partition-id", -1))),
        "num_partitions": int(cast(int, info.get("num-partitions", -1))),
        "train": [int(c) for c in cast(list[int], info.get("train-class-counts", []))],
        "val": [int(c) for c in cast(list[int], info.get("val-class-counts", []))],
        "device": str(info.get("device", "")),
        "format": str(info.get("data-format", "")),
        "card": {k: info[k] for k in ("images", "patients", "pixel-mean", "pixel-std", "skipped-files") if k in info},
    }


def format_class_counts(rows: list[dict[str, Any]], class_names: tuple[str, ...]) -> str:
    """The hospitals' training images per class, their totals and each one's data format."""
    width = max([len("hospital")] + [len(r["hospital"]) for r in rows])
    head = (f"{'hospital':<{width}} " + " ".join(f"{n[:10]:>10}" for n in class_names) + f" {'train':>7} {'val':>6}"
            + "  format")
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = " ".join(f"{c:>10}" for c in r["train"])
        lines.append(f"{r['hospital']:<{width}} {cells} {sum(r['train']):>7} {sum(r['val']):>6}  {r.get('format', '')}")
    totals = np.sum([r["train"] for r in rows], axis=0) if rows else []
    lines.append(f"{'total':<{width}} " + " ".join(f"{int(c):>10}" for c in totals)
                 + f" {sum(sum(r['train']) for r in rows):>7} {sum(sum(r['val']) for r in rows):>6}")
    return "\n".join(lines)


def unresponsive_hospitals(rnd: int, grid: Grid, silent: dict[int, str]) -> list[str]:
    """Of the hospitals asked and silent this round, those the SuperLink still lists online: alive to Flower
    (heartbeats) but not answering, e.g. a SuperNode whose ClientApp launcher died. Said in the log.
    """
    if not silent:
        return []
    online = set(grid.get_node_ids())
    out = sorted(name for nid, name in silent.items() if nid in online)
    if out:
        log(WARNING, "round %d: %s online at the SuperLink but did not answer within reply-timeout (unresponsive)",
            rnd, ", ".join(out))
    return out


def round_states(rnd: int, grid: Grid, hospitals: dict[int, str], *, asked: list[int], answered: set[int],
                 unavailable: dict[int, str], offline: list[str], evaluated: set[str],
                 previous: RoundRecord | None) -> dict[str, list[str]]:
    """What each hospital that was not simply there did this round, from what Flower said:

    - ``node_unavailable``: asked, and Flower's SuperLink answered for it "Node Unavailable" (its SuperNode
      stopped sending heartbeats: killed, or its machine down);
    - ``unresponsive``: asked, no reply at all within reply-timeout, and still online at the SuperLink;
    - ``offline``: listed offline when the round began (not asked) and still offline at its end;
    - ``rejoined``: back this round after the previous one missed it (offline, node unavailable, silent), or
      offline when the round began but online again by its end (not asked; evaluated if it came back in time).
    """
    missing = [nid for nid in asked if nid not in answered]
    node_unavail = sorted(hospitals.get(nid, f"node {nid}") for nid in missing if nid in unavailable)
    if node_unavail:
        log(WARNING, "round %d: %s unavailable (Flower: Node Unavailable, no heartbeat from its SuperNode)", rnd,
            ", ".join(node_unavail))
    unresponsive = unresponsive_hospitals(rnd, grid, {nid: hospitals[nid] for nid in missing
                                                      if nid not in unavailable and nid in hospitals})
    online = {hospitals[nid] for nid in grid.get_node_ids() if nid in hospitals} if offline else set()
    back = sorted(name for name in offline if name in online or name in evaluated)
    took_part = {hospitals.get(nid, f"node {nid}") for nid in answered} | evaluated
    away_before = set()
    if previous is not None:
        away_before = (set(previous.missing) | set(previous.offline) | set(previous.node_unavailable)) - set(previous.rejoined)
    rejoined = sorted(set(back) | (took_part & away_before))
    return {"node_unavailable": node_unavail, "unresponsive": unresponsive,
            "offline": sorted(name for name in offline if name not in back), "rejoined": rejoined}


def offline_hospitals(rnd: int, grid: Grid, hospitals: dict[int, str]) -> list[str]:
    """Hospitals known from the query round that the SuperLink lists as offline now: they are not
    asked this round (no heartbeat within Flower's patience, 2 x 30 s), which the round record says.
    """
    online = set(grid.get_node_ids())
    offline = sorted(name for nid, name in hospitals.items() if nid not in online)
    if offline:
        log(WARNING, "round %d: %s offline at the SuperLink (no recent heartbeat): not asked this round",
            rnd, ", ".join(offline))
    return offline
