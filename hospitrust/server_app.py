"""Flower ServerApp: validated config -> hospitals -> strategy -> rounds -> results.

The round loop follows ``Strategy.start`` (train, federated evaluation, central
evaluation) and adds what a consortium needs on the record: per-round progress, the
run directory (rounds.jsonl, summary.json, model.pt) and a summary table at the end.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from hospitrust import metrics
from hospitrust.attacks.base import Backdoor, ColludingAttack, LabelFlip
from hospitrust.attacks.metrics import backdoor_success_rate, targeted_flip_success
from hospitrust.security import flagged_hospitals, rare_class_holders, round_detection, run_security
from hospitrust.threat_model import ColludingAdversary, configured_attack, ground_truth
from hospitrust.checkpoint import check_compatible, load_checkpoint, restore_rng_states, save_checkpoint
from hospitrust.config import RunConfig, parse_run_config
from hospitrust.contribution.federation import ContributionTracker
from hospitrust.secure_aggregation import SecureTrainRound
from hospitrust.datasets.federation import load_arrays, reference_set, test_set
from hospitrust.datasets.medmnist_source import DatasetInfo
from hospitrust.models import build_model
from hospitrust.results import RunDirectory, default_run_name
from hospitrust.strategies import HospitrustStrategy, build_strategy
from hospitrust.strategies.base import RoundRecord
from hospitrust.strategies.validation import ReplyLimits
from hospitrust.aggregation import flatten_state
from hospitrust.training import balanced_class_weights, pick_device, predict_proba, seed_everything, train

app = ServerApp()
RUN_DIR_LOCK_TIMEOUT = 300.0  # seconds a resumed run waits for the stopped run's ServerApp to exit


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
            log(WARNING, "Node %d could not describe itself and is left out: %s", nid, reply.error.reason.strip()[-500:])
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
        rows.append(
            {
                "hospital": name,
                "node_id": nid,
                "partition_id": int(info.get("partition-id", -1)),
                "num_partitions": int(info.get("num-partitions", -1)),
                "train": [int(c) for c in info.get("train-class-counts", [])],
                "val": [int(c) for c in info.get("val-class-counts", [])],
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


class CentralEvaluator:
    """The global model on the server's test split: the clinical metrics and, under a
    backdoor or a targeted label flip, the attack success rate."""

    def __init__(self, cfg: RunConfig, info: DatasetInfo, device: torch.device, attack=None) -> None:
        self.cfg, self.info, self.device = cfg, info, device
        self.test = test_set(cfg)
        self.model = build_model(cfg.model, info.in_channels, info.num_classes, cfg.image_size)
        inner = getattr(attack, "attack", attack)  # unwrap a schedule
        self.backdoor = inner if isinstance(inner, Backdoor) else None
        self.targeted_flip = inner if isinstance(inner, LabelFlip) and inner.mode == "source-to-target" else None
        self.triggered = self.backdoor.trigger(self.test.images) if self.backdoor is not None else None
        self.rare_classes: list[int] = []  # set from the federation's class counts

    def __call__(self, arrays: ArrayRecord) -> dict[str, Any]:
        self.model.load_state_dict(arrays.to_torch_state_dict(), strict=True)
        probs = predict_proba(self.model, self.test.images, device=self.device)
        report = metrics.classification_report(self.test.labels, probs, self.info.num_classes)
        if self.rare_classes:
            report["rare_class_macro_f1"] = metrics.rare_class_macro_f1(self.test.labels, probs.argmax(axis=1),
                                                                        self.rare_classes)
        if self.backdoor is not None:
            pred = predict_proba(self.model, self.triggered, device=self.device).argmax(axis=1)
            report["attack_success_rate"] = backdoor_success_rate(pred, self.test.labels, self.backdoor.target)
        elif self.targeted_flip is not None:
            report["attack_success_rate"] = targeted_flip_success(
                probs.argmax(axis=1), self.test.labels, self.targeted_flip.source, self.targeted_flip.target
            )
        return report


class ReferenceCohortTrainer:
    """FLTrust's root update: the global model trained one local epoch on the server's
    reference cohort, with the hospitals' optimizer settings."""

    def __init__(self, cfg: RunConfig, info: DatasetInfo, device: torch.device) -> None:
        self.cfg, self.info, self.device = cfg, info, device
        self.cohort = reference_set(cfg)
        self.model = build_model(cfg.model, info.in_channels, info.num_classes, cfg.image_size)

    def __call__(self, global_state: dict[str, torch.Tensor], server_round: int) -> torch.Tensor:
        seed_everything(self.cfg.seed, 10_000_019, server_round)
        self.model.load_state_dict(global_state, strict=True)
        train(self.model, self.cohort.images, self.cohort.labels, epochs=1, batch_size=self.cfg.batch_size,
              learning_rate=self.cfg.learning_rate, optimizer=self.cfg.optimizer, momentum=self.cfg.momentum,
              weight_decay=self.cfg.weight_decay, device=self.device,
              class_weights=(balanced_class_weights(self.cohort.labels, self.info.num_classes)
                             if self.cfg.class_weighted_loss else None))
        trained = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        return flatten_state(trained)[0] - flatten_state(global_state)[0]


class ReferenceCohortJudge:
    """The server's reference cohort as a judge of hospitals' updates (HTA's v, FedAgain's
    server benchmark, EARN's row audit): balanced accuracy of candidate models
    (global + u_h), and the global model's inputs to its last linear layer."""

    def __init__(self, cfg: RunConfig, info: DatasetInfo, device: torch.device) -> None:
        self.cfg, self.info, self.device = cfg, info, device
        self.cohort = reference_set(cfg)
        self.model = build_model(cfg.model, info.in_channels, info.num_classes, cfg.image_size)
        self.head = [m for m in self.model.modules() if isinstance(m, torch.nn.Linear)][-1]

    def score_candidates(self, global_state: dict[str, torch.Tensor], updates: torch.Tensor) -> torch.Tensor:
        """(n,) balanced accuracy on the reference cohort of each candidate global + updates[i]."""
        _, cands, labels = self.candidate_logits(global_state, updates)
        return torch.tensor([metrics.balanced_accuracy(labels.numpy(), c.argmax(dim=1).numpy()) for c in cands],
                            dtype=torch.float64)

    __call__ = score_candidates

    @torch.no_grad()
    def candidate_logits(self, global_state: dict[str, torch.Tensor], updates: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits on the cohort of the global model ((m, C)) and of each candidate global +
        updates[i] ((n, m, C)), and the labels ((m,))."""
        from hospitrust.aggregation import unflatten_state
        from hospitrust.training import to_batch

        global_vec, spec = flatten_state(global_state)
        batch = to_batch(self.cohort.images, self.device)  # the cohort is small: one batch

        def logits(state) -> torch.Tensor:
            self.model.load_state_dict(state, strict=True)
            self.model.to(self.device).eval()
            return self.model(batch).double().cpu()

        base = logits(global_state)
        cands = torch.stack([logits(unflatten_state(global_vec + u.detach().cpu().to(global_vec.dtype), spec, global_state))
                             for u in updates])
        return base, cands, torch.as_tensor(np.asarray(self.cohort.labels).reshape(-1), dtype=torch.long)

    @torch.no_grad()
    def head_features(self, global_state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The global model's inputs to its last linear layer on the cohort ((m, H)), and the labels ((m,))."""
        self.model.load_state_dict(global_state, strict=True)
        seen: list[torch.Tensor] = []
        hook = self.head.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].detach().float().cpu()))
        try:
            predict_proba(self.model, self.cohort.images, device=self.device)
        finally:
            hook.remove()
        return torch.cat(seen), torch.as_tensor(np.asarray(self.cohort.labels).reshape(-1), dtype=torch.long)


def strategy_from_config(cfg: RunConfig, hospitals: Mapping[int, str], device: torch.device) -> HospitrustStrategy:
    train_config = {
        "local-epochs": cfg.local_epochs,
        "batch-size": cfg.batch_size,
        "learning-rate": cfg.learning_rate,
    }
    kwargs: dict[str, Any] = dict(
        train_config=train_config,
        fraction_train=cfg.fraction_train,
        min_hospitals=cfg.min_hospitals,
        limits=ReplyLimits(max_update_norm=cfg.max_update_norm, max_num_examples=cfg.max_num_examples),
        seed=cfg.seed,
        device=device,
    )
    # each rule's own settings
    if cfg.strategy == "fedprox":
        kwargs["proximal_mu"] = cfg.proximal_mu
    if cfg.strategy in ("trimmed-mean", "krum", "multi-krum", "bulyan"):
        kwargs["assumed_malicious"] = cfg.assumed_malicious
    if cfg.strategy == "multi-krum":
        kwargs["multi_krum_m"] = cfg.multi_krum_m
    if cfg.strategy == "centered-clipping":
        kwargs.update(clipping_tau=cfg.clipping_tau, clipping_iters=cfg.clipping_iters)
    info = DatasetInfo.of(cfg.dataset)
    if cfg.strategy == "fltrust":
        kwargs["server_update"] = ReferenceCohortTrainer(cfg, info, device)
    if cfg.strategy == "contribution":
        kwargs["contribution_score"] = cfg.contribution_score
    # trust rules: every run config field named after the rule (fedagain_*, hta_*, earn_*) is its option
    fields = cfg.model_dump(exclude={"attacks"})
    if cfg.strategy in ("fedagain", "hta", "earn"):
        prefix = cfg.strategy + "_"
        kwargs.update({k: v for k, v in fields.items() if k.startswith(prefix)})
    if cfg.strategy == "earn" and cfg.earn_base == "hta":  # EARN's base rule takes HTA's own options
        kwargs["hta_options"] = {k: v for k, v in fields.items() if k.startswith("hta_")}
    needs_scores = (cfg.strategy == "fedagain" and cfg.fedagain_benchmark == "server") or (
        cfg.hta_c > 0 and (cfg.strategy == "hta" or (cfg.strategy == "earn" and cfg.earn_base == "hta"))
    )
    needs_audit = cfg.strategy == "earn" and cfg.earn_audit
    judge = ReferenceCohortJudge(cfg, info, device) if needs_scores or needs_audit else None  # one cohort load
    if needs_scores:
        kwargs["candidate_scores"] = judge.score_candidates
    if needs_audit:
        kwargs["head_features"], kwargs["candidate_logits"] = judge.head_features, judge.candidate_logits
    strategy = build_strategy(cfg.strategy, hospitals, **kwargs)
    if strategy.required_replies() > len(hospitals):
        log(WARNING, "%s with assumed-malicious %d needs %d valid replies per round but there are only %d "
            "hospitals: every round will keep the previous model", cfg.strategy, cfg.assumed_malicious,
            strategy.required_replies(), len(hospitals))
    return strategy


def _progress_line(rnd: int, total: int, central: Mapping[str, Any], valid: int, asked: int, seconds: float) -> str:
    return (
        f"round {rnd:>3}/{total}  bal-acc {central['balanced_accuracy']:.4f}  auc {central['auc']:.4f}  "
        f"acc {central['accuracy']:.4f}  worst-recall {central['worst_class_recall']:.4f}  "
        f"valid {valid}/{asked}  {seconds:.1f}s"
    )


def format_summary_table(history: list[dict[str, Any]]) -> str:
    head = f"{'round':>5} {'accuracy':>9} {'bal-acc':>8} {'auc':>7} {'macro-f1':>9} {'worst-rec':>9} {'seconds':>8}"
    lines = [head, "-" * len(head)]
    for rec in history:
        c = rec["central"]
        lines.append(
            f"{rec['round']:>5} {c['accuracy']:>9.4f} {c['balanced_accuracy']:>8.4f} {c['auc']:>7.4f} "
            f"{c['macro_f1']:>9.4f} {c['worst_class_recall']:>9.4f} {rec['round_seconds']:>8.1f}"
        )
    return "\n".join(lines)


def participation(history: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per hospital, over the run's rounds: asked, answered with a valid update, rejected, asked
    but silent (missing), and listed offline at the SuperLink (not asked)."""
    out: dict[str, dict[str, int]] = {}

    def row(name: str) -> dict[str, int]:
        return out.setdefault(name, {"asked": 0, "valid": 0, "rejected": 0, "missing": 0, "offline": 0})

    for rec in history:
        for c in rec["clients"]:
            r = row(c["hospital"])
            r["asked"] += 1
            r["rejected" if c.get("rejected") else "valid"] += 1
        for name in rec.get("missing", []):
            row(name)["asked"] += 1
            row(name)["missing"] += 1
        for name in rec.get("offline", []):
            row(name)["offline"] += 1
    return dict(sorted(out.items()))


def absences(parts: dict[str, dict[str, int]], rounds: int) -> str:
    """One line per hospital that missed rounds, for the end-of-run log ('' if none did)."""
    lines = [f"{name}: valid in {p['valid']} of {rounds} rounds ({p['rejected']} rejected, {p['missing']} silent, "
             f"{p['offline']} offline)" for name, p in parts.items() if p["valid"] < rounds]
    return "\n".join(lines)


def near_duplicates(history: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per hospital whose update a rule counted together with another's (HTA's
    ``duplicates_of``): in how many rounds, and with whom. Empty when none was."""
    out: dict[str, dict[str, Any]] = {}
    for rec in history:
        for c in rec["clients"]:
            if others := c.get("duplicates_of"):
                entry = out.setdefault(c["hospital"], {"rounds": 0, "with": set()})
                entry["rounds"] += 1
                entry["with"].update(others)
    return {name: {"rounds": e["rounds"], "with": sorted(e["with"])} for name, e in sorted(out.items())}


def summary_head(cfg: RunConfig, history: list[dict[str, Any]], num_hospitals: int, run_dir: RunDirectory,
                 started: float) -> dict[str, Any]:
    """The summary.json fields every run has (the final and best round, what ran, where)."""
    best = max(history, key=lambda r: (r["central"]["balanced_accuracy"], -r["round"]))
    return {
        "final": history[-1]["central"],
        "best_round": best["round"],
        "best": best["central"],
        "rounds": len(history),
        "wall_seconds": time.time() - started,
        "dataset": cfg.dataset,
        "strategy": cfg.strategy,
        "model": cfg.model,
        "hospitals": num_hospitals,
        "run_dir": str(run_dir.path),
        "attack": cfg.attacks.attack,
        "participation": participation(history),
        "near_duplicates": near_duplicates(history),
    }


class FederationFailure(RuntimeError):
    """Every hospital's ClientApp failed: a broken app or setup, not one bad hospital."""


def _fail_if_every_hospital_crashed(rnd: int, clients: list[dict[str, Any]], asked: int) -> None:
    crashed = [c for c in clients if c.get("rejected") and str(c.get("reason", "")).startswith("error reply")]
    if asked and len(crashed) == asked:
        raise FederationFailure(
            f"round {rnd}: the ClientApp failed at every hospital ({asked}); first error: {crashed[0]['reason']}"
        )


def offline_hospitals(rnd: int, grid: Grid, hospitals: dict[int, str]) -> list[str]:
    """Hospitals known from the query round that the SuperLink lists as offline now: they are not
    asked this round (no heartbeat within Flower's patience, 2 x 30 s), which the round record says."""
    online = set(grid.get_node_ids())
    offline = sorted(name for nid, name in hospitals.items() if nid not in online)
    if offline:
        log(WARNING, "round %d: %s offline at the SuperLink (no recent heartbeat): not asked this round",
            rnd, ", ".join(offline))
    return offline


def run_federation(grid: Grid, context: Context) -> RunDirectory:
    """The whole run; returns its directory. Raises on bad config or missing data before any round."""
    started = time.time()
    cfg = parse_run_config(context.run_config)
    if cfg.strategy == "fbd":  # block ownership keeps a warehouse of colors, not one global model
        from hospitrust.fbd.server import run_fbd_federation

        return run_fbd_federation(grid, context)
    info = DatasetInfo.of(cfg.dataset)
    load_arrays(cfg)  # a missing dataset fails here, before any hospital is contacted
    seed_everything(cfg.seed)
    device = pick_device()

    resume = load_checkpoint(cfg.resume_from) if cfg.resume_from else None
    if resume is not None:  # the run goes on in its own directory
        check_compatible(resume["config"], cfg.to_flat())
        run_dir = RunDirectory(resume["path"].parent)
        log(INFO, "hospitrust: resuming %s after round %d", run_dir.path, resume["round"])
    else:
        run_dir = RunDirectory.create(cfg.output_dir, cfg.run_name or default_run_name(cfg.dataset, cfg.strategy))
        log(INFO, "hospitrust: run directory %s", run_dir.path)
    # one ServerApp writes a run directory at a time: a stopped run's ServerApp may still be
    # finishing its round when the resumed one starts
    with run_dir.exclusive(timeout=RUN_DIR_LOCK_TIMEOUT):
        return _federate(grid, cfg, info, device, run_dir, resume, started)


def _federate(grid: Grid, cfg: RunConfig, info: DatasetInfo, device: torch.device, run_dir: RunDirectory,
              resume: dict[str, Any] | None, started: float) -> RunDirectory:
    hospitals, rows = discover_hospitals(grid, cfg)
    log(INFO, "hospitrust: %d hospitals, %s, partitioner %s\n%s", len(hospitals), cfg.dataset, cfg.partitioner,
        format_class_counts(rows, info.class_names))
    run_dir.write_class_counts(info.class_names, rows)
    run_dir.write_config(
        {
            **cfg.to_flat(),
            "data-dir-resolved": str(cfg.resolved_data_dir() or ""),
            "hospitals": {str(nid): name for nid, name in hospitals.items()},
            "class-names": list(info.class_names),
            "server-device": str(device),
            "reference-cohort-size": len(reference_set(cfg)),
        }
    )

    # the threat model (simulation ground truth; all honest when no attack is configured)
    attack = configured_attack(cfg)
    partition_of = {r["hospital"]: r["partition_id"] for r in rows}
    num_partitions = max([r.get("num_partitions", -1) for r in rows] + [len(rows)])
    truth = ground_truth(cfg, partition_of, num_partitions)
    rare_class, rare_holders = rare_class_holders(rows)
    if attack is not None:
        log(INFO, "hospitrust: attack %s by %s", attack, sorted(h for h, bad in truth.items() if bad) or "nobody")

    model = build_model(cfg.model, info.in_channels, info.num_classes, cfg.image_size)
    arrays = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
    strategy = strategy_from_config(cfg, hospitals, device)
    if cfg.class_weighted_loss and cfg.class_weights_from == "federation":
        # every hospital weighs its classes by the federation's totals from the query round
        strategy.train_config["federation-class-counts"] = [float(c) for c in np.sum([r["train"] for r in rows], axis=0)]
    if isinstance(attack, ColludingAttack):
        strategy.adversary = ColludingAdversary(attack, {h for h, bad in truth.items() if bad}, cfg.seed)
    strategy.summary()
    evaluator = CentralEvaluator(cfg, info, device, attack)
    evaluator.rare_classes = metrics.rare_classes(np.sum([r["train"] for r in rows], axis=0))

    history: list[dict[str, Any]] = []
    flags_per_round: list[dict[str, bool]] = []
    resumed_at: list[int] = []
    if resume is None:
        initial = evaluator(arrays)
        log(INFO, "round   0 (initial model)  bal-acc %.4f  auc %.4f", initial["balanced_accuracy"], initial["auc"])
    else:
        arrays = ArrayRecord(resume["model"])
        strategy.load_state_dict(resume["strategy_state"])
        history, flags_per_round = list(resume["history"]), list(resume["flags_per_round"])
        resumed_at = [*resume.get("resumed_at", []), resume["round"]]
        run_dir.rewrite_rounds(history)  # rounds after the checkpoint (a crash mid-round) are dropped
        restore_rng_states(resume["rng"])
    train_config, evaluate_config = ConfigRecord(), ConfigRecord()
    # contribution scores from hospitals' reported scalars; SecAgg+ hands the server the sum only
    contribution = ContributionTracker(hospitals) if cfg.contribution_scoring else None
    if contribution is not None:
        contribution.restore(history)  # a resumed run keeps its earlier rounds' scores
    secure = (SecureTrainRound(cfg, hospitals, strategy.train_config, train_sizes=[sum(r["train"]) for r in rows])
              if cfg.secure_aggregation else None)
    for rnd in range(len(history) + 1, cfg.num_server_rounds + 1):
        round_start = time.perf_counter()
        offline = offline_hospitals(rnd, grid, strategy.hospitals)
        if secure is None:
            messages = list(strategy.configure_train(rnd, arrays, train_config, grid))
            replies = list(grid.send_and_receive(messages, timeout=cfg.reply_timeout))
            new_arrays, _ = strategy.aggregate_train(rnd, replies)
            asked = [m.metadata.dst_node_id for m in messages]
        else:
            new_arrays, asked = secure(grid, rnd, arrays, strategy.records.setdefault(rnd, RoundRecord()))
        _fail_if_every_hospital_crashed(rnd, strategy.records[rnd].clients, len(asked))
        if new_arrays is not None:
            arrays = new_arrays
        eval_messages = list(strategy.configure_evaluate(rnd, arrays, evaluate_config, grid))
        if contribution is not None:
            eval_messages = contribution.ask(rnd, strategy.records[rnd], eval_messages)
        eval_replies = list(grid.send_and_receive(eval_messages, timeout=cfg.reply_timeout))
        strategy.aggregate_evaluate(rnd, eval_replies)
        central = evaluator(arrays)
        record = strategy.records[rnd]
        answered = {c["node_id"] for c in record.clients}
        missing = [strategy.hospitals[nid] for nid in asked if nid not in answered]
        per_hospital = {h: v["accuracy"] for h, v in record.evaluation.items()}
        for c in record.clients:
            c["malicious"] = truth.get(c["hospital"], False)
        flags = flagged_hospitals(record.clients)
        flags_per_round.append(flags)
        round_record = {
            "round": rnd,
            "central": central,
            "clients": record.clients,
            "aggregation_seconds": record.aggregation_seconds,
            "round_seconds": time.perf_counter() - round_start,
            "asked": len(asked),
            "missing": missing,
            "offline": offline,
            "kept_previous_model": record.kept_previous_model,
            "note": record.note,
            "hospital_accuracy": per_hospital,
            "fairness": metrics.fairness(per_hospital) if per_hospital else None,
            "detection": round_detection(flags, truth),
        }
        if contribution is not None:
            round_record["contribution"] = contribution.score(rnd, eval_replies, strategy)
        run_dir.append_round(round_record)
        history.append(round_record)
        valid = sum(1 for c in record.clients if not c.get("rejected"))
        log(INFO, "%s", _progress_line(rnd, cfg.num_server_rounds, central, valid, len(asked), round_record["round_seconds"]))
        if cfg.checkpoint:
            save_checkpoint(run_dir.path, round=rnd, model_state=arrays.to_torch_state_dict(),
                            strategy_name=cfg.strategy, strategy_state=strategy.state_dict(), config=cfg.to_flat(),
                            history=history, flags_per_round=flags_per_round, resumed_at=resumed_at)

    final_state = arrays.to_torch_state_dict()
    run_dir.save_model(final_state)
    summary = {
        **summary_head(cfg, history, len(hospitals), run_dir, started),
        "fairness": history[-1]["fairness"],
        "malicious_hospitals": sorted(h for h, bad in truth.items() if bad),
        "rare_class": rare_class,
        "rare_classes": evaluator.rare_classes,
        "security": run_security(flags_per_round, truth, rare_holders),
        "resumed_at": resumed_at,
    }
    if contribution is not None:
        summary["contribution"] = contribution.summary()
        contribution.write(run_dir.path)
    run_dir.write_summary(summary)
    if cfg.strategy not in ("fedavg", "fedprox"):  # rules that weigh hospitals: draw whose update counted
        try:
            from hospitrust.trust_plot import plot_trust

            plot_trust(run_dir.path)
        except Exception as exc:  # a picture never fails a finished run
            log(WARNING, "hospitrust: trust plot not drawn: %s", exc)
    final = summary["final"]
    if missed := absences(summary["participation"], len(history)):
        log(WARNING, "hospitrust: hospitals without a valid update in every round:\n%s", missed)
    if copies := summary.get("near_duplicates"):
        log(WARNING, "hospitrust: hospitals that sent another hospital's update (counted as one voice, flagged):\n%s",
            "\n".join(f"{name}: {e['rounds']} of {len(history)} rounds, with {', '.join(e['with'])}"
                      for name, e in copies.items()))
    log(INFO, "hospitrust: finished %d rounds in %.1f s\n%s\nfinal: accuracy %.4f  balanced accuracy %.4f  AUC %.4f  "
        "worst-class recall %.4f  (best round %d)\nresults: %s",
        len(history), summary["wall_seconds"], format_summary_table(history), final["accuracy"],
        final["balanced_accuracy"], final["auc"], final["worst_class_recall"], summary["best_round"], run_dir.path)
    return run_dir


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_federation(grid, context)
