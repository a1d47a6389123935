"""The points of a run at which a rule may act besides its round's math, with what each default does.

:class:`~hospitrust.strategies.base.HospitrustStrategy` takes them; a rule overrides the ones it needs
(FED-FBD its state and evaluation, sentinel its start and released model, contribution its scores).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from flwr.app import ArrayRecord

from hospitrust.options import Options as OptionsModel
from hospitrust.records import RoundRecord
from hospitrust.strategies.rounds import RoundResult


class RunHooks:
    """A rule's hooks into the run (its start, each round's release, the end) and what the loop and the
    features may ask of it; the defaults do nothing a plain rule would need to change.
    """

    name: ClassVar[str]

    @classmethod
    def server_parts(cls, options: OptionsModel, *, task: Any, sets: Any, device: torch.device,
                     hospitals: Sequence[str], seed: int, run_dir: Any, resuming: bool) -> dict[str, Any]:
        """Further keyword arguments of the constructor that the server builds for this rule at the
        start of a run (FED-FBD's plan and warehouse); none by default.

        Parameters
        ----------
        options : Options
            The rule's resolved options.
        task : Task
            The run's task (its model, channels, classes, image size).
        sets : ServerSets
            The server's test set and reference cohort.
        device : torch.device
            Where the server's math runs.
        hospitals : Sequence[str]
            The hospitals' names in the query rows' order (partition, then name).
        seed : int
            The run's seed.
        run_dir : pathlib.Path
            The run directory (files the rule keeps beside the loop's).
        resuming : bool
            True when the run resumes from a checkpoint (what the first round wrote is there already).

        Returns
        -------
        dict
            Keyword arguments for the constructor.
        """
        return {}

    def own_evaluation(self, server_round: int, result: RoundResult) -> tuple[dict[str, Any], dict[str, Any]]:
        """The round's central report and the rule's own entries in its rounds.jsonl line, for a rule
        whose state is no single global model (``runs_own_evaluation``); the loop asks no other rule.

        Parameters
        ----------
        server_round : int
            The round just aggregated.
        result : RoundResult
            What :meth:`aggregate_round` returned for it.

        Returns
        -------
        tuple[dict, dict]
            (the central classification report, extra entries of the round's record).
        """
        raise NotImplementedError(f"{self.name} evaluates the global model centrally (runs_own_evaluation is False)")

    def initial_model(self, arrays: ArrayRecord) -> ArrayRecord:
        """The global model the first round starts from, given the run's initial one (a fresh run's, never a
        resumed run's): that model itself for every rule but one that starts from the server's own model
        (sentinel's ``start``).

        Parameters
        ----------
        arrays : ArrayRecord
            The run's initial model (the task's, from the run's seed).

        Returns
        -------
        ArrayRecord
        """
        return arrays

    def released(self, server_round: int, arrays: ArrayRecord) -> tuple[ArrayRecord, dict[str, Any]]:
        """The model the consortium gets after ``server_round`` (evaluated centrally; the last round's is saved as
        the run's model) and the rule's entries about it in the round's line: the global model itself and none for
        every rule but one that keeps a floor (sentinel's ``floor``). The hospitals train on from the global model.

        Parameters
        ----------
        server_round : int
            The round just aggregated.
        arrays : ArrayRecord
            The loop's global model after it.

        Returns
        -------
        tuple[ArrayRecord, dict[str, Any]]
            The released model and the rule's entries.
        """
        return arrays, {}

    def final_model(self, arrays: ArrayRecord) -> dict[str, torch.Tensor] | None:
        """The state dict saved as the run's model.pt; None for a rule that keeps its final state in
        its own file (FED-FBD's warehouse.pt).

        Parameters
        ----------
        arrays : ArrayRecord
            The loop's global model after the last round.

        Returns
        -------
        dict or None
            The state dict to save, or None.
        """
        return arrays.to_torch_state_dict()

    def run_summary(self, history: Sequence[RoundRecord], truth: Mapping[str, bool]) -> dict[str, Any]:
        """The rule's own entries in summary.json; none by default.

        Parameters
        ----------
        history : Sequence[RoundRecord]
            The run's round records.
        truth : Mapping[str, bool]
            The simulation's ground truth: which hospitals attack.

        Returns
        -------
        dict
            Entries merged into the summary.
        """
        return {}

    def receive_scores(self, totals: Mapping[str, Mapping[str, float]]) -> None:
        """The contribution ledger's accumulated scores after a scored round; a rule that weighs
        hospitals by them keeps them (``contribution``), the others ignore them.

        Parameters
        ----------
        totals : Mapping[str, Mapping[str, float]]
            Hospital name -> score name (``fp``, ``ee``, ...) -> its total over the rounds scored so far.
        """
