"""The pictures of one run, drawn from its rounds.jsonl: each hospital's trust over the rounds
(``trust.png``, drawn at the end of every run whose rule weighs hospitals) and the metrics per
round (``metrics.png``, by ``hospitrust report``).

Trust is the signal the rule names as its own (its ``trust_signal``, in every round record): HTA's
``reputation``, EARN's ``earn_trust`` (the mean over its rare classes), FedAgain's, FLTrust's and
anchored-trust's ``trust``, and the aggregation ``weight`` for every other rule. Each hospital has
its own colour, the legend sits outside the axes, rounds are whole numbers; attackers (simulation
ground truth) are drawn dashed and thick, and rounds where a hospital was rejected, left out or
flagged get an x.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hospitrust.records import RoundRecord

METRICS = (("balanced_accuracy", "balanced accuracy"), ("auc", "AUC"), ("accuracy", "accuracy"),
           ("worst_class_recall", "worst-class recall"), ("rare_class_macro_f1", "rare-class macro-F1"),
           ("attack_success_rate", "attack success rate"))


def run_trust_signal(rounds: Sequence[RoundRecord]) -> str:
    """The name of the run's trust signal: what its rule names (every round's record says; the last round's
    wins if a run was resumed under another rule), ``weight`` for a rule that gives none.
    """
    return rounds[-1].trust_signal if rounds else "weight"


def trust_series(rounds: Sequence[RoundRecord]) -> tuple[str, dict[str, list[tuple[int, float, bool]]], set[str]]:
    """Signal name, hospital -> [(round, value, flagged)], and the malicious hospitals."""
    series: dict[str, list[tuple[int, float, bool]]] = {}
    malicious: set[str] = set()
    for r in rounds:
        for c in r.clients:
            value = r.trust_of(c)
            if c.malicious:
                malicious.add(c.hospital)
            if value is None:
                continue
            flagged = bool(c.rejected or c.flagged or not c.selected)
            series.setdefault(c.hospital, []).append((r.number, value, flagged))
    return run_trust_signal(rounds), series, malicious


def _natural(name: str) -> tuple:
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return (head, int(tail) if tail else -1, name)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colours(n: int) -> list:
    """N distinct colours: tab10, tab20, then evenly spaced hues."""
    import matplotlib

    if n <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [matplotlib.colormaps["tab20"](i) for i in range(n)]
    return [matplotlib.colormaps["hsv"](i / n) for i in range(n)]


def _whole_rounds(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _title(run_dir: Path) -> str:
    from hospitrust.server_app.results import read_summary

    try:
        summary = read_summary(run_dir)
        return f"{summary.get('strategy', '')} on {summary.get('dataset', '')}, attack {summary.get('attack', 'none')}"
    except FileNotFoundError:  # a run still going, or stopped
        return run_dir.name


def plot_trust(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw ``trust.png`` (or ``out``) from the run's rounds.jsonl; returns its path."""
    from hospitrust.server_app.results import read_round_records

    plt = _pyplot()
    run_dir = Path(run_dir)
    rounds = read_round_records(run_dir)
    if not rounds:
        raise ValueError(f"{run_dir}: rounds.jsonl has no rounds to plot")
    signal, series, malicious = trust_series(rounds)
    if not series:
        raise ValueError(f"{run_dir}: no per-hospital trust, reputation or weight recorded")
    hospitals = sorted(series, key=_natural)
    fig, ax = plt.subplots(figsize=(9, 4.6), dpi=110)
    for hospital, colour in zip(hospitals, _colours(len(hospitals))):
        pts = series[hospital]
        bad = hospital in malicious
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.plot(xs, ys, color=colour, linestyle="--" if bad else "-", linewidth=2.4 if bad else 1.4, marker="o",
                markersize=3, label=f"{hospital} (attacker)" if bad else hospital)
        flagged = [(x, y) for x, y, f in pts if f]
        if flagged:
            ax.scatter([p[0] for p in flagged], [p[1] for p in flagged], marker="x", s=45, color="black", zorder=3)
    ax.scatter([], [], marker="x", color="black", label="rejected, left out or flagged")
    ax.set_xlabel("round")
    ax.set_ylabel(signal.replace("_", " "))
    _whole_rounds(ax)
    ax.set_title(f"{_title(run_dir)}: {signal.replace('_', ' ')} per hospital", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=1 if len(hospitals) <= 22 else 2,
              frameon=False)
    fig.tight_layout()
    target = Path(out) if out is not None else run_dir / "trust.png"
    fig.savefig(target, bbox_inches="tight")
    plt.close(fig)
    return target


def plot_metrics(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw ``metrics.png`` (or ``out``): the central metrics per round, and the hospitals' mean
    accuracy on their own validation sets (federated evaluation); returns its path.
    """
    from hospitrust.server_app.results import read_round_records

    plt = _pyplot()
    run_dir = Path(run_dir)
    rounds = read_round_records(run_dir)
    if not rounds:
        raise ValueError(f"{run_dir}: rounds.jsonl has no rounds to plot")
    xs = [r.number for r in rounds]
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=110)
    for (key, label), colour in zip(METRICS, _colours(len(METRICS))):
        ys = [r.central.get(key) for r in rounds]
        if any(isinstance(y, (int, float)) for y in ys):
            ax.plot(xs, [y if isinstance(y, (int, float)) else float("nan") for y in ys], marker="o", markersize=3,
                    color=colour, label=label)
    fed = [(r.fairness or {}).get("mean") for r in rounds]
    if any(isinstance(y, (int, float)) for y in fed):
        ax.plot(xs, [y if isinstance(y, (int, float)) else float("nan") for y in fed], linestyle=":", color="grey",
                label="hospitals' mean accuracy (own val)")
    kept = [x for x, r in zip(xs, rounds) if r.kept_previous_model]
    for x in kept:
        ax.axvline(x, color="red", alpha=0.2)
    if kept:
        ax.plot([], [], color="red", alpha=0.4, label="kept the previous model")
    ax.set_xlabel("round")
    ax.set_ylim(0, 1)
    _whole_rounds(ax)
    ax.set_title(f"{_title(run_dir)}: metrics per round (test split)", fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # a run with no central metric and no evaluation has nothing to name
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    target = Path(out) if out is not None else run_dir / "metrics.png"
    fig.savefig(target, bbox_inches="tight")
    plt.close(fig)
    return target
