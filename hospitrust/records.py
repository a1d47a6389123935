"""What a round decided, as one typed and versioned contract: :class:`HospitalRecord` per hospital,
:class:`RoundRecord` per round (a line of a run's ``rounds.jsonl``).

The strategy builds the hospital records (one per reply, accepted or rejected); a rule's
per-hospital signals and a round feature's go into ``signals``, each under its own name; the
loop writes the round's line with :meth:`RoundRecord.to_json`. The console, the plots, the
benchmark store and report, and the terminal story read the lines back with
:meth:`RoundRecord.from_json`, whichever schema wrote them.

Schemas
-------
1
    hospitrust before the records were typed (no ``schema`` key): each client entry a flat
    dict, the rule's signals and the features' entries beside the common fields.
2 (:data:`SCHEMA_VERSION`)
    ``schema`` on every line; a client entry has the common fields under the names schema 1
    gave them and ``signals``: source (the rule's name, a feature's name) -> its values.

Only plain Python types go in and come out; the run directory's writer turns NaN into null
(JSON has no NaN) and :meth:`HospitalRecord.from_json` turns a null loss back into NaN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The schema :meth:`RoundRecord.to_json` writes (the ``schema`` key of a rounds.jsonl line).
SCHEMA_VERSION = 2

#: Where :meth:`HospitalRecord.from_json` puts the values of an entry that does not say whose
#: they are: a schema 1 entry's rule signals (the line does not name the rule that wrote them).
UNNAMED_SOURCE = "rule"

#: Schema 1 entries that a round feature wrote beside the common fields: key -> (source, whether the
#: value is the source's whole signals dict, else the one value under the same key).
_V1_FEATURE_KEYS: dict[str, tuple[str, bool]] = {
    "pre_aggregation": ("pre-aggregation", True),
    "secure_aggregation": ("secagg", False),
}

#: Reply metrics of local differential privacy -> their names in a record's ``privacy``.
PRIVACY_METRICS = {"privacy-epsilon": "epsilon", "privacy-delta": "delta", "privacy-lifetime-epsilon": "lifetime_epsilon",
                   "privacy-max-epsilon": "max_epsilon", "privacy-noise-multiplier": "noise_multiplier",
                   "privacy-sample-rate": "sample_rate", "privacy-steps": "steps", "privacy-next-epsilon": "next_epsilon"}

# the common fields always written, in the order schema 1 wrote them
_ALWAYS = ("hospital", "node_id", "num_examples", "weight", "train_loss", "benchmark_error", "selected", "rejected", "reason")
# the common fields written only where a run has them
_WHERE_KNOWN = ("timing", "privacy", "update_norm", "trust", "flagged", "malicious")
_FIELDS = frozenset((*_ALWAYS, *_WHERE_KNOWN, "signals"))


def _number(value: Any) -> float:
    """A float from a JSON value; null (NaN written by the run directory) -> NaN."""
    return math.nan if value is None else float(value)


def mean_of_signal(value: Any) -> float | None:
    """A trust signal's value as one number: itself, or the mean of a per-class mapping's values (EARN's);
    None where it has none.
    """
    if isinstance(value, Mapping):
        values = [float(v) for v in value.values() if v is not None]
        return sum(values) / len(values) if values else None
    return None if value is None else float(value)


#: The signals a line written before rules named theirs (no ``trust_signal`` key) held its rule's trust in, in the
#: order the readers of then took them (HTA's and EARN's base's reputation, FLTrust's and FedAgain's trust, EARN's)
_LEGACY_TRUST_SIGNALS = ("reputation", "trust", "earn_trust")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class HospitalRecord:
    """What a round decided about one hospital's reply.

    Parameters
    ----------
    hospital : str
        The hospital's name.
    node_id : int
        Its Flower node id (-1 where a line did not record it).
    num_examples : int
        The example count its reply reported (0 for a rejected reply).
    weight : float
        Its share in the aggregate (0 when left out or rejected).
    selected : bool
        Whether its update took part in the aggregate.
    rejected : bool
        Whether its reply failed the checks (``reason`` says why).
    reason : str
        Why the reply was rejected ('' otherwise).
    train_loss : float
        The training loss it reported (NaN where none).
    benchmark_error : float
        The benchmark error it reported (NaN where none).
    update_norm : float or None
        L2 norm of its update as the rule saw it (after any pre-aggregation); None where the
        server never saw the update (rejected, SecAgg+, a round kept).
    trust : float or None
        The rule's trust in it, where the rule gives one (FLTrust, FedAgain).
    flagged : bool or None
        Whether the rule itself flagged it, where the rule says (trust rules flag the hospitals
        they down-weight); None: the rule does not flag.
    malicious : bool or None
        The simulation's ground truth (the detection feature sets it); None where not known.
    timing : dict[str, float]
        Where the hospital's time went (its reply's ``timing-*`` metrics).
    privacy : dict[str, float] or None
        Local differential privacy: what the hospital's own accountant reports (``PRIVACY_METRICS``).
    signals : dict[str, dict[str, Any]]
        Source (the rule's name, a round feature's name) -> its values for this hospital.
    """

    hospital: str
    node_id: int = -1
    num_examples: int = 0
    weight: float = 0.0
    selected: bool = False
    rejected: bool = False
    reason: str = ""
    train_loss: float = math.nan
    benchmark_error: float = math.nan
    update_norm: float | None = None
    trust: float | None = None
    flagged: bool | None = None
    malicious: bool | None = None
    timing: dict[str, float] = field(default_factory=dict)
    privacy: dict[str, float] | None = None
    signals: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_reply(cls, hospital: str, node_id: int, num_examples: int = 0, metrics: Mapping[str, Any] | None = None,
                   **fields: Any) -> HospitalRecord:
        """The record of a reply: its example count, and what its metrics say (train loss, benchmark
        error, timing, local DP); ``fields`` set the rest (weight, selected, rejected, reason, ...).

        Parameters
        ----------
        hospital : str
            The hospital's name.
        node_id : int
            Its node id.
        num_examples : int
            The example count the reply reported (0 for a rejected reply).
        metrics : Mapping, optional
            The reply's metrics (none for a rejected reply).
        **fields
            Other fields of the record.

        Returns
        -------
        HospitalRecord
            The record.
        """
        metrics = metrics or {}
        timing = {k[len("timing-"):]: float(v) for k, v in metrics.items() if k.startswith("timing-")}
        privacy = None
        if "privacy-epsilon" in metrics:  # local DP: what the hospital says it spent (its own accountant)
            privacy = {name: float(metrics[key]) for key, name in PRIVACY_METRICS.items() if _is_number(metrics.get(key))}
        return cls(hospital=hospital, node_id=int(node_id), num_examples=int(num_examples),
                   train_loss=float(metrics.get("train-loss", math.nan)),
                   benchmark_error=float(metrics.get("benchmark-error", math.nan)),
                   timing=timing, privacy=privacy, **fields)

    # ---- what rules and features add ----------------------------------------------------
    def add_signals(self, source: str, values: Mapping[str, Any]) -> None:
        """Record ``values`` under ``source`` (the rule's or a feature's name), beside what it recorded before.

        Parameters
        ----------
        source : str
            Who recorded them.
        values : Mapping[str, Any]
            Signal name -> value for this hospital.
        """
        if not source:
            raise ValueError("signals need the name of the rule or feature that recorded them")
        self.signals.setdefault(source, {}).update(values)

    def exclude(self, reason: str, by: str) -> None:
        """Leave this hospital out of the aggregate (weight 0, not selected), and say who did and why.

        Parameters
        ----------
        reason : str
            Why it was left out (recorded as ``by``'s ``exclusion_reason``).
        by : str
            The feature (or rule) that left it out.
        """
        self.selected, self.weight = False, 0.0
        self.add_signals(by, {"excluded": True, "exclusion_reason": reason})

    # ---- what readers ask ----------------------------------------------------------------
    def signal(self, name: str, default: Any = None) -> Any:
        """The first source's value of signal ``name`` (the rule's come first), else ``default``.

        Parameters
        ----------
        name : str
            The signal's name (``reputation``, ``krum_score``, ``exclusion_reason``, ...).
        default : Any
            What to return when no source recorded it.

        Returns
        -------
        Any
            The value.
        """
        for values in self.signals.values():
            if name in values:
                return values[name]
        return default

    @property
    def excluded(self) -> bool:
        """A valid reply the rule (or a feature) left out of the aggregate."""
        return not self.rejected and not self.selected

    def exclusion_reason(self) -> str:
        """Why the hospital was left out, as the rule or feature that left it out says ('' if none said)."""
        return str(self.signal("exclusion_reason") or "")

    # ---- JSON ------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The entry in a rounds.jsonl line (schema :data:`SCHEMA_VERSION`): the common fields under their
        schema 1 names, then ``signals``.

        Returns
        -------
        dict
            Plain JSON types (NaN stays NaN: the run directory writes it as null).
        """
        out: dict[str, Any] = {"hospital": self.hospital, "node_id": self.node_id, "num_examples": self.num_examples,
                               "weight": self.weight, "train_loss": self.train_loss,
                               "benchmark_error": self.benchmark_error, "selected": self.selected,
                               "rejected": self.rejected, "reason": self.reason}
        if self.timing:
            out["timing"] = dict(self.timing)
        for key in ("privacy", "update_norm", "trust", "flagged", "malicious"):
            value = getattr(self, key)
            if value is not None:
                out[key] = dict(value) if isinstance(value, Mapping) else value
        out["signals"] = {source: dict(values) for source, values in self.signals.items()}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], schema: int | None = None) -> HospitalRecord:
        """A record from an entry of a rounds.jsonl line, of either schema.

        Parameters
        ----------
        data : Mapping
            The entry (``line["clients"][i]``).
        schema : int, optional
            The line's schema; None: 2 when the entry has ``signals``, else 1.

        Returns
        -------
        HospitalRecord
            The record; a schema 1 entry's other keys are signals (``pre_aggregation`` under
            ``pre_aggregation``, ``secure_aggregation`` under ``secagg``, the rest under
            :data:`UNNAMED_SOURCE`), each under its feature's name (``pre_aggregation`` under
            ``pre-aggregation``, ``secure_aggregation`` under ``secagg``).
        """
        if schema is None:
            schema = 2 if "signals" in data else 1
        if schema not in (1, SCHEMA_VERSION):
            raise ValueError(f"a hospital record of schema {schema}: this hospitrust reads schemas 1 and {SCHEMA_VERSION}")
        if "hospital" not in data:
            raise ValueError(f"a hospital record without 'hospital': {sorted(data)}")
        privacy = data.get("privacy")
        signals: dict[str, dict[str, Any]] = {}
        if schema >= 2:
            signals = {str(source): dict(values) for source, values in (data.get("signals") or {}).items()}
        for key, value in data.items():
            if key in _FIELDS:
                continue
            source, whole = _V1_FEATURE_KEYS.get(key, (UNNAMED_SOURCE, False)) if schema == 1 else (UNNAMED_SOURCE, False)
            if whole and isinstance(value, Mapping):
                signals.setdefault(source, {}).update(value)
            else:
                signals.setdefault(source, {})[key] = value
        return cls(
            hospital=str(data["hospital"]),
            node_id=int(data.get("node_id", -1)),
            num_examples=int(data.get("num_examples") or 0),
            weight=_number(data.get("weight", 0.0)),
            selected=bool(data.get("selected", not data.get("rejected", False))),  # absent: kept unless rejected
            rejected=bool(data.get("rejected", False)),
            reason=str(data.get("reason") or ""),
            train_loss=_number(data.get("train_loss")),
            benchmark_error=_number(data.get("benchmark_error")),
            update_norm=None if data.get("update_norm") is None else float(data["update_norm"]),
            trust=None if data.get("trust") is None else float(data["trust"]),
            flagged=None if data.get("flagged") is None else bool(data["flagged"]),
            malicious=None if data.get("malicious") is None else bool(data["malicious"]),
            timing={str(k): float(v) for k, v in (data.get("timing") or {}).items() if _is_number(v)},
            privacy=None if privacy is None else {str(k): v for k, v in privacy.items()},
            signals=signals,
        )


# the round's fields the loop writes, in the order it writes them (the features' entries follow)
_ROUND_KEYS = ("round", "central", "evaluation", "hospitals_evaluated", "clients", "aggregation_seconds", "update_norm",
               "round_seconds", "timing", "asked", "missing", "unresponsive", "node_unavailable", "offline", "rejoined",
               "kept_previous_model", "note", "hospital_accuracy", "fairness", "trust_signal")


@dataclass
class RoundRecord:
    """One round of a run, as its line in ``rounds.jsonl``.

    Parameters
    ----------
    number : int
        The round (``round`` in the line).
    clients : list[HospitalRecord]
        One record per reply, accepted or rejected.
    central : dict[str, Any]
        The server's evaluation of the round's model (metric -> value).
    evaluation : str or None
        Which evaluation ran (``central``, ``federated``, ...); None where the line does not say.
    hospitals_evaluated : bool or None
        Whether the hospitals evaluated the model this round.
    aggregation_seconds : float
        Time spent aggregating.
    update_norm : float or None
        L2 norm of the round's aggregated update; None when the previous model was kept.
    round_seconds : float
        The round's time from its start to its record.
    timing : dict[str, Any]
        The round's time stamps and durations (``finished_at``, ``train_seconds``, ...).
    asked : int or None
        How many hospitals were asked to train.
    missing, unresponsive, node_unavailable, offline, rejoined : list[str]
        Hospitals asked without a reply; of them, the ones still online; the ones Flower answered
        for as unavailable; not asked because offline; offline at the start and back by the end.
    kept_previous_model : bool
        Whether the previous model was kept (``note`` says why).
    note : str
        Why the previous model was kept ('' otherwise).
    hospital_accuracy : dict[str, float]
        Hospital -> accuracy of the round's model on its validation set.
    fairness : dict[str, float] or None
        The spread of ``hospital_accuracy`` (min, max, mean, std, spread).
    trust_signal : str
        The name of the rule's own trust signal that each hospital record's ``trust`` holds (the rule's
        ``trust_signal``: ``trust``, ``reputation``, ...); ``weight`` where the rule gives none (its weight
        stands for it). A line written before rules named it: the signal its clients hold, read as then.
    entries : dict[str, Any]
        The round features' entries, each under its own name (``detection``, ``privacy``, ...),
        written at the line's top level.
    schema : int
        The schema of the line it was read from (what ``to_json`` writes is always :data:`SCHEMA_VERSION`).
    """

    number: int
    clients: list[HospitalRecord] = field(default_factory=list)
    central: dict[str, Any] = field(default_factory=dict)
    evaluation: str | None = None
    hospitals_evaluated: bool | None = None
    aggregation_seconds: float = 0.0
    update_norm: float | None = None
    round_seconds: float = 0.0
    timing: dict[str, Any] = field(default_factory=dict)
    asked: int | None = None
    missing: list[str] = field(default_factory=list)
    unresponsive: list[str] = field(default_factory=list)
    node_unavailable: list[str] = field(default_factory=list)
    offline: list[str] = field(default_factory=list)
    rejoined: list[str] = field(default_factory=list)
    kept_previous_model: bool = False
    note: str = ""
    hospital_accuracy: dict[str, float] = field(default_factory=dict)
    fairness: dict[str, float] | None = None
    trust_signal: str = "weight"
    entries: dict[str, Any] = field(default_factory=dict)
    schema: int = SCHEMA_VERSION

    def client(self, hospital: str) -> HospitalRecord | None:
        """The record of ``hospital`` in this round, or None if it has none.

        Parameters
        ----------
        hospital : str
            The hospital's name.

        Returns
        -------
        HospitalRecord or None
            Its record.
        """
        return next((c for c in self.clients if c.hospital == hospital), None)

    def trust_of(self, client: HospitalRecord) -> float | None:
        """The rule's trust in ``client`` this round: its record's ``trust``, or its weight where the rule
        gives no trust (``trust_signal`` is ``weight``); None where the record has none.
        """
        return client.weight if self.trust_signal == "weight" else client.trust

    def to_json(self) -> dict[str, Any]:
        """The round's line (schema :data:`SCHEMA_VERSION`): ``schema``, the loop's fields under their schema 1
        names, then the features' entries.

        Returns
        -------
        dict
            Plain JSON types (NaN stays NaN: the run directory writes it as null).
        """
        clash = sorted(set(self.entries) & {*_ROUND_KEYS, "schema"})
        if clash:
            raise ValueError(f"round features' entries {clash} would overwrite the round's own fields")
        return {
            "schema": SCHEMA_VERSION, "round": self.number, "central": dict(self.central), "evaluation": self.evaluation,
            "hospitals_evaluated": self.hospitals_evaluated, "clients": [c.to_json() for c in self.clients],
            "aggregation_seconds": self.aggregation_seconds, "update_norm": self.update_norm,
            "round_seconds": self.round_seconds, "timing": dict(self.timing), "asked": self.asked,
            "missing": list(self.missing), "unresponsive": list(self.unresponsive),
            "node_unavailable": list(self.node_unavailable), "offline": list(self.offline), "rejoined": list(self.rejoined),
            "kept_previous_model": self.kept_previous_model, "note": self.note,
            "hospital_accuracy": dict(self.hospital_accuracy), "fairness": self.fairness,
            "trust_signal": self.trust_signal, **self.entries,
        }

    @classmethod
    def from_json(cls, line: Mapping[str, Any] | str | bytes) -> RoundRecord:
        """A round from its line in rounds.jsonl (parsed, or the text), of either schema; fields the
        line lacks (an older or a shorter writer's) take their defaults.

        Parameters
        ----------
        line : Mapping or str or bytes
            The line.

        Returns
        -------
        RoundRecord
            The round.
        """
        if isinstance(line, (str, bytes)):
            import json

            line = json.loads(line)
        if not isinstance(line, Mapping):
            raise ValueError(f"a rounds.jsonl line is a JSON object, not {type(line).__name__}")
        schema = int(line.get("schema", 1))
        if schema not in (1, SCHEMA_VERSION):
            raise ValueError(f"a rounds.jsonl line of schema {schema}: this hospitrust reads schemas 1 and {SCHEMA_VERSION}")

        def names(key: str) -> list[str]:
            return [str(n) for n in line.get(key) or []]

        asked = line.get("asked")
        clients = [HospitalRecord.from_json(c, schema) for c in line.get("clients") or []]
        trust_signal = line.get("trust_signal")
        if trust_signal is None:  # written before rules named their trust signal: the one its clients hold
            trust_signal = _legacy_trust(clients)
        return cls(
            number=int(line.get("round", 0)),
            clients=clients,
            central=dict(line.get("central") or {}),
            evaluation=line.get("evaluation"),
            hospitals_evaluated=line.get("hospitals_evaluated"),
            aggregation_seconds=_number(line.get("aggregation_seconds", 0.0)),
            update_norm=None if line.get("update_norm") is None else float(line["update_norm"]),
            round_seconds=_number(line.get("round_seconds", 0.0)),
            timing=dict(line.get("timing") or {}),
            asked=None if asked is None else int(asked),
            missing=names("missing"), unresponsive=names("unresponsive"), node_unavailable=names("node_unavailable"),
            offline=names("offline"), rejoined=names("rejoined"),
            kept_previous_model=bool(line.get("kept_previous_model", False)),
            note=str(line.get("note") or ""),
            hospital_accuracy=dict(line.get("hospital_accuracy") or {}),
            fairness=line.get("fairness"),
            trust_signal=str(trust_signal),
            entries={k: v for k, v in line.items() if k not in _ROUND_KEYS and k != "schema"},
            schema=schema,
        )


def _legacy_trust(clients: list[HospitalRecord]) -> str:
    """The trust signal of a line that does not name it: the first of :data:`_LEGACY_TRUST_SIGNALS` a client
    holds (each client's ``trust`` set from it), else ``weight``.
    """
    for name in _LEGACY_TRUST_SIGNALS:
        values = [c.trust if name == "trust" else mean_of_signal(c.signal(name)) for c in clients]
        if any(v is not None for v in values):
            for c, v in zip(clients, values):
                if v is not None:  # the named signal is the trust (a line with reputation and trust: reputation)
                    c.trust = v
            return name
    return "weight"


__all__ = ["PRIVACY_METRICS", "SCHEMA_VERSION", "UNNAMED_SOURCE", "HospitalRecord", "RoundRecord", "mean_of_signal"]
