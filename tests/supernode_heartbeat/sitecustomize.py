"""The test federation's one change to Flower's SuperNode: its heartbeat interval.

The SuperNode declares a 30 s heartbeat interval (Flower 1.42's ``HEARTBEAT_DEFAULT_INTERVAL``; no
option sets it) and the SuperLink lists it offline two intervals after its last beat, so each
scenario that kills a SuperNode waits a minute for the SuperLink to notice. Here the SuperNode
declares ``HOSPITRUST_TEST_SUPERNODE_HEARTBEAT`` seconds (10 unless set, the least Flower's
SuperLink accepts; ``30`` is Flower's) and beats accordingly: test_deploy's killed-SuperNode
scenario took 43 s instead of 72 s (docs/testing.md, "The test federation's SuperNodes").
Nothing else of the SuperNode changes but its idle poll and a task token's lapse (below): the same
binary, TLS, node authentication and process isolation.

Its **idle poll**: Flower's SuperNode sleeps 3 s after a pull that found no message, so each message of a round
(the query, each round's train and evaluate) waited up to 3 s (2.25 s on average for the last of three
hospitals). Here it sleeps ``HOSPITRUST_TEST_SUPERNODE_POLL`` seconds (1 unless set; ``3`` is Flower's): on
test_hospital_control's seven runs, measured back to back on 2026-12-06 at 3 s and 0.5 s, the runs took 133.8 s
and 116.0 s in all (their ServerApps' own "finished in"), the module 215 s and 196 s.
A deployed SuperNode keeps Flower's 30 s, which also spares a SuperLink with many hospitals the
extra beats.

The second change is a ClientApp's **task token lapse**: Flower 1.42's SuperNode drops a ClientApp's task token
two 30 s intervals after its last beat (60 s), so the scenario that pauses ClientApps across a SuperLink crash
(issue 47's hang) slept 65 s. Here the SuperNode drops it ``HOSPITRUST_TEST_TASK_TOKEN_LAPSE`` seconds after the
last beat (15 unless set; ``60`` is Flower's) and the ClientApps, forked by the warm launcher, beat every 3.5-4.5 s
instead of 17.5-22.5 s (more than three beats per lapse, as Flower's 60 s hold about three). The window in which a
claimed task must start (Flower's 30 s) is unchanged.

``tests/federation.py`` puts this folder first on ``PYTHONPATH`` for the federation's processes;
Python imports ``sitecustomize`` at start, and this one acts only in a ``flower-supernode`` (also run by the
supervisor as ``python -m hospitrust.supervision.supernode_main .../flower-supernode``) and in the ClientApp launcher (``python -m hospitrust.supervision.launcher``), whose forked ClientApps inherit it.
"""

import os
import sys

_ORIG = getattr(sys, "orig_argv", [])
# flower-supernode itself, or under the supervisor's hospitrust.supervision.supernode_main (Flower's script its argument)
if (sys.argv and os.path.basename(sys.argv[0]) == "flower-supernode") or (
        _ORIG[1:3] == ["-m", "hospitrust.supervision.supernode_main"] and os.path.basename(_ORIG[3:4][0] if _ORIG[3:4] else "") == "flower-supernode"):
    import flwr.supercore.heartbeat as _beats
    import flwr.supernode.fleet_http_connection as _connection

    HEARTBEAT = float(os.environ.get("HOSPITRUST_TEST_SUPERNODE_HEARTBEAT", "10"))
    # what the SuperNode declares to the SuperLink (its activation and every beat), and how often its sender beats
    _connection.HEARTBEAT_DEFAULT_INTERVAL = HEARTBEAT  # type: ignore[assignment]
    _beats.HEARTBEAT_DEFAULT_INTERVAL = HEARTBEAT  # type: ignore[assignment]

    # a ClientApp's task token lapses TOKEN_LAPSE s after its last beat: Flower multiplies its patience (2) by the
    # 30 s interval there and nowhere else in these modules; the claim window (the interval alone) stays 30 s
    import flwr.supercore.corestate.in_memory_corestate as _memory_state
    import flwr.supercore.corestate.sql_corestate as _sql_state

    TOKEN_LAPSE = float(os.environ.get("HOSPITRUST_TEST_TASK_TOKEN_LAPSE", "15"))
    for _state in (_memory_state, _sql_state):
        _state.HEARTBEAT_PATIENCE = TOKEN_LAPSE / _state.HEARTBEAT_DEFAULT_INTERVAL  # type: ignore[assignment]

    # its idle poll: 1 s between empty pulls instead of 3 s (every message of a round waited up to 3 s for it)
    POLL = float(os.environ.get("HOSPITRUST_TEST_SUPERNODE_POLL", "1"))
    if POLL != 3:
        import time as _time

        import flwr.supernode.start_client_internal as _loop

        class _PollClock:
            """The loop's `time`, but for its idle sleep of 3 s between pulls."""

            def __getattr__(self, name):
                return getattr(_time, name)

            @staticmethod
            def sleep(seconds: float) -> None:
                _time.sleep(POLL if seconds == 3 else seconds)

        _loop.time = _PollClock()  # type: ignore[assignment]

elif _ORIG[1:3] == ["-m", "hospitrust.supervision.launcher"]:
    import flwr.supercore.heartbeat as _beats

    # each forked ClientApp beats every (interval - 5 s) x 0.7-0.9: 3.5-4.5 s at 10 s, within the lapse above
    _beats.HEARTBEAT_DEFAULT_INTERVAL = 10  # type: ignore[assignment]
