"""The server's side of differential privacy: the checks before the first round, and what lands
on the record (each hospital's (epsilon, delta) after every round in rounds.jsonl, the final
values in summary.json, the accountants and their settings in config.json).

The local epsilon is what each hospital's own accountant reports (Opacus's RDP accountant, on
its machine): the server records it and cannot verify it; the central epsilon is the server's
(Flower's RdpAccountant).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hospitrust.errors import ConfigError
from hospitrust.privacy.options import PrivacyOptions
from hospitrust.records import HospitalRecord, RoundRecord


def check_before_training(options: PrivacyOptions, model: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    """ConfigError, before any round, when a hospital's training set makes delta meaningless or
    when Opacus cannot train the task's model (``rows``: the query round's class counts).
    """
    if options.mode == "off":
        return
    problems = []
    for r in rows:
        n = int(sum(r.get("train", [])))
        if n and not options.delta < 1.0 / n:
            problems.append(f"  - privacy.delta = {options.delta:g}: not below 1 / (training-set size) = 1 / {n} at "
                            f"hospital {r['hospital']!r} ({1.0 / n:.3g}); with delta that large the guarantee allows one "
                            "patient's record to leak outright: lower privacy.delta")
    if options.local or options.central:
        from opacus.validators import ModuleValidator

        errors = ModuleValidator.validate(model.train(), strict=False)
        if errors:
            problems.append(f"  - model: Opacus cannot train {type(model).__name__} with per-sample gradients "
                            f"({errors[0]}); a BatchNorm model: use model 'resnet18-gn'")
    if problems:
        raise ConfigError("invalid run config for differential privacy:\n" + "\n".join(problems))


def settings(options: PrivacyOptions, central: Any | None) -> dict[str, Any]:
    """config.json's ``privacy`` entry: the mode, the accountants and their settings."""
    from hospitrust.privacy.local import ACCOUNTANT_DESCRIPTION, rdp_orders

    out: dict[str, Any] = {"mode": options.mode, "delta": options.delta}
    if options.local:
        out["local"] = {"accountant": ACCOUNTANT_DESCRIPTION, "orders": rdp_orders(), "sampling": "poisson",
                        "target_epsilon": options.target_epsilon, "noise_multiplier": options.noise_multiplier or
                        "calibrated per hospital for target-epsilon over num-server-rounds",
                        "max_grad_norm": options.max_grad_norm, "library": _version("opacus")}
    if central is not None:
        out["central"] = {**central.settings(), "library": _version("flwr")}
    return out


def _version(package: str) -> str:
    from importlib.metadata import version

    return f"{package} {version(package)}"


class PrivacyRecords:
    """Each hospital's latest (epsilon, delta), carried from round to round."""

    def __init__(self, options: PrivacyOptions, hospitals: Sequence[str]) -> None:
        self.options = options
        self.hospitals: dict[str, dict[str, Any]] = {
            h: {"epsilon": 0.0, "delta": options.delta, "rounds_trained": 0, "budget_spent": False} for h in sorted(hospitals)}

    def restore(self, history: Sequence[RoundRecord]) -> None:
        for rec in history:
            for name, entry in ((rec.entries.get("privacy") or {}).get("hospitals") or {}).items():
                self.hospitals[name] = dict(entry)

    def round_entry(self, clients: Sequence[HospitalRecord], budget_spent: Sequence[Mapping[str, Any]],
                    central: Any | None, server_round: int) -> dict[str, Any]:
        """rounds.jsonl's ``privacy``: every hospital's (epsilon, delta) after this round, who ran out, central."""
        for c in clients:
            p = c.privacy
            if p and not c.rejected:
                h = self.hospitals.setdefault(c.hospital, {"rounds_trained": 0, "budget_spent": False})
                h.update({k: p[k] for k in ("epsilon", "delta", "lifetime_epsilon", "max_epsilon") if k in p})
                h["rounds_trained"] = int(h.get("rounds_trained", 0)) + 1
        for b in budget_spent:
            h = self.hospitals.setdefault(b["hospital"], {"epsilon": 0.0, "delta": self.options.delta, "rounds_trained": 0})
            h.update({"budget_spent": True, "budget_spent_round": int(h.get("budget_spent_round") or server_round),
                      "reason": b.get("reason", "")})
            for k in ("lifetime_epsilon", "max_epsilon"):
                if k in b:
                    h[k] = b[k]
        out: dict[str, Any] = {"mode": self.options.mode, "hospitals": {k: dict(v) for k, v in self.hospitals.items()},
                               "budget_spent": sorted(b["hospital"] for b in budget_spent)}
        if central is not None:
            out["central"] = central.round_record(server_round)
        return out

    def summary(self, central: Any | None) -> dict[str, Any]:
        """summary.json's ``privacy``: the final values."""
        out: dict[str, Any] = {"mode": self.options.mode, "delta": self.options.delta,
                               "hospitals": {k: dict(v) for k, v in self.hospitals.items()},
                               "budget_spent": sorted(h for h, v in self.hospitals.items() if v.get("budget_spent"))}
        if self.options.local:
            eps = [v["epsilon"] for v in self.hospitals.values() if v.get("rounds_trained")]
            out["max_local_epsilon"] = max(eps) if eps else 0.0
        if central is not None:
            out["central"] = central.spent()
        return out


__all__ = ["PrivacyRecords", "check_before_training", "settings"]
