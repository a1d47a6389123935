"""Contribution scores against the ground truth: exact Shapley from all 2^n coalition models.

Simulation, where the individual updates are visible: n hospitals on PneumoniaMNIST
(Dirichlet alpha 0.5) with different data quality (label noise 0 / 20 / 40 %, one
free-rider that returns the global model unchanged, one label flipper), FedAvg. Every
round, every coalition model ``M_S = M0 + sum_{i in S} w_i U_i / sum_{i in S} w_i`` is
evaluated on the validation split, which gives exact per-round Shapley (and multi-round
Shapley, their sum) and, from the same table, what hospitals would report under secure
aggregation (LOO, IOI, the round gain), hence FP and EE; COS from the actual updates.
All utilities here use one common validation set (the MedMNIST val split) for every
evaluator, so the comparison with Shapley is on the same v.

It prints, per setting and seed, and as a mean over seeds:
  * Spearman rank correlation of accumulated FP, EE, LOO, IOI, COS with multi-round Shapley
    (and the mean per-round correlation),
  * the rank (1 = lowest score) of the label flipper and of the free-rider under each score,
  * a selfish hospital's score gain when it inflates its reported LOO and IOI by --selfish,
  * test balanced accuracy of contribution-weighted aggregation (FP, EE) against FedAvg.

``--model linear`` (logistic regression on the pixels) makes the 2^n coalition evaluations
exact and cheap (logits are linear in the parameters, so a coalition's logits are a weighted
sum of per-hospital logit deltas); ``--model small-cnn`` builds each coalition model.

Example (the README's table)::

    nice -n 15 python benchmarks/contribution.py --hospitals 5 10 --rounds 10 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from hospitrust.config import RunConfig
from hospitrust.contribution.scores import (
    MAX_EXACT_SHAPLEY_PLAYERS,
    cosine_to_aggregate,
    everybody_else,
    fair_private,
    marginals_from_table,
    shapley_exact,
    spearman,
)
from hospitrust.datasets.federation import load_arrays, partitions
from hospitrust.models import build_model
from hospitrust.models.training import seed_everything, to_batch, train

SCORE_NAMES = ("fp", "ee", "loo", "ioi", "cos")


def roles_for(n: int) -> list[str]:
    """Data quality per hospital: noise 0/20/40 % cycling, then a free-rider and a label flipper."""
    if n < 4:
        raise ValueError(f"the benchmark needs at least 4 hospitals (two honest, a free-rider, a flipper), got {n}")
    cycle = ["noise-0", "noise-20", "noise-40"]
    return [cycle[i % 3] for i in range(n - 2)] + ["free-rider", "flipper"]


def corrupt(labels: np.ndarray, role: str, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    y = labels.copy()
    if role == "flipper":
        return (num_classes - 1) - y
    if role.startswith("noise-"):
        p = int(role.split("-")[1]) / 100
        hit = rng.random(y.size) < p
        y[hit] = (y[hit] + rng.integers(1, num_classes, hit.sum())) % num_classes
    return y


def linear_model(in_channels: int, num_classes: int, size: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * size * size, num_classes))


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


def load_flat(model: nn.Module, vec: torch.Tensor) -> None:
    i = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(vec[i:i + p.numel()].reshape(p.shape).to(p.dtype))
            i += p.numel()


def balanced_accuracy(pred: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(S,) balanced accuracy of S prediction rows (S, N)."""
    recalls = []
    for c in range(num_classes):
        mask = labels == c
        if mask.any():
            recalls.append((pred[:, mask] == c).double().mean(dim=1))
    return torch.stack(recalls).mean(dim=0)


class Evaluator:
    """v(theta) for a batch of parameter vectors on one labelled set (balanced accuracy)."""

    def __init__(self, model: nn.Module, images: np.ndarray, labels: np.ndarray, num_classes: int, linear: bool):
        self.model, self.num_classes, self.linear = model, num_classes, linear
        self.x = to_batch(images, torch.device("cpu"))
        self.y = torch.as_tensor(labels.reshape(-1), dtype=torch.long)
        if linear:
            self.flat_x = self.x.reshape(self.x.shape[0], -1).double()

    def _logits_linear(self, theta: torch.Tensor) -> torch.Tensor:  # theta (S, d) -> (S, N, C)
        c = self.num_classes
        w = theta[:, : -c].reshape(theta.shape[0], c, -1)
        b = theta[:, -c:]
        return torch.einsum("nf,scf->snc", self.flat_x, w) + b[:, None, :]

    @torch.no_grad()
    def __call__(self, thetas: torch.Tensor) -> np.ndarray:
        if self.linear:
            out = []
            for chunk in thetas.split(128):
                out.append(balanced_accuracy(self._logits_linear(chunk).argmax(dim=2), self.y, self.num_classes))
            return torch.cat(out).numpy()
        vals = []
        self.model.eval()
        for theta in thetas:
            load_flat(self.model, theta)
            pred = self.model(self.x).argmax(dim=1)
            vals.append(float(balanced_accuracy(pred[None], self.y, self.num_classes)[0]))
        return np.array(vals)


def coalition_thetas(global_vec: torch.Tensor, updates: torch.Tensor, weights: np.ndarray, masks: list[int]) -> torch.Tensor:
    n = updates.shape[0]
    coef = np.zeros((len(masks), n))
    for k, mask in enumerate(masks):
        members = [(mask >> i) & 1 for i in range(n)]
        tot = sum(w for w, m in zip(weights, members) if m)
        if tot > 0:
            coef[k] = [w / tot if m else 0.0 for w, m in zip(weights, members)]
    return global_vec[None, :] + torch.from_numpy(coef) @ updates


@dataclass
class Setting:
    hospitals: int
    rounds: int
    seed: int
    model: str
    local_epochs: int
    learning_rate: float
    train_subsample: float
    selfish: float


def run_once(s: Setting, weighting: str, with_shapley: bool) -> dict:
    """One federation; weighting: fedavg, fp or ee (weights ∝ clipped positive accumulated score)."""
    cfg = RunConfig(seed=s.seed, partitioner="dirichlet", dirichlet_alpha=0.5, train_subsample=s.train_subsample)
    arrays = load_arrays(cfg.federation)
    num_classes = int(arrays.labels["train"].max()) + 1
    in_ch, size = arrays.images["train"].shape[3], arrays.images["train"].shape[1]
    roles = roles_for(s.hospitals)
    rng = np.random.default_rng([s.seed, 99])
    shares = partitions(cfg.federation, s.hospitals)
    data = []
    for i, idx in enumerate(shares):
        y = arrays.labels["train"][idx].reshape(-1)
        data.append((arrays.images["train"][idx], corrupt(y, roles[i], num_classes, rng)))
    seed_everything(s.seed)
    linear = s.model == "linear"
    model = linear_model(in_ch, num_classes, size) if linear else build_model(s.model, in_ch, num_classes, size)
    val = Evaluator(model, arrays.images["val"], arrays.labels["val"], num_classes, linear)
    test = Evaluator(model, arrays.images["test"], arrays.labels["test"], num_classes, linear)
    theta = flat_params(model)
    n = s.hospitals
    full = (1 << n) - 1
    masks = list(range(1 << n)) if with_shapley else sorted({0, full, *[1 << i for i in range(n)], *[full & ~(1 << i) for i in range(n)]})
    acc = {k: np.zeros(n) for k in (*SCORE_NAMES, "shapley", "fp_selfish", "ee_selfish", "loo_selfish", "ioi_selfish")}
    per_round_rho = {k: [] for k in SCORE_NAMES}
    sizes = np.array([len(d[1]) for d in data], dtype=float)
    selfish = roles.index("noise-0")  # an honest, good hospital that also lies about its evaluations
    for rnd in range(1, s.rounds + 1):
        updates = []
        for i, (x, y) in enumerate(data):
            if roles[i] == "free-rider":
                updates.append(torch.zeros_like(theta))
                continue
            seed_everything(s.seed, i, rnd)
            load_flat(model, theta)
            train(model, x, y, epochs=s.local_epochs, batch_size=32, learning_rate=s.learning_rate,
                  device=torch.device("cpu"))
            updates.append(flat_params(model) - theta)
        U = torch.stack(updates)
        if weighting == "fedavg" or rnd == 1:
            w = sizes / sizes.sum()
        else:
            pos = np.maximum(acc[weighting], 0.0)
            w = pos / pos.sum() if pos.sum() > 0 else sizes / sizes.sum()
        players = [i for i in range(n) if w[i] > 0]
        # a hospital with weight 0 is not in the round: score the others (sub-game over players)
        sub = len(players)
        idx_masks = masks if sub == n else None
        if idx_masks is None:
            fullp = (1 << sub) - 1
            idx_masks = sorted({0, fullp, *[1 << k for k in range(sub)], *[fullp & ~(1 << k) for k in range(sub)]})
        thetas = coalition_thetas(theta, U[players], w[players], idx_masks)
        vals = dict(zip(idx_masks, val(thetas)))
        table = np.array([vals.get(m, np.nan) for m in range(1 << sub)])
        loo, ioi, delta = marginals_from_table(np.nan_to_num(table))
        fp = fair_private(loo, ioi, delta)
        # EE needs the others' reports: with one hospital left in the round it adds nothing
        ee = everybody_else(loo, ioi, np.full(sub, delta)) if sub >= 2 else np.zeros(sub)
        agg = (torch.from_numpy(w[players]) @ U[players])
        cos = np.array([cosine_to_aggregate(U[i].numpy(), agg.numpy()) for i in players])
        # the selfish hospital's lie: its LOO and IOI each inflated by s.selfish
        lie = np.zeros(sub)
        if selfish in players:
            lie[players.index(selfish)] = s.selfish
        fp_l = fair_private(loo + lie, ioi + lie, delta)
        ee_l = everybody_else(loo + lie, ioi + lie, np.full(sub, delta)) if sub >= 2 else np.zeros(sub)
        round_scores = {"fp": fp, "ee": ee, "loo": loo, "ioi": ioi, "cos": cos}
        for k, v in round_scores.items():
            acc[k][players] += v
        acc["fp_selfish"][players] += fp_l
        acc["ee_selfish"][players] += ee_l
        acc["loo_selfish"][players] += loo + lie
        acc["ioi_selfish"][players] += ioi + lie
        if with_shapley and sub == n:
            phi = shapley_exact(table)
            acc["shapley"] += phi
            for k, v in round_scores.items():
                per_round_rho[k].append(spearman(v, phi))
        theta = theta + torch.from_numpy(w) @ U
    final_ba = float(test(theta[None])[0])
    return {"roles": roles, "acc": {k: v.tolist() for k, v in acc.items()}, "test_balanced_accuracy": final_ba,
            "per_round_rho": {k: float(np.nanmean(v)) if v else float("nan") for k, v in per_round_rho.items()},
            "selfish": selfish}


def rank_lowest(scores: np.ndarray, i: int) -> int:
    """1 when hospital i has the lowest score."""
    return int(np.argsort(np.argsort(scores))[i]) + 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hospitals", type=int, nargs="+", default=[5, 10])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--model", default="linear", help="linear (exact, fast) or a registry model (small-cnn)")
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--learning-rate", type=float, default=0.01)
    ap.add_argument("--train-subsample", type=float, default=0.5)
    ap.add_argument("--selfish", type=float, default=0.05, help="a selfish hospital's inflation of its LOO and IOI")
    ap.add_argument("--json", default="", help="also write all results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    for n in args.hospitals:
        if n > MAX_EXACT_SHAPLEY_PLAYERS:
            ap.error(f"exact Shapley needs at most {MAX_EXACT_SHAPLEY_PLAYERS} hospitals")
    results = []
    for n in args.hospitals:
        rows = []
        for seed in args.seeds:
            s = Setting(n, args.rounds, seed, args.model, args.local_epochs, args.learning_rate, args.train_subsample,
                        args.selfish)
            t0 = time.time()
            base = run_once(s, "fedavg", with_shapley=True)
            by_fp = run_once(s, "fp", with_shapley=False)
            by_ee = run_once(s, "ee", with_shapley=False)
            a = {k: np.array(v) for k, v in base["acc"].items()}
            roles = base["roles"]
            flip, free, me = roles.index("flipper"), roles.index("free-rider"), base["selfish"]
            row = {
                "hospitals": n, "seed": seed, "seconds": time.time() - t0,
                "rho": {k: spearman(a[k], a["shapley"]) for k in SCORE_NAMES},
                "rho_per_round": base["per_round_rho"],
                "flipper_rank": {k: rank_lowest(a[k], flip) for k in (*SCORE_NAMES, "shapley")},
                "free_rider_rank": {k: rank_lowest(a[k], free) for k in (*SCORE_NAMES, "shapley")},
                "selfish_gain": {k: float(a[f"{k}_selfish"][me] - a[k][me]) for k in ("loo", "ioi", "fp", "ee")},
                "selfish_honest": {k: float(a[k][me]) for k in ("loo", "ioi", "fp", "ee")},
                "test_bal_acc": {"fedavg": base["test_balanced_accuracy"], "contribution-fp": by_fp["test_balanced_accuracy"],
                                 "contribution-ee": by_ee["test_balanced_accuracy"]},
                "roles": roles, "shapley": a["shapley"].tolist(), "fp": a["fp"].tolist(), "ee": a["ee"].tolist(),
            }
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("hospitals", "seed", "seconds", "rho", "flipper_rank", "free_rider_rank",
                                                   "selfish_gain", "test_bal_acc")}), flush=True)
        results.extend(rows)
        print_table(n, rows, args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "results": results}, fh, indent=1)
    return 0


def print_table(n: int, rows: list[dict], args) -> None:
    def mean(path):
        vals = [r for r in path]
        return float(np.nanmean(vals))

    print(f"\n## {n} hospitals, {args.rounds} rounds, model {args.model}, seeds {args.seeds} (mean over seeds)")
    print("| score | Spearman vs multi-round Shapley | mean per-round Spearman | flipper rank (1 = lowest) | free-rider rank | selfish gain |")
    print("|---|---|---|---|---|---|")
    for k in SCORE_NAMES:
        gain = mean([r["selfish_gain"][k] for r in rows]) if k in rows[0]["selfish_gain"] else float("nan")
        print(f"| {k.upper()} | {mean([r['rho'][k] for r in rows]):.3f} | {mean([r['rho_per_round'][k] for r in rows]):.3f} | "
              f"{mean([r['flipper_rank'][k] for r in rows]):.1f} | {mean([r['free_rider_rank'][k] for r in rows]):.1f} | "
              + (f"{gain:+.4f} |" if np.isfinite(gain) else "- |"))
    print(f"| Shapley | 1 | 1 | {mean([r['flipper_rank']['shapley'] for r in rows]):.1f} | "
          f"{mean([r['free_rider_rank']['shapley'] for r in rows]):.1f} | - |")
    print("\n| aggregation | test balanced accuracy |")
    print("|---|---|")
    for k in ("fedavg", "contribution-fp", "contribution-ee"):
        vals = [r["test_bal_acc"][k] for r in rows]
        print(f"| {k} | {np.mean(vals):.4f} ± {np.std(vals):.4f} |")
    print(flush=True)


if __name__ == "__main__":
    sys.exit(main())
