"""EARN against a rare-class faker: the weight the faker captures on the rare row, the honest
specialist's trust over rounds, and the authors' rare-class macro-F1 gates.

Reads a folder of finished runs from ``hospitrust bench benchmarks/earn-faker.toml`` (or any
folder of runs with the same layout) and prints a Markdown table:

    python benchmarks/earn_faker.py runs/bench/earn-faker [--rare 4 --faker hospital-5 --specialist hospital-0]

- captured / fair: the faker's weight on the rare class's row (``rare_row_weight``) over its
  data share n_k / sum n (FedAvg's weight, whatever the base rule), mean over rounds. 1 means
  faking earned it its data share and no more (EARN on the FedAvg base with all trust at 0);
  the method's authors saw 7.5 for a consistent faker under history-only checking.
- the specialist's trust on the rare row at the last round and the first round it reached 0.8
  (the authors' gate: by round 15).
- rare-class macro-F1 at the end; gates: under attack within 0.05 of the same rule without the
  attack, and without attack above FedAvg.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from hospitrust.records import HospitalRecord, RoundRecord
from hospitrust.server_app import results


def _or_nan(x: float | None) -> float:
    return math.nan if x is None else x


def _client(rnd: RoundRecord, name: str) -> HospitalRecord | None:
    return rnd.client(name)


def rare_recall_late(rounds: list[RoundRecord], rare: int, last: int) -> float:
    """The rare class's test recall (``per_class_recall``), averaged over the last ``last``
    rounds that report it: does the model predict the class at all."""
    vals = [float(r.central["per_class_recall"][rare]) for r in rounds
            if len(r.central.get("per_class_recall") or []) > rare]
    return sum(vals[-last:]) / len(vals[-last:]) if vals else math.nan


def run_figures(run: Path, rare: str, faker: str, specialist: str) -> dict:
    config = json.loads((run / "config.json").read_text())
    cfg = config.get("run_config", config)
    rounds = results.read_round_records(run)
    ratios, row_weights, trust, body = [], [], [], []
    for rnd in rounds:
        f = _client(rnd, faker)
        valid = [c for c in rnd.clients if not c.rejected]
        total = sum(c.num_examples for c in valid)
        if f is not None and not f.rejected and total > 0 and f.num_examples:
            fair = f.num_examples / total  # its data share: FedAvg's weight, whatever the base rule
            row_w = (f.signal("rare_row_weight") or {}).get(rare, f.weight)  # no per-row rule: its weight
            row_weights.append(row_w)
            ratios.append(row_w / fair)
        s = _client(rnd, specialist)
        if s is not None and not s.rejected and total > 0 and s.num_examples:
            body.append(s.weight / (s.num_examples / total))  # its body weight over its data share
        if s is not None and s.signal("earn_trust") is not None:
            trust.append((rnd.number, (s.signal("earn_trust") or {}).get(rare, math.nan)))
    first_08 = next((r for r, t in trust if t >= 0.8), None)
    spear = [c.signal("evidence_spearman") for rnd in rounds for c in rnd.clients[:1]
             if isinstance(c.signal("evidence_spearman"), (int, float))]
    final = rounds[-1].central if rounds else {}
    return {
        "run": run.name,
        "seed": cfg.get("seed", "-"),
        "strategy": cfg.get("strategy"),
        "mode": cfg.get("earn.agreement", "-") if cfg.get("strategy") == "earn" else "-",
        "evidence": cfg.get("earn.evidence", "-") if cfg.get("strategy") == "earn" else "-",
        "cap": cfg.get("earn.row-cap", "-") if cfg.get("strategy") == "earn" else "-",
        "audit": cfg.get("earn.audit", True) if cfg.get("strategy") == "earn" else "-",
        "audit_by": cfg.get("earn.audit-by", "row") if cfg.get("strategy") == "earn" else "-",
        "base": cfg.get("earn.base", "fedavg") if cfg.get("strategy") == "earn" else "-",
        "excuse": cfg.get("earn.ablation.excuse-direction", False) if cfg.get("strategy") == "earn" else "-",
        "attack": cfg.get("attack", "none"),
        "captured_over_fair": sum(ratios) / len(ratios) if ratios and cfg.get("attack", "none") != "none" else math.nan,
        "faker_row_weight": sum(row_weights) / len(row_weights) if row_weights and cfg.get("attack", "none") != "none" else math.nan,
        "specialist_trust_last": trust[-1][1] if trust else math.nan,
        "specialist_body_over_share": sum(body) / len(body) if body else math.nan,
        "specialist_first_round_0.8": first_08,
        "evidence_spearman": sum(spear) / len(spear) if spear else math.nan,
        "rare_f1": final.get("rare_class_macro_f1", math.nan),
        # the final model swings from round to round: the last 5 rounds' mean as a steadier reading
        "rare_f1_last5": _or_nan(results.late_mean(rounds, "rare_class_macro_f1", 5)),
        "rare_recall_last5": rare_recall_late(rounds, int(rare), 5),
        "balanced_accuracy": final.get("balanced_accuracy", math.nan),
        "rounds": len(rounds),
    }


def _label(row: dict) -> str:
    if row["strategy"] != "earn":
        return str(row["strategy"])
    parts = [f"mode={row['mode']}"]
    if row["evidence"] != "update":
        parts.append(f"evidence={row['evidence']}")
    if row["cap"] not in ("-", 0.5):
        parts.append(f"cap={row['cap']}")
    if row["audit"] is False:
        parts.append("no audit")
    elif row["audit_by"] != "row-shift-free":  # the default audit goes unnamed
        parts.append(f"{row['audit_by']} audit")
    if row.get("base", "hta") != "hta":
        parts.append(f"{row['base']} base")
    elif row.get("excuse") is False:
        parts.append("no excuse")
    return "earn (" + ", ".join(parts) + ")"


def table(rows: list[dict]) -> str:
    def fmt(v, digits=3):
        if v is None:
            return "never"
        if isinstance(v, float):
            return "-" if math.isnan(v) else f"{v:.{digits}f}"
        return str(v)

    # gates compare runs of the same seed
    by = {(_label(r), r["attack"], r["seed"]): r for r in rows}
    out = ["| rule | attack | seed | faker's rare-row weight | captured / fair | specialist trust (last round) | "
           "specialist trust >= 0.8 from round | specialist body weight / data share | evidence Spearman | "
           "rare-class macro-F1 | same, last 5 rounds | rare class's recall, last 5 rounds | gate | balanced acc. |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (_label(r) != "fedavg", _label(r), r["attack"] != "none", r["seed"])):
        label = _label(r)
        if r["attack"] == "none":
            fedavg_clean = by.get(("fedavg", "none", r["seed"]), {}).get("rare_f1", math.nan)
            gate = "-" if label == "fedavg" else ("pass" if r["rare_f1"] > fedavg_clean else "fail") + " (> FedAvg)"
        else:
            clean = by.get((label, "none", r["seed"]), {}).get("rare_f1", math.nan)
            gate = ("pass" if abs(r["rare_f1"] - clean) <= 0.05 else "fail") + " (within 0.05 of no attack)"
        out.append(f"| {label} | {r['attack']} | {r['seed']} | {fmt(r['faker_row_weight'])} | {fmt(r['captured_over_fair'], 2)} | "
                   f"{fmt(r['specialist_trust_last'], 2)} | {fmt(r['specialist_first_round_0.8'])} | "
                   f"{fmt(r['specialist_body_over_share'], 2)} | {fmt(r['evidence_spearman'], 2)} | {fmt(r['rare_f1'])} | "
                   f"{fmt(r['rare_f1_last5'])} | {fmt(r['rare_recall_last5'], 2)} | {gate} | {fmt(r['balanced_accuracy'])} |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="a bench grid folder (cells/*) or a folder of run directories")
    p.add_argument("--rare", default="4", help="the rare class whose row is judged")
    p.add_argument("--faker", default="hospital-5")
    p.add_argument("--specialist", default="hospital-0")
    a = p.parse_args()
    base = Path(a.folder) / "cells" if (Path(a.folder) / "cells").is_dir() else Path(a.folder)
    runs = sorted(d for d in base.iterdir() if (d / "rounds.jsonl").is_file())
    if not runs:
        raise SystemExit(f"no finished runs (rounds.jsonl) under {base}")
    rows = [run_figures(r, a.rare, a.faker, a.specialist) for r in runs]
    text = table(rows)
    print(text)
    (Path(a.folder) / "earn_faker.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
