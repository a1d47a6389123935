"""Each hospital's trust over the rounds of one run, malicious hospitals marked: the picture
a consortium looks at to see whose update counted (saved as ``trust.png`` in the run directory).

The signal plotted is the rule's own: HTA's ``reputation``, FedAgain's ``trust``, EARN's
``earn_trust`` (mean over the rare classes), and the aggregation ``weight`` for every other
rule. Rounds where a hospital was rejected, left out or flagged get an x.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SIGNALS = ("reputation", "trust", "earn_trust", "weight")


def client_signal(client: Mapping[str, Any]) -> tuple[str, float] | None:
    """(signal name, value) for one client entry of rounds.jsonl, or None if it has none."""
    for key in SIGNALS:
        value = client.get(key)
        if value is None:
            continue
        if isinstance(value, Mapping):  # EARN: trust per class
            values = [float(v) for v in value.values() if v is not None]
            if not values:
                continue
            return key, sum(values) / len(values)
        return key, float(value)
    return None


def trust_series(rounds: Sequence[Mapping[str, Any]]) -> tuple[str, dict[str, list[tuple[int, float, bool]]], set[str]]:
    """Signal name, hospital -> [(round, value, flagged)], and the malicious hospitals."""
    series: dict[str, list[tuple[int, float, bool]]] = {}
    malicious: set[str] = set()
    names: list[str] = []
    for r in rounds:
        for c in r.get("clients", []):
            got = client_signal(c)
            if c.get("malicious"):
                malicious.add(c["hospital"])
            if got is None:
                continue
            names.append(got[0])
            flagged = bool(c.get("rejected") or c.get("flagged") or c.get("selected") is False)
            series.setdefault(c["hospital"], []).append((int(r["round"]), got[1], flagged))
    signal = max(set(names), key=lambda n: (names.count(n), -SIGNALS.index(n))) if names else "weight"
    return signal, series, malicious


def plot_trust(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw ``trust.png`` (or ``out``) from the run's rounds.jsonl; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hospitrust.server_app.results import read_rounds, read_summary

    run_dir = Path(run_dir)
    rounds = read_rounds(run_dir)
    if not rounds:
        raise ValueError(f"{run_dir}: rounds.jsonl has no rounds to plot")
    signal, series, malicious = trust_series(rounds)
    if not series:
        raise ValueError(f"{run_dir}: no per-hospital trust, reputation or weight recorded")
    try:
        summary = read_summary(run_dir)
        title = f"{summary.get('strategy', '')} on {summary.get('dataset', '')}, attack {summary.get('attack', 'none')}"
    except FileNotFoundError:  # a run still going, or stopped
        title = run_dir.name
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for hospital in sorted(series):
        pts = series[hospital]
        bad = hospital in malicious
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.plot(xs, ys, color="tab:red" if bad else "tab:blue", linestyle="--" if bad else "-",
                alpha=0.9 if bad else 0.6, marker="o", markersize=3, label=f"{hospital}{' (malicious)' if bad else ''}")
        flagged = [(x, y) for x, y, f in pts if f]
        if flagged:
            ax.scatter(*zip(*flagged), marker="x", s=40, color="black", zorder=3)
    ax.set_xlabel("round")
    ax.set_ylabel(signal.replace("_", " "))
    ax.set_title(f"{title}\n{signal} per hospital (red dashed: malicious; x: rejected, left out or flagged)",
                 fontsize=9)
    ax.grid(alpha=0.3)
    if len(series) <= 12:
        ax.legend(fontsize=7, ncol=2, loc="best")
    fig.tight_layout()
    target = Path(out) if out is not None else run_dir / "trust.png"
    fig.savefig(target)
    plt.close(fig)
    return target
