"""Differential privacy: DP-SGD at each hospital (``local``), Flower's central DP wrapper around
FedAvg (``hospitrust.features.central_privacy``, a round feature's part), and the budget each hospital owns (``ledger``). ``options`` is the
``privacy`` run-config section. Opacus is imported only where DP is on.
"""
