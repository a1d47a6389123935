r"""Pre-aggregation steps that compose with any rule: NNM, ARC, bucketing and static clipping.

Each step maps the stacked updates ``x`` ``(n, d)`` to a new stack ``y = M x`` ``(n', d)`` with a
mixing matrix ``M`` ``(n', n)`` that depends on ``x`` only through its Gram matrix
:math:`G = X X^\top` (the norms and distances of the rows). So a chain of steps needs one pass
over the data for ``G``, the small ``(n, n)`` algebra of every step (the Gram matrix of a step's
output is :math:`M G M^\top`), and one product ``M_k \cdots M_1 x`` at the end: :func:`chain`.

Every step returns its :class:`StepRecord`: which input rows each output row mixes (NNM's
neighbours, the buckets), the scale each input row got (ARC's and static clipping's factors)
and the mixing matrix itself. After a mixing step (NNM, bucketing) a later rule sees mixed
vectors: output row ``i`` of NNM is the mean of hospital ``i``'s neighbourhood, a bucket is
the mean of its members, so a later rule's per-row record describes that mixture
(:func:`origin` gives the hospitals behind every row of a chain's output).

Pure torch, no Flower; CPU or GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ._validation import check_f, check_updates
from .kernels import gram

__all__ = [
    "StepRecord",
    "nnm_mixing",
    "arc_mixing",
    "bucketing_mixing",
    "static_clipping_mixing",
    "nnm",
    "arc",
    "bucketing",
    "static_clipping",
    "chain",
    "origin",
    "arc_clip_count",
    "STEPS",
    "parse_chain",
    "rows_before_each_step",
    "carried_rows",
    "PreAggregationChain",
    "PreAggregated",
]


@dataclass(frozen=True)
class StepRecord:
    """What one pre-aggregation step did.

    Parameters
    ----------
    step : str
        The step's name (``nnm``, ``arc``, ``bucketing``, ``clipping``).
    mixing : torch.Tensor
        ``(n_out, n_in)`` float64 CPU matrix ``M`` with output ``= M @ input``.
    members : list of list of int
        For every output row, the input rows it mixes (NNM: the neighbours, nearest first,
        itself included; bucketing: the bucket; clipping steps: the row itself).
    factors : torch.Tensor
        ``(n_in,)`` float64 scale applied to every input row (ARC, static clipping; 1 elsewhere).
    threshold : float or None
        The clipping bound (ARC, static clipping); None for mixing steps.
    detail : dict
        Step-specific extras (ARC: ``num_clipped``; bucketing: ``permutation``).
    """

    step: str
    mixing: torch.Tensor
    members: list[list[int]]
    factors: torch.Tensor
    threshold: float | None = None
    detail: dict = field(default_factory=dict)

    @property
    def clipped(self) -> list[int]:
        """The input rows scaled down (factor below 1)."""
        return [int(i) for i in torch.nonzero(self.factors < 1.0).flatten().tolist()]


def _check_gram(g: torch.Tensor) -> torch.Tensor:
    if not isinstance(g, torch.Tensor) or g.dim() != 2 or g.shape[0] != g.shape[1] or g.shape[0] < 1:
        shape = tuple(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
        raise ValueError(f"gram must be a square (n, n) tensor with n >= 1; got {shape}")
    return g.detach().to(device="cpu", dtype=torch.float64)


def _sq_distances(g: torch.Tensor) -> torch.Tensor:
    diag = torch.diagonal(g)
    dist = (diag[:, None] + diag[None, :] - 2.0 * g).clamp_min(0.0)
    dist.fill_diagonal_(0.0)
    return dist


def _norms(g: torch.Tensor) -> torch.Tensor:
    return torch.diagonal(g).clamp_min(0.0).sqrt()


def _scaling(step: str, factors: torch.Tensor, threshold: float, detail: dict | None = None) -> tuple[torch.Tensor, StepRecord]:
    n = factors.numel()
    return torch.diag(factors), StepRecord(step, torch.diag(factors), [[i] for i in range(n)], factors, threshold,
                                           detail or {})


def nnm_mixing(g: torch.Tensor, f: int) -> tuple[torch.Tensor, StepRecord]:
    r"""Nearest-neighbour mixing from the Gram matrix: row ``i`` of ``M`` is :math:`1/(n-f)` on
    the ``n - f`` rows nearest to :math:`x_i` (itself included), 0 elsewhere.

    Parameters
    ----------
    g : torch.Tensor
        ``(n, n)`` Gram matrix of the input rows.
    f : int
        Assumed number of Byzantine rows, ``0 <= f < n``.

    Returns
    -------
    tuple of torch.Tensor and StepRecord
        ``M`` ``(n, n)`` float64 and the record (``members``: the neighbours, nearest first).
    """
    g = _check_gram(g)
    n = g.shape[0]
    f = check_f(f)
    if f >= n:
        raise ValueError(f"nnm requires f < n; got n={n}, f={f}")
    dist = _sq_distances(g)
    dist.fill_diagonal_(-1.0)  # a row is its own nearest neighbour, even among duplicates
    order = torch.sort(dist, dim=1, stable=True).indices[:, : n - f]
    m = torch.zeros(n, n, dtype=torch.float64)
    m.scatter_(1, order, 1.0 / (n - f))
    return m, StepRecord("nnm", m, order.tolist(), torch.ones(n, dtype=torch.float64))


def arc_clip_count(n: int, f: int) -> int:
    r"""How many rows ARC clips: :math:`k = \lfloor 2 f (n - f) / n \rfloor` (exact integer floor).

    Parameters
    ----------
    n : int
        Number of rows.
    f : int
        Assumed number of Byzantine rows, ``0 <= f <= n``.

    Returns
    -------
    int
        ``k`` in ``[0, n/2]``.
    """
    return (2 * f * (n - f)) // n


def arc_mixing(g: torch.Tensor, f: int) -> tuple[torch.Tensor, StepRecord]:
    r"""Adaptive robust clipping from the Gram matrix: the :math:`k` largest rows
    (:func:`arc_clip_count`) are clipped to the norm of the largest row left alone.

    Parameters
    ----------
    g : torch.Tensor
        ``(n, n)`` Gram matrix of the input rows.
    f : int
        Assumed number of Byzantine rows, ``0 <= f <= n``.

    Returns
    -------
    tuple of torch.Tensor and StepRecord
        Diagonal ``M`` of the clip factors and the record (``factors``, ``threshold``, ``clipped``).
    """
    g = _check_gram(g)
    n = g.shape[0]
    f = check_f(f)
    if f > n:
        raise ValueError(f"arc requires f <= n; got n={n}, f={f}")
    norms = _norms(g)
    k = arc_clip_count(n, f)
    ascending = torch.sort(norms, stable=True)
    threshold = float(ascending.values[n - k - 1]) if k < n else 0.0
    factors = torch.ones(n, dtype=torch.float64)
    for i in ascending.indices[n - k:].tolist():
        if norms[i] > threshold:
            factors[i] = threshold / float(norms[i])
    return _scaling("arc", factors, threshold, {"num_clipped": k})


def static_clipping_mixing(g: torch.Tensor, max_norm: float) -> tuple[torch.Tensor, StepRecord]:
    r"""Static clipping from the Gram matrix: factor :math:`\min(1, C / \lVert x_i\rVert)`.

    Parameters
    ----------
    g : torch.Tensor
        ``(n, n)`` Gram matrix of the input rows.
    max_norm : float
        The bound :math:`C > 0`.

    Returns
    -------
    tuple of torch.Tensor and StepRecord
        Diagonal ``M`` of the clip factors and the record.
    """
    g = _check_gram(g)
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not max_norm > 0:
        raise ValueError(f"static clipping requires max_norm > 0; got {max_norm!r}")
    norms = _norms(g)
    factors = torch.where(norms > max_norm, max_norm / norms.clamp_min(1e-300), torch.ones_like(norms))
    return _scaling("clipping", factors, float(max_norm))


def _bucket_permutation(n: int, generator: torch.Generator | None, permutation) -> list[int]:
    if permutation is not None:
        perm = [int(i) for i in torch.as_tensor(permutation).flatten().tolist()]
        if sorted(perm) != list(range(n)):
            raise ValueError(f"permutation must hold every row index 0..{n - 1} once; got {perm}")
        return perm
    return torch.randperm(n, generator=generator).tolist()


def bucketing_mixing(g: torch.Tensor, bucket_size: int, generator: torch.Generator | None = None,
                     permutation: Sequence[int] | torch.Tensor | None = None) -> tuple[torch.Tensor, StepRecord]:
    r"""Bucketing: the rows in a random order :math:`\pi`, cut into buckets of ``bucket_size``
    consecutive rows (the last one smaller if ``bucket_size`` does not divide n), each bucket
    replaced by its mean: :math:`\lceil n / s\rceil` output rows.

    Parameters
    ----------
    g : torch.Tensor
        ``(n, n)`` Gram matrix of the input rows (only its size is used).
    bucket_size : int
        ``s >= 1``.
    generator : torch.Generator or None
        Draws :math:`\pi` (``torch.randperm``); None: the global generator.
    permutation : sequence of int or None
        :math:`\pi` itself (overrides ``generator``).

    Returns
    -------
    tuple of torch.Tensor and StepRecord
        ``M`` ``(ceil(n/s), n)`` and the record (``members``: the buckets).
    """
    g = _check_gram(g)
    n = g.shape[0]
    if isinstance(bucket_size, bool) or not isinstance(bucket_size, int) or bucket_size < 1:
        raise ValueError(f"bucketing requires an int bucket_size >= 1; got {bucket_size!r}")
    perm = _bucket_permutation(n, generator, permutation)
    buckets = [perm[a:a + bucket_size] for a in range(0, n, bucket_size)]
    m = torch.zeros(len(buckets), n, dtype=torch.float64)
    for b, members in enumerate(buckets):
        m[b, members] = 1.0 / len(members)
    return m, StepRecord("bucketing", m, buckets, torch.ones(n, dtype=torch.float64), None, {"permutation": perm})


def _apply(x: torch.Tensor, m: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``M @ x`` in ``x``'s dtype (into ``out`` when given); a diagonal ``M`` scales the rows (one
    read, one write). Writing a fresh ``(n', d)`` tensor is dominated by page-faulting new memory
    for large models: pass a reusable ``out``.
    """
    if out is not None and (tuple(out.shape) != (m.shape[0], x.shape[1]) or out.dtype != x.dtype or out.device != x.device):
        raise ValueError(f"out must have shape ({m.shape[0]}, {x.shape[1]}), dtype {x.dtype} and device {x.device}; "
                         f"got {tuple(out.shape)}, {out.dtype}, {out.device}")
    if m.shape[0] == m.shape[1] and bool((m == torch.diag(torch.diagonal(m))).all()):
        scale = torch.diagonal(m).to(dtype=x.dtype, device=x.device)[:, None]
        return x * scale if out is None else torch.mul(x, scale, out=out)
    w = m.to(dtype=x.dtype, device=x.device)
    return w @ x if out is None else torch.mm(w, x, out=out)


def _one(x: torch.Tensor, mixing: Callable[[torch.Tensor], tuple[torch.Tensor, StepRecord]],
         out: torch.Tensor | None) -> tuple[torch.Tensor, StepRecord]:
    check_updates(x)
    m, rec = mixing(gram(x))
    return _apply(x, m, out), rec


def nnm(x: torch.Tensor, f: int, out: torch.Tensor | None = None) -> tuple[torch.Tensor, StepRecord]:
    r"""Nearest-neighbour mixing (NNM): every update replaced by the mean of its ``n - f``
    nearest updates (itself included).

    .. math:: y_i = \frac{1}{n-f} \sum_{j \in N_i} x_j,\qquad
              N_i = \text{the } n - f \text{ rows nearest to } x_i

    Allouah, Farhadkhani, Guerraoui, Gupta, Pinot, Stephan, "Fixing by Mixing: A Recipe for
    Optimal Byzantine ML under Heterogeneity", AISTATS 2023 (ByzFL ``NNM``). Distances come from
    the Gram matrix (one pass), the mixing is one product :math:`M x`: :math:`n (n - f) d`
    multiply-adds, so at large n it is compute bound rather than a read.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Assumed number of Byzantine updates, ``0 <= f < n``.
    out : torch.Tensor or None
        Where the ``(n', d)`` result goes (a reusable buffer: a fresh tensor of a large model costs
        more to page in than to compute); None: a new tensor.

    Returns
    -------
    tuple of torch.Tensor and StepRecord
        The mixed ``(n, d)`` stack and the record (``members[i]``: hospital ``i``'s neighbours).
    """
    return _one(x, lambda g: nnm_mixing(g, f), out)


def arc(x: torch.Tensor, f: int, out: torch.Tensor | None = None) -> tuple[torch.Tensor, StepRecord]:
    r"""Adaptive robust clipping (ARC): the :math:`k = \lfloor 2f(n-f)/n \rfloor` largest updates
    are clipped to the norm of the :math:`(k+1)`-th largest.

    .. math:: y_i = \min\Bigl(1, \frac{\lVert x_{\pi(n-k)}\rVert}{\lVert x_i\rVert}\Bigr) x_i,
              \qquad \lVert x_{\pi(1)}\rVert \le \dots \le \lVert x_{\pi(n)}\rVert

    Allouah, Guerraoui, Gupta, Jellouli, Rizk, Stephan, "The Vital Role of Gradient Clipping in
    Byzantine-Resilient Distributed Learning", arXiv:2405.14432, 2024 (ByzFL ``ARC``). ByzFL
    computes k as ``int(2 f / n * (n - f))`` in floating point; here the exact integer floor.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    f : int
        Assumed number of Byzantine updates, ``0 <= f <= n``.
    out : torch.Tensor or None
        Where the ``(n', d)`` result goes (a reusable buffer: a fresh tensor of a large model costs
        more to page in than to compute); None: a new tensor.

    Returns
    -------
    tuple of torch.Tensor and StepRecord
        The clipped ``(n, d)`` stack and the record (``clipped``, ``factors``, ``threshold``).
    """
    return _one(x, lambda g: arc_mixing(g, f), out)


def static_clipping(x: torch.Tensor, max_norm: float, out: torch.Tensor | None = None) -> tuple[torch.Tensor, StepRecord]:
    r"""Static clipping: :math:`y_i = \min(1, C / \lVert x_i\rVert) x_i` (ByzFL ``Clipping``; the
    clipping of :func:`~hospitrust.aggregation.clip_rows` with a record).

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    max_norm : float
        The bound :math:`C > 0`.
    out : torch.Tensor or None
        Where the ``(n', d)`` result goes (a reusable buffer: a fresh tensor of a large model costs
        more to page in than to compute); None: a new tensor.

    Returns
    -------
    tuple of torch.Tensor and StepRecord
        The clipped ``(n, d)`` stack and the record.
    """
    return _one(x, lambda g: static_clipping_mixing(g, max_norm), out)


def bucketing(x: torch.Tensor, bucket_size: int, generator: torch.Generator | None = None,
              permutation: Sequence[int] | torch.Tensor | None = None, out: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, StepRecord]:
    r"""Bucketing: the updates in a random order, averaged in buckets of ``bucket_size``.

    .. math:: y_b = \frac{1}{|B_b|} \sum_{i \in B_b} x_{i},\qquad
              B_b = \{\pi(bs + 1), \dots, \pi(\min(n, (b+1)s))\}

    Karimireddy, He, Jaggi, "Byzantine-Robust Learning on Heterogeneous Datasets via
    Bucketing", ICLR 2022 (ByzFL ``Bucketing``). :math:`\lceil n/s\rceil` rows come out.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    bucket_size : int
        ``s >= 1``.
    generator : torch.Generator or None
        Draws the order; None: the global generator.
    permutation : sequence of int or None
        The order itself (overrides ``generator``).
    out : torch.Tensor or None
        Where the ``(n', d)`` result goes (a reusable buffer: a fresh tensor of a large model costs
        more to page in than to compute); None: a new tensor.

    Returns
    -------
    tuple of torch.Tensor and StepRecord
        The ``(ceil(n/s), d)`` bucket means and the record (``members``: the buckets).
    """
    check_updates(x)
    m, rec = bucketing_mixing(torch.zeros(x.shape[0], x.shape[0], dtype=torch.float64), bucket_size, generator,
                              permutation)
    return _apply(x, m, out), rec


def chain(x: torch.Tensor, steps: Sequence[Callable[[torch.Tensor], tuple[torch.Tensor, StepRecord]]],
          out: torch.Tensor | None = None) -> tuple[torch.Tensor, list[StepRecord]]:
    r"""Apply pre-aggregation steps in order: :math:`y = M_k \cdots M_1 x`.

    Each step is a ``*_mixing`` function with its options bound (``functools.partial(nnm_mixing,
    f=2)``): it gets the Gram matrix of its input, :math:`M_{j-1} \cdots M_1 G (M_{j-1}
    \cdots M_1)^\top`, and returns its mixing matrix. One pass over ``x`` for :math:`G` and one
    product at the end, however many steps; equal to applying the steps one after another.

    Parameters
    ----------
    x : torch.Tensor
        Stacked updates ``(n, d)``.
    steps : sequence of callables
        ``gram -> (mixing, StepRecord)``; empty: ``x`` unchanged.
    out : torch.Tensor or None
        Where the ``(n', d)`` result goes (a reusable buffer: a fresh tensor of a large model costs
        more to page in than to compute); None: a new tensor.

    Returns
    -------
    tuple of torch.Tensor and list of StepRecord
        The transformed ``(n', d)`` stack and one record per step.
    """
    n, _ = check_updates(x)
    if not steps:
        return x, []
    g = gram(x).cpu()
    total = torch.eye(n, dtype=torch.float64)
    records = []
    for step in steps:
        m, rec = step(g)
        if m.shape[1] != g.shape[0]:
            raise ValueError(f"a pre-aggregation step returned a mixing matrix of shape {tuple(m.shape)} "
                             f"for {g.shape[0]} input rows")
        g = m @ g @ m.T
        total = m @ total
        records.append(rec)
    return _apply(x, total, out), records


def origin(records: Sequence[StepRecord]) -> torch.Tensor:
    """The weight of every hospital in every output row of a chain: ``M_k ... M_1``.

    Parameters
    ----------
    records : sequence of StepRecord
        The records of a chain, in order.

    Returns
    -------
    torch.Tensor
        ``(n_out, n)`` float64; row ``r`` says how much of each hospital's update is in output row
        ``r`` (a clipping step scales its row; a mixing step spreads it).
    """
    if not records:
        raise ValueError("origin needs at least one step record")
    total = records[0].mixing
    for rec in records[1:]:
        total = rec.mixing @ total
    return total



# ---- a run's chain: step names, their options bound, applied per round -----------------------

#: The steps a chain may name, in the run config's spelling (``pre-aggregation = "arc,nnm"``).
STEPS = ("nnm", "arc", "bucketing", "clipping")
#: The values that mean "no pre-aggregation".
NO_CHAIN = ("", "none")


def parse_chain(text: str) -> tuple[str, ...]:
    """The steps of a chain as the run config writes it: ``"arc,nnm"`` -> ``("arc", "nnm")``.

    Parameters
    ----------
    text : str
        ``""`` or ``"none"`` (no pre-aggregation), one step, or steps separated by commas (spaces
        around them are ignored), applied left to right.

    Returns
    -------
    tuple of str
        The steps in order; empty for no pre-aggregation.

    Raises
    ------
    ValueError
        Naming the unknown steps and the allowed ones.
    """
    if not isinstance(text, str):
        raise ValueError(f"pre-aggregation must be a string such as 'arc,nnm'; got {type(text).__name__} {text!r}")
    if text.strip().lower() in NO_CHAIN:
        return ()
    steps = tuple(part.strip() for part in text.split(","))
    bad = [s for s in steps if s not in STEPS]
    if bad:
        shown = ", ".join(repr(s) for s in bad)
        raise ValueError(f"unknown pre-aggregation step{'s' if len(bad) > 1 else ''} {shown} in {text!r}; allowed steps: "
                         f"{', '.join(STEPS)}, or a chain of them separated by commas (e.g. 'arc,nnm'), or '' / 'none' "
                         "for no pre-aggregation")
    return steps


def rows_before_each_step(steps: Sequence[str], n: int, bucket_size: int) -> list[int]:
    """How many rows each step of a chain gets from ``n`` input rows, then how many come out
    (bucketing turns ``r`` rows into ``ceil(r / bucket_size)``; the other steps keep them).

    Parameters
    ----------
    steps : sequence of str
        The chain (:func:`parse_chain`).
    n : int
        Input rows.
    bucket_size : int
        Bucketing's ``s``.

    Returns
    -------
    list of int
        ``len(steps) + 1`` counts.
    """
    rows = [int(n)]
    for step in steps:
        rows.append(-(-rows[-1] // bucket_size) if step == "bucketing" else rows[-1])
    return rows


def carried_rows(record: StepRecord) -> list[int]:
    """For every input row of a step, the output row that carries it: its bucket for bucketing,
    itself for the steps that keep the rows (NNM's row ``i`` is row ``i``'s neighbourhood).

    Parameters
    ----------
    record : StepRecord
        The step's record.

    Returns
    -------
    list of int
        One output row index per input row.
    """
    n_out, n_in = record.mixing.shape
    if record.step != "bucketing":
        if n_out != n_in:
            raise ValueError(f"step {record.step!r} changed the number of rows ({n_in} -> {n_out})")
        return list(range(n_in))
    out = [-1] * n_in
    for bucket, members in enumerate(record.members):
        for i in members:
            out[i] = bucket
    return out


@dataclass(frozen=True)
class PreAggregated:
    """What a chain did to one round's stack.

    Parameters
    ----------
    rows : torch.Tensor
        ``(n, d)``: for every input row (hospital), the chain's output row that carries it; what
        the rule gets. Without bucketing this is the chain's output itself; with bucketing, every
        member of a bucket gets the bucket's row (a rule keeps one row per hospital, so its
        per-hospital records and state stay aligned with the hospitals).
    records : list of StepRecord
        One per step, in order.
    row_of : list of int
        For every input row, the index of its row in the chain's output (``rows[i] = out[row_of[i]]``
        with one row per hospital; ``rows[row_of[i]]`` with the chain's own rows).
    out_rows : int
        How many rows the chain itself produced (``ceil(n / s)`` after one bucketing).
    groups : list of list of int or None
        With ``PreAggregationChain.bucket_means`` (ByzFL's way): ``rows`` is the chain's own output
        (``out_rows`` rows) and ``groups[r]`` the input rows (hospitals) that row ``r`` carries. None:
        ``rows`` has one row per input row.
    """

    rows: torch.Tensor
    records: list[StepRecord]
    row_of: list[int]
    out_rows: int
    groups: list[list[int]] | None = None


@dataclass(frozen=True)
class PreAggregationChain:
    """A run's pre-aggregation: the chain's steps with their options bound, applied per round.

    What a caller without the run config needs (an attack that puts the chain in its loop):
    ``PreAggregationChain(("arc", "nnm"), f=2).apply(server_round, updates).rows`` is what the
    rule sees. :func:`hospitrust.features.pre_aggregators.pre_aggregation_chain` builds it from a
    run config.

    Parameters
    ----------
    steps : tuple of str
        Step names (:data:`STEPS`), applied left to right.
    f : int
        Assumed number of Byzantine rows (NNM, ARC): the run's ``assumed-malicious``.
    bucket_size : int
        Bucketing's ``s``.
    max_norm : float
        Static clipping's bound ``C``.
    seed : int
        Seeds bucketing's order with the round (:meth:`generator`): the same seed and round give
        the same buckets.
    bucket_means : bool
        Hand the rule the chain's own rows (ByzFL and the paper: ``ceil(n / s)`` bucket means after
        bucketing; ``PreAggregated.groups`` says which hospitals each carries). False: one row per
        hospital, every member of a bucket handing the rule its bucket's mean.
    """

    steps: tuple[str, ...]
    f: int = 0
    bucket_size: int = 2
    max_norm: float = 1.0
    seed: int = 0
    bucket_means: bool = False

    def __post_init__(self) -> None:
        unknown = [s for s in self.steps if s not in STEPS]
        if unknown:
            raise ValueError(f"unknown pre-aggregation steps {unknown}; allowed: {', '.join(STEPS)}")
        check_f(self.f)
        if isinstance(self.bucket_size, bool) or not isinstance(self.bucket_size, int) or self.bucket_size < 1:
            raise ValueError(f"bucket_size must be an int >= 1; got {self.bucket_size!r}")
        if not self.max_norm > 0:
            raise ValueError(f"max_norm must be > 0; got {self.max_norm!r}")

    def generator(self, server_round: int, index: int) -> torch.Generator:
        """Bucketing's random order for step ``index`` of the chain in ``server_round``: seeded from
        the run's seed, the round and the step's place (two bucketing steps draw different orders),
        apart from every other seeded draw of the run.
        """
        seed = np.random.SeedSequence([self.seed, server_round, index, 0x6275636B]).generate_state(1, np.uint64)[0]
        return torch.Generator().manual_seed(int(seed) & 0x7FFF_FFFF_FFFF_FFFF)

    def mixings(self, server_round: int) -> list[Callable[[torch.Tensor], tuple[torch.Tensor, StepRecord]]]:
        """The steps of ``server_round`` as :func:`chain` takes them (Gram matrix -> mixing, record)."""
        out: list[Callable[[torch.Tensor], tuple[torch.Tensor, StepRecord]]] = []
        for index, step in enumerate(self.steps):
            if step == "nnm":
                out.append(functools.partial(nnm_mixing, f=self.f))
            elif step == "arc":
                out.append(functools.partial(arc_mixing, f=self.f))
            elif step == "clipping":
                out.append(functools.partial(static_clipping_mixing, max_norm=float(self.max_norm)))
            else:
                out.append(functools.partial(bucketing_mixing, bucket_size=self.bucket_size,
                                             generator=self.generator(server_round, index)))
        return out

    def apply(self, server_round: int, updates: torch.Tensor) -> PreAggregated:
        """The chain on one round's stack ``(n, d)``: :class:`PreAggregated` (``rows``: what the rule sees;
        with ``bucket_means`` and a chain that changed the number of rows, ``groups``: whom each row carries).
        """
        n, _ = check_updates(updates)
        out, records = chain(updates, self.mixings(server_round))
        row_of = list(range(n))
        for rec in records:
            carried = carried_rows(rec)
            row_of = [carried[r] for r in row_of]
        if self.bucket_means and out.shape[0] != n:
            groups = [[i for i in range(n) if row_of[i] == r] for r in range(out.shape[0])]
            return PreAggregated(out, records, row_of, int(out.shape[0]), groups)
        rows = out
        if out.shape[0] != n:
            rows = out.index_select(0, torch.tensor(row_of, dtype=torch.long, device=out.device))
        return PreAggregated(rows, records, row_of, int(out.shape[0]))
