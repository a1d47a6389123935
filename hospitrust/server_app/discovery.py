"""Who is in the federation: node ids -> hospitals (node ids are random each run), and who is online."""

from __future__ import annotations

import time
from logging import WARNING
from typing import Any, cast

import numpy as np
from flwr.app import Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from hospitrust.config import RunConfig


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


def discover_hospitals(grid: Grid, cfg: RunConfig) -> tuple[dict[int, str], list[dict[str, Any]]]:
    """Query round: node id -> hospital name (node ids are random each run), plus class counts."""
    nodes = wait_for_nodes(grid, cfg.min_hospitals, cfg.reply_timeout)
    queries = [Message(RecordDict(), dst_node_id=nid, message_type=MessageType.QUERY) for nid in nodes]
    hospitals: dict[int, str] = {}
    rows: list[dict[str, Any]] = []
    for reply in grid.send_and_receive(queries, timeout=cfg.reply_timeout):
        nid = int(reply.metadata.src_node_id)
        if reply.has_error():
            log(WARNING, "Node %d could not describe itself and is left out: %s", nid, (reply.error.reason or "").strip()[-500:])
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
        # the ClientApp's query reply (client_app.context): ints and lists of ints
        rows.append(
            {
                "hospital": name,
                "node_id": nid,
                "partition_id": int(cast(int, info.get("partition-id", -1))),
                "num_partitions": int(cast(int, info.get("num-partitions", -1))),
                "train": [int(c) for c in cast(list[int], info.get("train-class-counts", []))],
                "val": [int(c) for c in cast(list[int], info.get("val-class-counts", []))],
                "device": str(info.get("device", "")),
            }
        )
    if len(hospitals) < cfg.min_hospitals:
        raise RuntimeError(f"only {len(hospitals)} hospital(s) answered the query round; min-hospitals is {cfg.min_hospitals}")
    rows.sort(key=lambda r: (r["partition_id"], r["hospital"]))
    return hospitals, rows


def format_class_counts(rows: list[dict[str, Any]], class_names: tuple[str, ...]) -> str:
    width = max([len("hospital")] + [len(r["hospital"]) for r in rows])
    head = f"{'hospital':<{width}} " + " ".join(f"{n[:10]:>10}" for n in class_names) + f" {'train':>7} {'val':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = " ".join(f"{c:>10}" for c in r["train"])
        lines.append(f"{r['hospital']:<{width}} {cells} {sum(r['train']):>7} {sum(r['val']):>6}")
    totals = np.sum([r["train"] for r in rows], axis=0) if rows else []
    lines.append(f"{'total':<{width}} " + " ".join(f"{int(c):>10}" for c in totals)
                 + f" {sum(sum(r['train']) for r in rows):>7} {sum(sum(r['val']) for r in rows):>6}")
    return "\n".join(lines)


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
