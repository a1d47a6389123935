"""What the terminal says: the rule's actions per round by hospital, attackers flagged against the
truth, the run's TPR/FPR line, and progress while replies are awaited (in place on a terminal)."""

from __future__ import annotations

import io
import math
import re

from hospitrust.ops.simulate import CLEAR_LINE, copy_lines
from hospitrust.records import HospitalRecord
from hospitrust.server_app import transport
from hospitrust.server_app.story import detection_line, round_story, rule_actions


def _client(name, *, selected=True, rejected=False, flagged=None, weight=math.nan, n=10):  # NaN: no weight to judge
    return HospitalRecord(name, selected=selected, rejected=rejected, flagged=flagged, weight=weight, num_examples=n)


CLIENTS = [_client("hospital-10"), _client("hospital-2", selected=False), _client("hospital-7", selected=False),
           _client("hospital-3", flagged=True), _client("hospital-1", rejected=True), _client("hospital-0")]


def test_the_rule_actions_by_hospital_in_natural_order():
    assert rule_actions(CLIENTS) == {"rejected": ["hospital-1"], "excluded": ["hospital-2", "hospital-7"],
                                     "down-weighted": ["hospital-3"]}
    assert round_story(CLIENTS, None) == "  | rejected hospital-1; excluded hospital-2, hospital-7; down-weighted hospital-3"
    assert round_story([_client("hospital-0")], None) == "  | rule kept every reply"


def test_down_weighted_is_below_half_the_fedavg_share():
    # FedAvg shares of the kept replies: 10/40, 10/40, 20/40; hospital-0 gets 0.1 < 0.125, hospital-1 0.2 >= 0.125
    clients = [_client("hospital-0", weight=0.1), _client("hospital-1", weight=0.2), _client("hospital-2", weight=0.7, n=20),
               _client("hospital-3", selected=False, weight=0.0, n=100)]
    assert rule_actions(clients)["down-weighted"] == ["hospital-0"]
    fedavg = [_client("hospital-0", weight=0.25), _client("hospital-1", weight=0.25), _client("hospital-2", weight=0.5, n=20)]
    assert round_story(fedavg, None) == "  | rule kept every reply"


def test_flagged_against_the_true_attackers():
    truth = {"hospital-7": True, "hospital-10": True}  # hospital-10 got through; hospital-2, -3, -1 are honest
    assert round_story(CLIENTS, truth).endswith(
        "| attackers flagged 1/2 (missed hospital-10), honest flagged 3 (hospital-1, hospital-2, hospital-3)")
    assert round_story([_client("hospital-0")], {}).endswith("| attackers flagged 0/0, honest flagged 0")


def test_a_long_list_of_names_is_cut():
    many = [_client(f"hospital-{i}", selected=False) for i in range(9)]
    assert round_story(many, None).endswith("hospital-5 +3 more")


def test_the_detection_line_counts_hospital_rounds():
    # 15 attacker replies of which 2 flagged; 35 honest, none flagged
    line = detection_line({"tpr": 2 / 15, "fpr": 0.0, "tp": 2, "fn": 13, "fp": 0, "tn": 35})
    assert line == ("detection over all hospital-rounds: TPR 0.133 (2 of 15 attacker replies flagged)  "
                    "FPR 0.000 (0 of 35 honest replies flagged)")
    assert "TPR n/a (0 of 0" in detection_line({"tpr": math.nan, "fpr": 0.0, "tp": 0, "fn": 0, "fp": 0, "tn": 4})


class _SlowGrid:
    """Flower's simulation grid as far as Sent uses it: one reply per pull, after the first few pulls."""

    # the simulation grid's traits (push, then pull at its interval); its messages are labels: nothing to pack
    traits = transport.GridTraits(pipelines=False, answers_in_one_pull=False, pull_interval=0.01, packs_arrays=False)
    pull_interval = 0.01

    def __init__(self, n, silent_pulls):
        self.n, self.silent, self.pulls = n, silent_pulls, 0

    def push_messages(self, messages):
        return [f"m{i}" for i in range(len(messages))]

    def pull_messages(self, ids):
        self.pulls += 1
        if self.pulls <= self.silent or not ids:
            return []
        mid = sorted(ids)[0]

        class Reply:
            class metadata:
                reply_to_message_id = mid

            def has_error(self) -> bool:  # a hospital's reply, not the SuperLink's Node Unavailable
                return False
        return [Reply()]


def test_a_long_wait_logs_how_many_hospitals_replied(monkeypatch):
    logged = []
    monkeypatch.setattr(transport, "log", lambda level, fmt, *a: logged.append(fmt % a))
    monkeypatch.setattr(transport, "PROGRESS_SECONDS", 0.05)
    replies = transport.Sent(_SlowGrid(3, silent_pulls=15), ["a", "b", "c"], timeout=30).replies()
    assert len(replies) == 3
    counts = [re.fullmatch(r"hospitrust: waiting for replies: (\d)/3 hospitals replied after \d+ s", line) for line in logged]
    assert logged and all(counts), logged
    replied = [int(m.group(1)) for m in counts if m]
    assert replied[0] == 0 and replied == sorted(replied) and replied[-1] < 3  # counts up; none once all replied
    logged.clear()
    monkeypatch.setattr(transport, "PROGRESS_SECONDS", 60.0)
    assert len(transport.Sent(_SlowGrid(2, silent_pulls=2), ["a", "b"], timeout=30).replies()) == 2
    assert logged == []  # a short wait says nothing


def test_progress_lines_are_redrawn_on_a_terminal_and_plain_when_piped():
    text = ("INFO: round 0\n"
            f"INFO: {transport.progress_line(1, 4, 15)}\n"
            f"INFO: {transport.progress_line(3, 4, 30)}\n"
            "INFO: round 1/1 ...\n")
    piped = io.StringIO()
    copy_lines(io.StringIO(text), piped, tty=False)
    assert piped.getvalue() == text
    term = io.StringIO()
    copy_lines(io.StringIO(text), term, tty=True)
    assert term.getvalue() == ("INFO: round 0\n" + CLEAR_LINE + f"INFO: {transport.progress_line(1, 4, 15)}"
                               + CLEAR_LINE + f"INFO: {transport.progress_line(3, 4, 30)}" + CLEAR_LINE
                               + "INFO: round 1/1 ...\n")
