"""FoolsGold (Fung, Yoon & Beschastnikh, RAID 2020): historical cosine similarity, pardoning, logit."""

from __future__ import annotations

import torch
from pydantic import Field

from hospitrust.aggregation import foolsgold
from hospitrust.options import Options
from hospitrust.strategies.base import Aggregate, HospitrustStrategy


class FoolsGoldOptions(Options):
    """FoolsGold's options: the logit's confidence."""

    confidence: float = Field(1.0, gt=0.0, description=(
        "kappa, the confidence of the logit that maps the rescaled similarity to a learning rate (the paper's 1)."
    ))


class FoolsGold(HospitrustStrategy):
    """Every hospital's history is the sum of all updates it sent; hospitals whose histories point the
    same way as another's (Sybils) get a learning rate near 0 (cosine similarity with pardoning,
    rescaled, through a logit); the aggregate is the learning-rate-weighted mean of the round's
    updates (Fung, Yoon & Beschastnikh, "The Limitations of Federated Learning in Sybil Settings",
    RAID 2020).

    State across rounds: ``history``, hospital name -> its ``(d,)`` summed updates (saved in the
    checkpoint; a hospital seen for the first time starts at zero).

    Parameters
    ----------
    hospitals, options
        As :class:`~hospitrust.strategies.base.HospitrustStrategy` (the rule's options, its defaults when None).
    **kwargs
        The base's other keyword arguments.
    """

    name = "foolsgold"
    reads_who_sent = True  # history per hospital
    Options = FoolsGoldOptions
    options: FoolsGoldOptions
    state_attrs = ("history",)

    def __init__(self, hospitals, options=None, **kwargs) -> None:
        super().__init__(hospitals, options, **kwargs)
        self.history: dict[str, torch.Tensor] = {}
        # the last round's (n, d) stack of histories (``history`` holds views of its rows) and its
        # hospitals in row order: when the next round has the same hospitals it is updated in place
        self._stack: torch.Tensor | None = None
        self._stack_names: list[str] = []

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self._stack, self._stack_names = None, []

    def aggregate(self, updates, example_weights, context) -> Aggregate:
        n, d = updates.shape
        names = list(context.hospitals)
        stack = self._stack
        if (stack is None or names != self._stack_names or stack.shape != updates.shape or stack.dtype != updates.dtype
                or stack.device != updates.device):
            stack = torch.empty_like(updates)
            for i, name in enumerate(names):
                past = self.history.get(name)
                if past is None:
                    stack[i].zero_()
                elif past.numel() != d:
                    raise ValueError(f"foolsgold: {name}'s history has {past.numel()} numbers, the updates {d} "
                                     "(a checkpoint of another model?)")
                else:
                    stack[i] = past.to(updates.device, updates.dtype)
        update, new, rec = foolsgold(updates, stack, confidence=self.options.confidence, out=stack)
        self._stack, self._stack_names = new, names
        for i, name in enumerate(names):
            self.history[name] = new[i]  # views of the stack: no copy
        for name, past in self.history.items():
            if name not in names and past._base is not None:
                self.history[name] = past.clone()  # an absent hospital's row must not keep an old stack alive
        detail = rec.detail
        return Aggregate(update, rec.weights, rec.selected, extra={
            "learning_rate": [float(v) for v in detail["learning_rates"]],
            "max_similarity": [float(v) for v in detail["max_similarity"]],
        })
