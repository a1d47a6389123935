"""How the exchange treats a grid: by its traits (declared, or Flower's grid kind by isinstance),
never by the class's name."""

from __future__ import annotations

from flwr.serverapp import Grid
from flwr.superlink.grid import HttpGrid, InMemoryGrid

from hospitrust.ops.inprocess import InProcessGrid
from hospitrust.server_app.transport import DEPLOYED, POLL_SECONDS, GridTraits, grid_traits, pipelines


def _bare(cls):
    return cls.__new__(cls)  # no SuperLink behind it: only the grid's kind and attributes matter here


def test_the_in_process_grid_declares_its_traits():
    # it hands Message objects over, no wire: nothing packed (hospitrust.wire); the deployed grid packs
    assert grid_traits(_bare(InProcessGrid)) == GridTraits(pipelines=True, answers_in_one_pull=True, pull_interval=0.0,
                                                           packs_arrays=False)
    assert DEPLOYED.packs_arrays


def test_flowers_deployed_grid_pipelines_and_polls_quickly():
    assert grid_traits(_bare(HttpGrid)) == DEPLOYED
    assert DEPLOYED.pipelines and not DEPLOYED.answers_in_one_pull and DEPLOYED.pull_interval == POLL_SECONDS


def test_a_renamed_deployed_grid_is_still_a_deployed_grid():
    class ConsortiumGrid(HttpGrid):  # a wrapper with another name keeps the capability
        pass

    assert pipelines(_bare(ConsortiumGrid))


def test_the_simulation_grid_pushes_then_pulls_at_its_own_interval():
    grid = _bare(InMemoryGrid)
    grid.pull_interval = 0.25
    assert grid_traits(grid) == GridTraits(pipelines=False, answers_in_one_pull=False, pull_interval=0.25)


def test_a_grid_of_another_kind_gets_the_safe_choice_and_a_declared_one_is_taken_at_its_word():
    class OtherGrid(Grid):
        pass

    OtherGrid.__abstractmethods__ = frozenset()
    assert not pipelines(OtherGrid())
    OtherGrid.traits = GridTraits(pipelines=True, answers_in_one_pull=False, pull_interval=0.5)
    assert grid_traits(OtherGrid()).pull_interval == 0.5


def test_the_pulls_back_off_while_nothing_arrives_and_speed_up_after_a_reply(monkeypatch):
    """0.1 s after the push and after a reply; each empty pull stretches the wait by 1.5, up to 0.5 s."""
    from types import SimpleNamespace

    from hospitrust.server_app import transport

    class Scripted(Grid):
        # its messages are labels, not Messages: nothing to pack
        traits = GridTraits(pipelines=True, answers_in_one_pull=False, pull_interval=POLL_SECONDS, packs_arrays=False)

        def __init__(self, arrivals):
            self.arrivals, self.pulls = arrivals, 0  # pull index -> the message ids answered then

        def push_messages(self, messages):
            return [f"m{i}" for i, _ in enumerate(messages)]

        def pull_messages(self, ids):
            self.pulls += 1
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=m), has_error=lambda: False)
                    for m in self.arrivals.get(self.pulls, [])]

    Scripted.__abstractmethods__ = frozenset()
    waits = []
    monkeypatch.setattr(transport.time, "sleep", waits.append)
    grid = Scripted({8: ["m0"], 10: ["m1"]})
    replies = transport.Sent(grid, ["a", "b"], timeout=None).replies()
    assert len(replies) == 2 and grid.pulls == 10
    expected = [0.1, 0.15, 0.225, 0.3375, 0.5, 0.5, 0.5, 0.1, 0.15]  # pull 8 brought a reply: back to 0.1
    assert [round(w, 6) for w in waits] == expected
    assert transport.POLL_BACKOFF == 1.5 and transport.POLL_MAX_SECONDS == 0.5
