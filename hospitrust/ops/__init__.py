"""Running hospitrust's processes: Flower's processes and the flwr CLI (``flwr``), simulation
(``simulate``), the in-process grid (``inprocess``) and a real federation's SuperLink, SuperNodes
and the hospital's gate (``deploy``). The commands are ``hospitrust.cli``'s; the console, the PKI,
process supervision and the data check have packages of their own.
"""
