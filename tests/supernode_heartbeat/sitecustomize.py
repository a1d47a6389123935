"""The test federation's one change to Flower's SuperNode: its heartbeat interval.

The SuperNode declares a 30 s heartbeat interval (Flower 1.42's ``HEARTBEAT_DEFAULT_INTERVAL``; no
option sets it) and the SuperLink lists it offline two intervals after its last beat, so each
scenario that kills a SuperNode waits a minute for the SuperLink to notice. Here the SuperNode
declares ``HOSPITRUST_TEST_SUPERNODE_HEARTBEAT`` seconds (10 unless set, the least Flower's
SuperLink accepts; ``30`` is Flower's) and beats accordingly: test_deploy's killed-SuperNode
scenario took 43 s instead of 72 s (docs/testing.md, "The test federation's SuperNodes").
Nothing else of the SuperNode changes: the same binary, TLS, node authentication, process
isolation and its 3 s idle poll (shortening that to 0.5 s the same way saved nothing measurable).
A deployed SuperNode keeps Flower's 30 s, which also spares a SuperLink with many hospitals the
extra beats.

``tests/federation.py`` puts this folder first on ``PYTHONPATH`` for the federation's processes;
Python imports ``sitecustomize`` at start, and this one acts only in a ``flower-supernode``.
"""

import os
import sys

if sys.argv and os.path.basename(sys.argv[0]) == "flower-supernode":
    import flwr.supercore.heartbeat as _beats
    import flwr.supernode.fleet_http_connection as _connection

    HEARTBEAT = float(os.environ.get("HOSPITRUST_TEST_SUPERNODE_HEARTBEAT", "10"))
    # what the SuperNode declares to the SuperLink (its activation and every beat), and how often its sender beats
    _connection.HEARTBEAT_DEFAULT_INTERVAL = HEARTBEAT  # type: ignore[assignment]
    _beats.HEARTBEAT_DEFAULT_INTERVAL = HEARTBEAT  # type: ignore[assignment]
