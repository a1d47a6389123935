"""Run config and node config as pydantic models.

Flower hands the app a flat dict of kebab-case keys (``[tool.flwr.app.config]`` plus
``--run-config`` overrides). Everything is validated here, once, before any data is
loaded: a wrong key or value fails with a message that names the key, the value and
what is allowed.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from hospitrust.attacks.settings import AttackSettings
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

DATA_DIR_ENV = "HOSPITRUST_DATA_DIR"


class ConfigError(ValueError):
    """A run or node config value is wrong; the message says which and what is allowed."""


def _allowed(names) -> str:
    return ", ".join(sorted(names))


class RunConfig(BaseModel):
    """Every run config key, with type, bounds and default.

    Field names are snake_case; the run config uses the same names in kebab-case
    (``num_server_rounds`` is ``num-server-rounds``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # federation
    num_server_rounds: int = Field(10, ge=1, le=100_000, description="Rounds of training.")
    strategy: str = Field("fedavg", description="Aggregation rule, by registry name.")
    fraction_train: float = Field(1.0, gt=0.0, le=1.0, description="Share of hospitals asked to train each round.")
    min_hospitals: int = Field(2, ge=1, description="Fewest valid replies a round needs to update the model.")
    reply_timeout: float = Field(600.0, gt=0.0, description="Seconds a round waits for hospitals' replies.")
    seed: int = Field(42, ge=0, description="Seeds partitions, model init, sampling and local training.")
    assumed_malicious: int = Field(1, ge=0, description="f, the attackers a robust rule is sized for (trimmed-mean, krum, multi-krum, bulyan).")
    multi_krum_m: int = Field(0, ge=0, description="Multi-Krum: updates averaged (0: n - f).")
    clipping_tau: float = Field(0.0, ge=0.0, description="Centered clipping radius (0: the median distance to the center, each round).")
    clipping_iters: int = Field(1, ge=1, le=100, description="Centered clipping iterations.")
    # trust rules (fedagain, hta, earn)
    fedagain_benchmark: Literal["client", "server"] = Field("client", description="FedAgain E: client = the hospital's reported error of the incoming global on its validation set (the paper); server = 1 - reference-cohort balanced accuracy of the hospital's returned model (a variant).")
    fedagain_divergence: Literal["l2", "cosine", "median"] = Field("l2", description="FedAgain D: l2 = ||returned - global|| (the paper); cosine = 1 - cos(returned, global) (the authors' code); median = ||update - coordinate-wise median update|| (a variant).")
    fedagain_divergence_quantile: float = Field(0.5, ge=0.0, le=1.0, description="FedAgain: D is floored at this quantile of the round's divergences (free-riders with D = 0).")
    fedagain_error_quantile: float = Field(0.5, ge=0.0, le=1.0, description="FedAgain: E is floored at this quantile of the round's errors (a hospital reporting E = 0).")
    fedagain_error_floor: float = Field(0.01, ge=0.0, le=1.0, description="FedAgain: absolute floor of E.")
    hta_a: float = Field(0.5, ge=0.0, le=10.0, description="HTA exponent of s (direction agreement); 0 drops the signal.")
    hta_b: float = Field(1.0, ge=0.0, le=10.0, description="HTA exponent of m (magnitude plausibility); 0 drops the signal.")
    hta_c: float = Field(1.0, ge=0.0, le=10.0, description="HTA exponent of v (reference-cohort validation); 0 drops the signal.")
    hta_ema_rate: float = Field(0.3, gt=0.0, le=1.0, description="HTA reputation EMA rate (weight of the new round).")
    hta_variance_penalty: float = Field(1.0, ge=0.0, description="HTA: reputation = EMA - this x the EW standard deviation of tau.")
    hta_lambda: float = Field(2.0, ge=0.0, description="HTA exclusion: reputation < median - lambda x MAD (and below kappa x median).")
    hta_kappa: float = Field(0.5, ge=0.0, le=1.0, description="HTA exclusion: reputation < kappa x median (and below median - lambda x MAD).")
    hta_clip: bool = Field(True, description="HTA: clip each kept update to the kept updates' median norm.")
    hta_magnitude_tolerance: float = Field(2.0, ge=1.0, description="HTA m: norms within this factor of the median norm are not penalized.")
    hta_trim_norms: bool = Field(True, description="HTA: the median norm behind m and the clip is taken over the norms at most hta-magnitude-tolerance x the plain median (one trimming step, the top only), so scaled updates do not raise the threshold every honest update is clipped to; false: the plain median (the rule before).")
    hta_merge_duplicates: bool = Field(True, description="HTA: updates whose pairwise cosine reaches hta-duplicate-cosine count as one voice (the medians of s, m and v see their mean once; the group shares one hospital's weight) and are flagged. Colluding attacks (ALIE, IPM, min-max, min-sum) send one update from every attacker; hospitals training on their own data do not.")
    hta_duplicate_cosine: float = Field(0.999, gt=0.0, le=1.0, description="HTA: the cosine at or above which two hospitals' updates are near-duplicates (see hta-merge-duplicates).")
    earn_evidence: Literal["update", "update-count", "reported"] = Field("update", description="EARN evidence of who holds a class: update = positive bias update of the class row; update-count = counts estimated from the bias update per local step and num-examples; reported = the hospitals' class counts (fakeable).")
    earn_mode: Literal["blend", "peer", "history"] = Field("blend", description="EARN agreement: blend = p(c) peer + (1 - p(c)) history; peer = no blend; history = own history only.")
    earn_nonholder_weight: float = Field(1.0, ge=0.0, le=1.0, description="EARN: factor on the base weight of a hospital that does not hold a rare class (by the evidence) in that class's row. 1 (with earn-nonholder-by-peers false): the rule as specified (FedAvg or base weight + trust x evidence share); 0: the row is learned from its holders only.")
    earn_cap: float = Field(0.5, gt=0.0, le=1.0, description="EARN: largest share one hospital may hold of a rare-class row (1: no cap).")
    earn_clip_rows: Literal["off", "update", "holders"] = Field("update", description="EARN rare-class rows: update = each hospital's row update scaled by the factor that clips its whole update to the round's median norm (the HTA base's kept updates), so a scaled update that passes the row checks cannot push a rare row by its scale; holders = the larger of that factor and the one that clips the row to the median row norm of the class's holders (a specialist whose whole update is large keeps its row); off = unclipped rows.")
    earn_history_rounds: int = Field(3, ge=1, le=1000, description="EARN: a hospital's first rounds averaged into its locked history row.")
    earn_agree_threshold: float = Field(0.1, ge=0.0, le=1.0, description="EARN: a row agrees when its blended agreement is at least this.")
    earn_audit: bool = Field(True, description="EARN: a row must also raise its class's logit on the reference cohort's images of that class.")
    earn_audit_by: Literal["row", "row-shift-free", "model"] = Field("row-shift-free", description="EARN audit: 'row' (the class row update against the global model's features), 'row-shift-free' (the same with the row's component along the mean feature removed, so raising the class everywhere is not scored) or 'model' (the hospital's whole candidate model, global + its update, must separate the class better on the reference cohort than the global model).")
    earn_rare_classes: str = Field("", description="EARN rare classes, e.g. '4' or '1,4'; empty: automatic (earn-rare-fraction).")
    earn_rare_fraction: float = Field(0.6, gt=0.0, le=1.0, description="EARN automatic rare classes: reported total below this x the mean class total (and the rarest).")
    earn_nonholder_by_peers: bool = Field(True, description="EARN: multiply earn-nonholder-weight in a rare row by 1 - p(c), with p(c) = clip((n(c) - 1) / 4, 0, 1) from the class's holders: a row with one holder is as specified (its non-holders dilute a faker), a row with five or more holders is learned from them alone (hospitals that relabel the class cannot push its logit down as non-holders).")
    earn_excuse_direction: bool = Field(True, description="EARN on the HTA base: the rare-class trust a hospital has earned (audited on the reference cohort) floors HTA's direction signal s for it at trust x the round's median s, so an honest specialist counts as a typical hospital in direction instead of being weighed down for pointing where its rare data points; magnitude and validation still apply. Needs earn-audit and hta-c > 0.")
    earn_base: Literal["fedavg", "median", "hta"] = Field("hta", description="EARN rule for the body and the other rows: fedavg, median, or hta (HTA with its hta-* options; its weights also replace FedAvg's in the rare rows).")
    max_update_norm: float = Field(1e4, gt=0.0, description="Replies whose update (returned - global) has a larger L2 norm are rejected.")
    max_num_examples: int = Field(10_000_000, ge=1, description="Replies claiming more training examples are rejected.")
    # contribution scores (hospitrust.contribution) and secure aggregation (SecAgg+)
    contribution_scoring: bool = Field(False, description="Score each hospital's contribution every round (LOO, IOI, Fair-Private, Everybody-Else, COS) from scalars the hospitals compute; needs a weighted-mean strategy (fedavg, fedprox, contribution).")
    contribution_utility: Literal["balanced-accuracy", "neg-loss"] = Field("balanced-accuracy", description="Contribution utility v on each hospital's validation set: balanced-accuracy or neg-loss (minus cross-entropy).")
    contribution_score: Literal["fp", "ee"] = Field("fp", description="Score the contribution strategy weights by: fp (Fair-Private) or ee (Everybody-Else), accumulated, clipped at 0.")
    contribution_selfish_hospitals: str = Field("", description="Simulation: partition ids (e.g. '0' or '0,3') of selfish hospitals that inflate the evaluations they report.")
    contribution_selfish_inflation: float = Field(0.05, ge=0.0, le=1.0, description="Simulation: how much a selfish hospital inflates its reported LOO and IOI (utility units).")
    secure_aggregation: bool = Field(False, description="Aggregate with Flower's SecAgg+ (legacy SecAggPlusWorkflow + secaggplus_mod): the server only ever holds the sum; strategy must be fedavg.")
    secagg_clipping_range: float = Field(8.0, gt=0.0, description="SecAgg+: model values are clipped to [-range, range] before quantization.")
    secagg_quantization_range: int = Field(4194304, ge=2, description="SecAgg+: quantization levels over the clipping range.")
    secagg_max_weight: float = Field(0.0, ge=0.0, description="SecAgg+: largest num-examples a hospital may weigh in with; 0: the largest training set reported in the query round (models are scaled by n/max before quantization, so a loose bound costs precision).")
    secagg_reconstruction_threshold: float = Field(0.67, gt=0.0, le=1.0, description="SecAgg+: share of the hospitals' key shares needed to unmask the sum.")

    # block ownership (strategy fbd, hospitrust.fbd)
    fbd_colors: int = Field(6, ge=1, le=64, description="FED-FBD: colors in the warehouse (complete models, each from one version of every block).")
    fbd_redundancy: int = Field(3, ge=1, description="FED-FBD: writers per color; a generated plan needs colors x redundancy to be a multiple of the hospitals.")
    fbd_plan: str = Field("", description="FED-FBD shipping plan: '' generates one (seeded); 'hospital-0:0,1,2; hospital-1:3,4,5' (a bare index i means hospital-i) or a plan .json path.")
    fbd_lambda: float = Field(0.1, ge=0.0, le=100.0, description="FED-FBD: weight of the KL term to the sibling color's predictions (0: plain cross-entropy).")
    fbd_routing: Literal["ensemble", "max-confidence"] = Field("ensemble", description="FED-FBD inference routing: ensemble (average of colors) or max-confidence (per sample, the most confident color).")
    fbd_exclude_colors: str = Field("", description="FED-FBD: colors left out of routing, e.g. '1,4'.")
    fbd_detect_z: float = Field(1.5, gt=0.0, description="FED-FBD detection: a color whose reference-cohort loss z-score exceeds this is flagged.")
    fbd_exclude_flagged: bool = Field(False, description="FED-FBD: leave flagged colors out of routing.")

    # data
    dataset: str = Field("pneumoniamnist", description="MedMNIST 2D flag, or torchvision's mnist / cifar10.")
    image_size: int = Field(28, description="Image size: 28, 64, 128 or 224 (the MedMNIST sizes); mnist and cifar10 are resampled to it, and also take 32.")
    data_dir: str = Field("", description="Folder of MedMNIST files; empty: $HOSPITRUST_DATA_DIR, else medmnist's default.")
    partitioner: str = Field("dirichlet", description="How training data is split over simulated hospitals.")
    dirichlet_alpha: float = Field(0.5, gt=0.0, description="Dirichlet concentration (dirichlet, specialist).")
    quantity_skew_alpha: float = Field(1.0, gt=0.0, description="Dirichlet concentration of hospital sizes (quantity-skew).")
    classes_per_hospital: int = Field(1, ge=1, description="Classes per hospital (pathological).")
    specialist_classes: str = Field("", description="'class:hospital[,hospital];...' held only by those hospitals (specialist).")
    val_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="Share of each hospital's data kept for local validation.")
    train_subsample: float = Field(1.0, gt=0.0, le=1.0, description="Share of the training split used (stratified; for quick runs).")
    reference_cohort_per_class: int = Field(20, ge=1, description="Reference cohort size per class, drawn from the val split.")

    # model and local training
    model: str = Field("small-cnn", description="Model architecture, by registry name.")
    local_epochs: int = Field(2, ge=1, le=1000, description="Local epochs per round at each hospital.")
    batch_size: int = Field(32, ge=1, le=65536, description="Local minibatch size.")
    learning_rate: float = Field(0.01, gt=0.0, le=10.0, description="Local learning rate.")
    optimizer: Literal["sgd", "adam"] = Field("sgd", description="Local optimizer: sgd or adam.")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="SGD momentum.")
    weight_decay: float = Field(0.0, ge=0.0, description="L2 weight decay.")
    class_weighted_loss: bool = Field(False, description="Weigh each class's loss by n / (classes held x its count) in the hospital's own training labels (scikit-learn's 'balanced'), so rare classes are learned; also the server's own training on the reference cohort (FLTrust's root update), not FED-FBD's.")
    class_weights_from: Literal["hospital", "federation"] = Field("hospital", description="With class-weighted-loss: 'hospital' weighs classes by the hospital's own label counts; 'federation' by the federation's totals (from the query round's class counts, sent with every train message), so a specialist weighs up the rare class it holds instead of down.")
    fedrs_alpha: float = Field(1.0, ge=0.0, le=1.0, description="FedRS's restricted softmax in local training: a hospital multiplies the logits of the classes it holds none of by this in its loss (0: leaves them out of the softmax), so it does not push a class it never sees down everywhere. 1: plain softmax (off).")
    proximal_mu: float = Field(0.01, gt=0.0, description="FedProx proximal term weight mu (used by strategy fedprox only).")

    # attacks (simulation ground truth): validated by hospitrust.attacks.settings.AttackSettings
    attacks: AttackSettings = Field(default_factory=AttackSettings, description="The attack-* run config keys.")

    # results
    output_dir: str = Field("runs", description="Folder for run directories (made absolute).")
    run_name: str = Field("", description="Run directory name; empty: <time>-<dataset>-<strategy>.")
    checkpoint: bool = Field(True, description="Write checkpoint.pt (model, round, strategy state) after every round.")
    resume_from: str = Field("", description="A run directory or checkpoint.pt to continue from; the run goes on in that directory.")

    @field_validator("image_size")
    @classmethod
    def _image_size(cls, v: int) -> int:
        if v not in (28, 32, 64, 128, 224):
            raise ValueError(f"must be one of 28, 64, 128, 224 (the MedMNIST sizes) or 32 (mnist, cifar10), got {v}")
        return v

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, v: str) -> str:
        from hospitrust.strategies import STRATEGIES

        if v not in STRATEGIES:
            raise ValueError(f"unknown strategy {v!r}; allowed: {_allowed(STRATEGIES)}")
        return v

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str) -> str:
        from hospitrust.datasets.registry import dataset_flags

        flags = dataset_flags()
        if v not in flags:
            raise ValueError(f"unknown dataset {v!r}; allowed (MedMNIST 2D flags, mnist, cifar10): {_allowed(flags)}")
        return v

    @field_validator("partitioner")
    @classmethod
    def _partitioner(cls, v: str) -> str:
        from hospitrust.datasets.partitioners import PARTITIONERS

        if v not in PARTITIONERS:
            raise ValueError(f"unknown partitioner {v!r}; allowed: {_allowed(PARTITIONERS)}")
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        from hospitrust.models import MODELS

        if v not in MODELS:
            raise ValueError(f"unknown model {v!r}; allowed: {_allowed(MODELS)}")
        return v

    @field_validator("specialist_classes")
    @classmethod
    def _specialist(cls, v: str) -> str:
        if v.strip():
            from hospitrust.datasets.partitioners import parse_specialist_classes

            parse_specialist_classes(v)  # raises ValueError with the reason
        return v

    @field_validator("earn_rare_classes")
    @classmethod
    def _earn_rare(cls, v: str) -> str:
        from hospitrust.strategies.earn import parse_class_list

        parse_class_list(v)  # raises ValueError with the reason
        return v

    @model_validator(mode="after")
    def _cross_checks(self) -> "RunConfig":
        from hospitrust.datasets.registry import source_of

        source = source_of(self.dataset)
        sizes = source.sizes(self.dataset)
        if self.image_size not in sizes:
            raise ValueError(f"image-size {self.image_size}: {source.title} ships {', '.join(map(str, sizes))} only")
        if self.partitioner == "specialist" and not self.specialist_classes.strip():
            raise ValueError("partitioner 'specialist' needs specialist-classes, e.g. '4:0' (class 4 only at hospital 0)")
        if self.strategy == "fbd":
            from hospitrust.fbd.blocks import blocks_for
            from hospitrust.fbd.routing import parse_color_list

            blocks_for(self.model)  # raises ValueError naming the models that have a block cut
            excluded = parse_color_list(self.fbd_exclude_colors, self.fbd_colors)
            if len(excluded) >= self.fbd_colors:
                raise ValueError(f"fbd-exclude-colors leaves none of the {self.fbd_colors} colors for routing")
            if self.fedrs_alpha < 1.0:
                raise ValueError(f"fedrs-alpha {self.fedrs_alpha} is not used by strategy fbd (its hospitals train "
                                 "block pairs with their own loss); leave it at 1.0")
        from hospitrust.contribution.settings import check_contribution_settings

        check_contribution_settings(self)
        return self

    # ---- conveniences -------------------------------------------------------------
    def resolved_data_dir(self) -> Path | None:
        """The MedMNIST folder: run config, else $HOSPITRUST_DATA_DIR, else None (medmnist's default)."""
        raw = self.data_dir or os.environ.get(DATA_DIR_ENV, "")
        return Path(raw).expanduser().resolve() if raw else None

    def to_flat(self) -> dict[str, Any]:
        """The kebab-case dict, as in pyproject's run config."""
        flat = {k.replace("_", "-"): v for k, v in self.model_dump(exclude={"attacks"}).items()}
        flat.update(self.attacks.to_flat())
        return flat


class NodeConfig(BaseModel):
    """What a SuperNode tells its ClientApp (``--node-config``).

    Simulation injects ``partition-id`` and ``num-partitions``; a hospital's real
    SuperNode passes ``data-path`` (its image folders) and ``hospital`` (its name).
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    partition_id: int | None = Field(None, ge=0)
    num_partitions: int | None = Field(None, ge=1)
    data_path: str | None = None
    hospital: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "NodeConfig":
        if self.data_path is None and (self.partition_id is None or self.num_partitions is None):
            raise ValueError(
                "node config needs either data-path (a hospital's own class-per-folder images) "
                "or partition-id and num-partitions (simulation)"
            )
        if self.partition_id is not None and self.num_partitions is not None and self.partition_id >= self.num_partitions:
            raise ValueError(f"partition-id {self.partition_id} must be < num-partitions {self.num_partitions}")
        return self

    @property
    def hospital_name(self) -> str:
        if self.hospital:
            return str(self.hospital)
        return f"hospital-{self.partition_id}"


def _format_errors(err: ValidationError, kind: str, raw: Mapping[str, Any]) -> str:
    lines = [f"invalid {kind}:"]
    fields = set(_known_keys()) if kind == "run config" else {f.replace("_", "-") for f in NodeConfig.model_fields}
    for e in err.errors():
        loc = e.get("loc") or ()
        key = str(loc[0]).replace("_", "-") if loc else "(config)"
        value = raw.get(key, e.get("input")) if loc else None
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            kebab = sorted(fields)
            close = difflib.get_close_matches(key, kebab, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            lines.append(f"  - unknown key {key!r}{hint} (known keys: {', '.join(kebab)})")
        elif loc:
            lines.append(f"  - {key} = {value!r}: {msg}")
        else:
            lines.append(f"  - {msg}")
    return "\n".join(lines)


def _known_keys() -> list[str]:
    own = [f.replace("_", "-") for f in RunConfig.model_fields if f != "attacks"]
    return sorted(own + [f.replace("_", "-") for f in AttackSettings.model_fields])


def parse_run_config(raw: Mapping[str, Any]) -> RunConfig:
    """Validate Flower's flat run config; raises ConfigError naming key, value and what is allowed."""
    bad = [k for k in raw if "_" in str(k)]
    if bad:
        raise ConfigError(f"invalid run config: keys are kebab-case, got {bad} (write e.g. 'num-server-rounds')")
    attack_fields = set(AttackSettings.model_fields)
    data = {str(k).replace("-", "_"): v for k, v in raw.items()}
    attack_part = {k: v for k, v in raw.items() if str(k).replace("-", "_") in attack_fields}
    own = {k: v for k, v in data.items() if k not in attack_fields}
    try:
        attacks = AttackSettings.from_run_config(attack_part)
    except ValueError as err:
        raise ConfigError(f"invalid run config: {err}") from None
    if "attacks" in own:
        raise ConfigError("invalid run config: unknown key 'attacks'")
    try:
        return RunConfig(**own, attacks=attacks)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, "run config", raw)) from None


def parse_node_config(raw: Mapping[str, Any]) -> NodeConfig:
    data = {str(k).replace("-", "_"): v for k, v in raw.items()}
    try:
        return NodeConfig(**data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, "node config", raw)) from None


def run_config_markdown() -> str:
    """The run config keys as a Markdown table (key, default, meaning), for the README."""
    import json

    rows = ["| key | default | meaning |", "|---|---|---|"]
    for model in (RunConfig, AttackSettings):
        defaults = model().model_dump()
        for name, field in model.model_fields.items():
            if name == "attacks":
                continue
            default = json.dumps(defaults[name])
            rows.append(f"| `{name.replace('_', '-')}` | `{default}` | {field.description or ''} |")
    return "\n".join(rows)
