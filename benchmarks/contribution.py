"""Contribution scores against the ground truth: Shapley values from the coalition models.

Simulation, where the individual updates are visible: n hospitals on PneumoniaMNIST
(Dirichlet alpha 0.5) with different data quality (label noise 0 / 20 / 40 %, one
free-rider that returns the global model unchanged, one label flipper), FedAvg. Every
round, the coalition models ``M_S = M0 + sum_{i in S} w_i U_i / sum_{i in S} w_i`` are
evaluated on the validation split: all 2^n of them for exact per-round Shapley up to 10
hospitals, the prefixes of ``--permutations`` random orders for Monte-Carlo Shapley above
(at 10 both, which states the Monte-Carlo error); multi-round Shapley is the sum over rounds.
From the same values come what hospitals would report under secure aggregation (LOO, IOI,
the round gain), hence FP and EE, hospitrust's forms and as published (``fp-published``,
``ee-published``); COS from the actual updates. All utilities use one common validation set
(the MedMNIST val split) for every evaluator, so the comparison with Shapley is on the same v.

It prints, per setting and seed, and as a mean over seeds:
  * Spearman rank correlation of each accumulated score with multi-round Shapley (and the
    mean per-round correlation),
  * the rank (1 = lowest score) of the label flipper and of the free-rider under each score,
  * a selfish hospital's score gain when it inflates its reported LOO and IOI by --selfish
    every round (manipulation resistance: 0 when its reports cannot move its own score),
  * test balanced accuracy of aggregation weighted by each accumulated score (FP, EE, both
    published forms, and Shapley itself as the baseline) against FedAvg, paired by seed.

``--model linear`` (logistic regression on the pixels) makes the coalition evaluations
exact and cheap (logits are linear in the parameters, so a coalition's logits are a weighted
sum of per-hospital logit deltas); ``--model small-cnn`` builds each coalition model.

The table of docs/experiments/2026-12-01-contribution-published.md (about 75 s)::

    python benchmarks/contribution.py --hospitals 5 10 20 --rounds 10 --seeds 0 1 2 3 4 --permutations 1000
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

from hospitrust.config import parse_run_config
from hospitrust.contribution.scores import (
    MAX_EXACT_SHAPLEY_PLAYERS,
    cosine_to_aggregate,
    everybody_else,
    everybody_else_published,
    fair_private,
    fair_private_published,
    shapley_exact,
    shapley_monte_carlo,
    shapley_permutations,
    spearman,
)
from hospitrust.datasets.federation import load_arrays, partitions
from hospitrust.models import build_model
from hospitrust.models.training import seed_everything, to_batch, train

SCORE_NAMES = ("fp", "ee", "fp-published", "ee-published", "loo", "ioi", "cos")
#: scores a hospital's reports feed (its LOO and IOI): the selfish hospital's lie moves these
REPORTED = ("loo", "ioi", "fp", "ee", "fp-published", "ee-published")
WEIGHTINGS = ("fedavg", "fp", "ee", "fp-published", "ee-published", "shapley")
EXACT_UP_TO = 10  # exact Shapley (2^n coalition models a round) up to here, Monte-Carlo above


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
    permutations: int
    dataset: str = "pneumoniamnist"


def scores_from(loo: np.ndarray, ioi: np.ndarray, delta: float) -> dict[str, np.ndarray]:
    """Every report-based score of one round, from one common evaluator's LOO, IOI and gain."""
    sub = loo.shape[0]
    gains = np.full(sub, delta)
    two = sub >= 2  # EE needs the others' reports: with one hospital left in the round it adds nothing
    return {"fp": fair_private(loo, ioi, delta), "fp-published": fair_private_published(loo, ioi, delta),
            "ee": everybody_else(loo, ioi, gains) if two else np.zeros(sub),
            "ee-published": everybody_else_published(loo, ioi, gains) if two else np.zeros(sub),
            "loo": loo, "ioi": ioi}


class RoundGame:
    """One round's coalition game: ``v(S)`` of the model ``M0 + sum_{i in S} w_i U_i / sum w`` on the
    validation set, evaluated for just the coalitions asked for (one batch)."""

    def __init__(self, theta: torch.Tensor, updates: torch.Tensor, weights: np.ndarray, val: Evaluator):
        self.theta, self.updates, self.weights, self.val = theta, updates, weights, val
        self.n = updates.shape[0]
        self.values: dict[int, float] = {}

    def evaluate(self, masks) -> None:
        todo = sorted({int(m) for m in np.asarray(masks).reshape(-1)} - set(self.values))
        if todo:
            vals = self.val(coalition_thetas(self.theta, self.updates, self.weights, todo))
            self.values.update(zip(todo, (float(v) for v in vals)))

    def __getitem__(self, masks) -> np.ndarray:
        masks = np.asarray(masks)
        self.evaluate(masks)
        return np.vectorize(self.values.__getitem__, otypes=[float])(masks) if masks.size else masks.astype(float)

    def marginals(self) -> tuple[np.ndarray, np.ndarray, float]:
        n, full = self.n, (1 << self.n) - 1
        self.evaluate([0, full, *[1 << i for i in range(n)], *[full & ~(1 << i) for i in range(n)]])
        v = self.values
        loo = np.array([v[full] - v[full & ~(1 << i)] for i in range(n)])
        ioi = np.array([v[1 << i] - v[0] for i in range(n)])
        return loo, ioi, v[full] - v[0]

    def shapley_exact(self) -> np.ndarray:
        return shapley_exact(self[np.arange(1 << self.n)])

    def shapley_monte_carlo(self, permutations: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        orders, masks = shapley_permutations(self.n, permutations, seed)
        return shapley_monte_carlo(orders, self[masks])


def run_once(s: Setting, weighting: str, with_shapley: bool) -> dict:
    """One federation; weighting: fedavg, or weights ∝ the clipped positive accumulated score
    (fp, ee, fp-published, ee-published, shapley). ``with_shapley``: the Shapley ground truth every
    round (exact up to EXACT_UP_TO hospitals, Monte-Carlo above, and both at EXACT_UP_TO to state
    the Monte-Carlo error)."""
    cfg = parse_run_config({"seed": s.seed, "dataset": s.dataset, "partitioner": "dirichlet", "dirichlet.alpha": 0.5,
                            "train-subsample": s.train_subsample})
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
    exact = n <= EXACT_UP_TO
    acc = {k: np.zeros(n) for k in (*SCORE_NAMES, "shapley", "shapley-mc", *[f"{k}_selfish" for k in REPORTED])}
    per_round_rho = {k: [] for k in SCORE_NAMES}
    mc_rho, mc_rel_stderr = [], []
    flips = {"fp-published": 0, "ee-published": 0}
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
        # a hospital with weight 0 is not in the round: score the others (the sub-game over players)
        players = [i for i in range(n) if w[i] > 0]
        game = RoundGame(theta, U[players], w[players], val)
        loo, ioi, delta = game.marginals()
        round_scores = scores_from(loo, ioi, delta)
        # the published forms rescale by Delta / (a signed sum): a sum of the other sign flips every score
        # (a zero gain or a zero sum flips nothing: the scores are 0, or Delta is split equally)
        mid = (loo + ioi) / 2
        flips["fp-published"] += int(delta * mid.sum() < 0 and abs(mid.sum()) > 1e-15)
        ee_sum = len(players) * delta - mid.sum()
        flips["ee-published"] += int(len(players) >= 2 and delta * ee_sum < 0 and abs(ee_sum) > 1e-15)
        agg = (torch.from_numpy(w[players]) @ U[players])
        round_scores["cos"] = np.array([cosine_to_aggregate(U[i].numpy(), agg.numpy()) for i in players])
        # the selfish hospital's lie: its LOO and IOI each inflated by s.selfish
        lie = np.zeros(len(players))
        if selfish in players:
            lie[players.index(selfish)] = s.selfish
        lied = scores_from(loo + lie, ioi + lie, delta)
        for k, v in round_scores.items():
            acc[k][players] += v
        for k in REPORTED:
            acc[f"{k}_selfish"][players] += lied[k]
        need_truth = with_shapley or weighting == "shapley"
        if need_truth:
            if exact:
                phi = game.shapley_exact()
                if with_shapley and n == EXACT_UP_TO:  # the Monte-Carlo error, where exact is known
                    mc, err = game.shapley_monte_carlo(s.permutations, s.seed * 1000 + rnd)
                    acc["shapley-mc"][players] += mc
                    mc_rho.append(spearman(mc, phi))
                    mc_rel_stderr.append(float(err.mean() / max(np.abs(phi).mean(), 1e-12)))
            else:
                phi, err = game.shapley_monte_carlo(s.permutations, s.seed * 1000 + rnd)
                acc["shapley-mc"][players] += phi
                mc_rel_stderr.append(float(err.mean() / max(np.abs(phi).mean(), 1e-12)))
            acc["shapley"][players] += phi
            if with_shapley and len(players) == n:
                for k, v in round_scores.items():
                    per_round_rho[k].append(spearman(v, phi))
        theta = theta + torch.from_numpy(w) @ U
    final_ba = float(test(theta[None])[0])
    return {"roles": roles, "acc": {k: v.tolist() for k, v in acc.items()}, "test_balanced_accuracy": final_ba,
            "per_round_rho": {k: float(np.nanmean(v)) if v else float("nan") for k, v in per_round_rho.items()},
            "selfish": selfish, "shapley_kind": "exact" if exact else f"monte-carlo ({s.permutations} orders a round)",
            "mc_vs_exact_rho": float(np.nanmean(mc_rho)) if mc_rho else float("nan"),
            "mc_relative_stderr": float(np.mean(mc_rel_stderr)) if mc_rel_stderr else float("nan"),
            "sign_flipped_rounds": {k: v / s.rounds for k, v in flips.items()}}


def rank_lowest(scores: np.ndarray, i: int) -> int:
    """1 when hospital i has the lowest score."""
    return int(np.argsort(np.argsort(scores))[i]) + 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="pneumoniamnist", help="a MedMNIST dataset of the registry (pneumoniamnist, retinamnist)")
    ap.add_argument("--hospitals", type=int, nargs="+", default=[5, 10])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--model", default="linear", help="linear (exact, fast) or a registry model (small-cnn)")
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--learning-rate", type=float, default=0.01)
    ap.add_argument("--train-subsample", type=float, default=0.5)
    ap.add_argument("--selfish", type=float, default=0.05, help="a selfish hospital's inflation of its LOO and IOI")
    ap.add_argument("--permutations", type=int, default=200,
                    help=f"sampled orders a round for Monte-Carlo Shapley (above {EXACT_UP_TO} hospitals, and at "
                         f"{EXACT_UP_TO} to state its error against exact)")
    ap.add_argument("--weightings", nargs="+", default=list(WEIGHTINGS), choices=WEIGHTINGS,
                    help="aggregations to run besides the scored FedAvg run")
    ap.add_argument("--json", default="", help="also write all results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    for n in args.hospitals:
        if n < 4:
            ap.error(f"--hospitals: the benchmark needs at least 4 hospitals, got {n}")
        if n <= EXACT_UP_TO and n > MAX_EXACT_SHAPLEY_PLAYERS:  # pragma: no cover - EXACT_UP_TO < 16
            ap.error(f"exact Shapley needs at most {MAX_EXACT_SHAPLEY_PLAYERS} hospitals")
    results = []
    for n in args.hospitals:
        rows = []
        for seed in args.seeds:
            s = Setting(n, args.rounds, seed, args.model, args.local_epochs, args.learning_rate, args.train_subsample,
                        args.selfish, args.permutations, args.dataset)
            t0 = time.time()
            base = run_once(s, "fedavg", with_shapley=True)
            weighted = {w: run_once(s, w, with_shapley=False) for w in args.weightings if w != "fedavg"}
            a = {k: np.array(v) for k, v in base["acc"].items()}
            roles = base["roles"]
            flip, free, me = roles.index("flipper"), roles.index("free-rider"), base["selfish"]
            row = {
                "hospitals": n, "seed": seed, "seconds": time.time() - t0, "shapley_kind": base["shapley_kind"],
                "mc_vs_exact_rho": base["mc_vs_exact_rho"], "mc_relative_stderr": base["mc_relative_stderr"],
                "sign_flipped_rounds": base["sign_flipped_rounds"],
                "rho": {k: spearman(a[k], a["shapley"]) for k in SCORE_NAMES},
                "rho_per_round": base["per_round_rho"],
                "flipper_rank": {k: rank_lowest(a[k], flip) for k in (*SCORE_NAMES, "shapley")},
                "free_rider_rank": {k: rank_lowest(a[k], free) for k in (*SCORE_NAMES, "shapley")},
                "selfish_gain": {k: float(a[f"{k}_selfish"][me] - a[k][me]) for k in REPORTED},
                "selfish_honest": {k: float(a[k][me]) for k in REPORTED},
                "test_bal_acc": {"fedavg": base["test_balanced_accuracy"],
                                 **{w: r["test_balanced_accuracy"] for w, r in weighted.items()}},
                "roles": roles, "shapley": a["shapley"].tolist(), **{k: a[k].tolist() for k in SCORE_NAMES},
            }
            if n == EXACT_UP_TO:
                row["rho_mc_accumulated"] = spearman(a["shapley-mc"], a["shapley"])
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("hospitals", "seed", "seconds", "shapley_kind", "rho", "flipper_rank",
                                                   "free_rider_rank", "selfish_gain", "test_bal_acc")}), flush=True)
        results.extend(rows)
        print_table(n, rows, args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "results": results}, fh, indent=1)
    return 0


def _mean_sd(vals) -> str:
    """Mean ± sample standard deviation (ddof 1, as the other tables of benchmarks/), NaN left out."""
    vals = np.asarray(vals, dtype=float)
    vals = vals[np.isfinite(vals)]
    if vals.size == 0:
        return "-"
    return f"{vals.mean():.3f} ± {vals.std(ddof=1) if vals.size > 1 else 0.0:.3f}"


def print_table(n: int, rows: list[dict], args) -> None:
    kind = rows[0]["shapley_kind"]
    print(f"\n## {args.dataset}, {n} hospitals, {args.rounds} rounds, model {args.model}, seeds {args.seeds} "
          f"(mean ± sd over seeds; Shapley: {kind})")
    if "rho_mc_accumulated" in rows[0]:
        print(f"Monte-Carlo Shapley error at n = {n} ({args.permutations} orders a round) against exact: Spearman of the "
              f"accumulated values {_mean_sd([r['rho_mc_accumulated'] for r in rows])}, per round "
              f"{_mean_sd([r['mc_vs_exact_rho'] for r in rows])}; mean standard error / mean |phi| per round "
              f"{_mean_sd([r['mc_relative_stderr'] for r in rows])}")
    elif np.isfinite(rows[0]["mc_relative_stderr"]):
        print(f"Monte-Carlo standard error / mean |phi| per round: {_mean_sd([r['mc_relative_stderr'] for r in rows])}")
    print("Rounds whose published normalizer had the other sign than the round's gain (every score flipped): "
          + ", ".join(f"{k} {_mean_sd([r['sign_flipped_rounds'][k] for r in rows])}" for k in ("fp-published", "ee-published")))
    print("| score | Spearman vs multi-round Shapley | mean per-round Spearman | flipper rank (1 = lowest) | free-rider rank | selfish gain |")
    print("|---|---|---|---|---|---|")
    for k in SCORE_NAMES:
        gain = f"{np.mean([r['selfish_gain'][k] for r in rows]):+.4f} |" if k in rows[0]["selfish_gain"] else "- |"
        print(f"| {k} | {_mean_sd([r['rho'][k] for r in rows])} | {_mean_sd([r['rho_per_round'][k] for r in rows])} | "
              f"{np.mean([r['flipper_rank'][k] for r in rows]):.1f} | {np.mean([r['free_rider_rank'][k] for r in rows]):.1f} | "
              + gain)
    print(f"| Shapley | 1 | 1 | {np.mean([r['flipper_rank']['shapley'] for r in rows]):.1f} | "
          f"{np.mean([r['free_rider_rank']['shapley'] for r in rows]):.1f} | - |")
    print("\n| aggregation | test balanced accuracy | paired difference vs FedAvg |")
    print("|---|---|---|")
    for k in rows[0]["test_bal_acc"]:
        vals = np.array([r["test_bal_acc"][k] for r in rows])
        diff = vals - np.array([r["test_bal_acc"]["fedavg"] for r in rows])
        print(f"| {k} | {_mean_sd(vals)} | {_mean_sd(diff) if k != 'fedavg' else '-'} |")
    print(flush=True)


if __name__ == "__main__":
    sys.exit(main())
