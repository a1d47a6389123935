"""The operator's console: its views by hand, its token gate, the static report, and the live page
in a real headless Chromium while an in-process run writes the run directory it serves."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from browser import ARTIFACTS, browser, wait_for  # noqa: F401  (browser is a fixture)
from conftest import small_run_config
from hospitrust.console import views
from hospitrust.console.runs import RunReader
from hospitrust.records import RoundRecord
from hospitrust.server_app.results import RunDirectory, read_round_records

# ------------------------------------------------------------------ views, by hand
ROUND = {
    "round": 3,
    "central": {"balanced_accuracy": 0.8, "auc": 0.9},
    "clients": [
        {"hospital": "h0", "weight": 0.6, "selected": True, "rejected": False, "reason": "", "reputation": 0.9,
         "s": 0.95, "malicious": False},
        {"hospital": "h1", "weight": 0.0, "selected": False, "rejected": True,
         "reason": "arrays contain NaN or Inf: ['w']", "malicious": True},
        {"hospital": "h2", "weight": 0.0, "selected": False, "rejected": False, "excluded": True,
         "exclusion_reason": "reputation 0.1 < mu - lambda MAD", "reputation": 0.1, "flagged": True, "malicious": False},
    ],
    "missing": ["h3"],
    "offline": ["h4"],
    "hospital_accuracy": {"h0": 0.75},
    "fairness": {"mean": 0.75},
}
# the same round as schema 1 wrote it (above) and as schema 2 writes it: the views read either
ROUNDS = [RoundRecord.from_json(ROUND), RoundRecord.from_json(json.loads(json.dumps(RoundRecord.from_json(ROUND).to_json())))]


def _run_list(driver, runs: int) -> dict[str, str]:
    """Run name -> its row's text, once the list shows ``runs`` runs: read in one go inside the wait, since the
    page's poll can re-render the list between finding a row and reading it (a stale element)."""
    def rows(d):
        listed = {r.text.split()[0]: r.text for r in d.find_elements("css selector", "#runs tr")[1:]}
        return listed if len(listed) >= runs else None

    return wait_for(driver, rows, what="the run list")


@pytest.mark.parametrize("record", ROUNDS, ids=["schema-1", "schema-2"])
def test_hospital_rows_say_what_happened_to_every_hospital_and_why(record):
    rows = {r["hospital"]: r for r in views.hospital_rows(record, ["h0", "h1", "h2", "h3", "h4", "h5"], ground_truth=True)}
    assert [rows[h]["status"] for h in ("h0", "h1", "h2", "h3", "h4", "h5")] == [
        "replied", "rejected", "excluded", "missing", "offline", "not asked"]
    assert rows["h1"]["reason"].startswith("arrays contain NaN") and rows["h1"]["malicious"]
    assert rows["h2"]["reason"].startswith("reputation 0.1") and rows["h2"]["flagged"]
    assert ["reputation", "0.9"] in rows["h0"]["signals"] and rows["h0"]["accuracy"] == 0.75
    assert not rows["h4"]["online"] and rows["h3"]["online"]
    assert views.hospital_rows(record, ["h1"], ground_truth=False)[0]["malicious"] is None  # no truth, no claim


@pytest.mark.parametrize("record", ROUNDS, ids=["schema-1", "schema-2"])
def test_alerts_name_the_exclusions_the_non_finite_update_and_who_went_offline(record):
    alerts = views.round_alerts(record, offline_before=set(), ground_truth=True, rare={"h2"})
    kinds = {(a["kind"], a["hospital"]) for a in alerts}
    assert {("non-finite", "h1"), ("excluded", "h2"), ("rare-holder-flagged", "h2"), ("offline", "h4"),
            ("missing", "h3")} <= kinds
    # an honest rare-class holder's flag is an alert only where the run knows who is honest
    assert not any(a["kind"] == "rare-holder-flagged" for a in
                   views.round_alerts(record, offline_before=set(), ground_truth=False, rare={"h2"}))
    assert not any(a["kind"] == "offline" for a in views.round_alerts(record, offline_before={"h4"}, ground_truth=True,
                                                                        rare=set()))  # once, when it goes offline


def test_rows_say_what_flower_said_node_unavailable_rejoined_and_an_offline_hospital_has_no_accuracy():
    record = RoundRecord.from_json({
        "round": 2, "clients": [{"hospital": "h0", "weight": 1.0, "rejected": False}], "missing": ["h1", "h2"],
        "node_unavailable": ["h1"], "unresponsive": ["h2"], "offline": ["h4"], "rejoined": ["h3", "h0"],
        "hospital_accuracy": {"h0": 0.7, "h3": 0.6, "h4": 0.5}})
    rows = {r["hospital"]: r for r in views.hospital_rows(record, ["h0", "h1", "h2", "h3", "h4"], ground_truth=False)}
    assert rows["h1"]["status"] == "node unavailable" and "Node Unavailable" in rows["h1"]["reason"]
    assert "reply-timeout" not in rows["h1"]["reason"] and not rows["h1"]["online"]
    assert rows["h2"]["status"] == "missing" and rows["h2"]["reason"].endswith("(unresponsive)")
    assert rows["h3"]["status"] == "rejoined" and rows["h3"]["online"] and rows["h3"]["accuracy"] == 0.6
    assert rows["h0"]["status"] == "replied" and rows["h0"]["reason"] == "back after missing the previous round"
    assert rows["h4"]["status"] == "offline" and rows["h4"]["accuracy"] is None  # whatever the record holds
    alerts = {(a["kind"], a["hospital"]): a["text"] for a in
              views.round_alerts(record, offline_before=set(), ground_truth=False, rare=set())}
    assert alerts[("node-unavailable", "h1")].startswith("round 2: h1 unavailable: Flower answered Node Unavailable")
    assert ("missing", "h1") not in alerts and ("missing", "h2") in alerts and ("rejoined", "h3") in alerts


def test_the_round_in_flight_keeps_a_node_unavailable_apart_from_the_late(tmp_path):
    from hospitrust.console.progress import round_in_flight

    path = tmp_path / "progress.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in [
        {"time": 100.0, "round": 1, "event": "asked", "reply_timeout": 60, "hospitals": ["a", "b"]},
        {"time": 101.0, "round": 1, "event": "unavailable", "hospital": "b", "reason": "node unavailable: ..."}]) + "\n")
    f = round_in_flight(path, 0, now=150.0)
    assert f["unavailable"] == {"b": "node unavailable: ..."} and f["waiting"] == ["a"] and f["late"] == ["a"]


def test_rare_holders_are_those_with_a_fair_share_of_the_rarest_class():
    assert views.rare_holders({"a": [10, 6], "b": [10, 0], "c": [10, 1]}) == {"a"}  # class 1: 7 in all, fair 2.33


def test_the_reader_follows_a_growing_rounds_file_and_a_rewritten_one(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"strategy": "hta", "hospitals": {"1": "h0"}, "num-server-rounds": 3}))
    lines = [json.dumps({"round": r, "clients": [{"hospital": "h0"}]}) for r in (1, 2, 3)]
    (run / "rounds.jsonl").write_text(lines[0] + "\n" + lines[1][:10])  # round 2 half written
    reader = RunReader(run, "run")
    assert reader.refresh() == 1 and [r.number for r in reader.rounds] == [1]
    with open(run / "rounds.jsonl", "a") as fh:
        fh.write(lines[1][10:] + "\n" + lines[2] + "\n")
    assert reader.refresh() == 2 and [r.number for r in reader.rounds] == [1, 2, 3]
    (run / "rounds.jsonl").write_text(lines[0] + "\n")  # a resume rewrote it: rounds after the checkpoint dropped
    reader.refresh()
    assert [r.number for r in reader.rounds] == [1]
    assert reader.status == "running"  # unfinished, written a moment ago
    (run / "failed.json").write_text(json.dumps({"error": "RuntimeError: boom"}))
    reader.refresh()
    assert reader.status == "failed" and reader.row()["failure"] == "RuntimeError: boom"


# ------------------------------------------------------------------ a real run, the report, the token
@pytest.fixture(scope="module")
def hta_run(tmp_path_factory, _medmnist_problem):
    """A short HTA run with a hospital that sends NaN (rejected with its reason)."""
    if _medmnist_problem:
        pytest.fail(_medmnist_problem, pytrace=False)
    from hospitrust.ops.inprocess import run_inprocess

    tmp = tmp_path_factory.mktemp("console")
    cfg = small_run_config(tmp, strategy="hta", attack="nan-update", **{"malicious-hospitals": "1",
                                                                        "num-server-rounds": 3, "run-name": "hta"})
    run_inprocess(cfg, 4)
    return tmp / "runs" / "hta"


def test_the_static_report_is_one_file_with_the_figures(hta_run, browser, tmp_path):
    from hospitrust.console.report import write_report

    written = write_report(hta_run, tmp_path / "report")
    assert [p.name for p in written] == ["report.html", "metrics.png", "trust.png"]
    html = (tmp_path / "report" / "report.html").read_text()
    assert "window.HOSPITRUST_REPORT" in html and 'src="static/' not in html and "<link" not in html  # self-contained
    browser.get((tmp_path / "report" / "report.html").as_uri())
    wait_for(browser, lambda d: len(d.find_elements("css selector", "#hospitals tr[data-hospital]")) == 4, what="4 rows")
    row = browser.find_element("css selector", '#hospitals tr[data-hospital="hospital-1"]')
    assert "rejected" in row.text and "NaN" in row.text
    assert "round 3 of 3" in browser.find_element("id", "round-label").text


def _get(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except urllib.error.URLError:  # not listening yet
        return 0


@pytest.mark.slow
def test_off_loopback_every_route_needs_the_token(hta_run):
    from hospitrust.ops import flwr

    port = flwr.free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "hospitrust.cli.main", "console", str(hta_run.parent), "--host",
                             "0.0.0.0", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    try:
        line = ""
        deadline = time.monotonic() + 60
        while "token=" not in line:
            assert time.monotonic() < deadline and proc.poll() is None, line
            line = proc.stdout.readline()
        token = re.search(r"token=([\w-]+)", line).group(1)
        base = f"http://127.0.0.1:{port}"
        routes = ["/", "/api/runs", "/api/state?run=hta", "/api/round?run=hta&round=1", "/static/console.js",
                  "/static/vendor/uplot/uPlot.iife.min.js", "/no-such-page"]
        deadline = time.monotonic() + 30
        while _get(base + "/api/runs", token) != 200:
            assert time.monotonic() < deadline, "the console did not answer"
            time.sleep(0.3)
        assert [_get(base + r) for r in routes] == [401] * len(routes)
        assert [_get(base + r, "wrong") for r in routes] == [401] * len(routes)
        assert [_get(base + r, token) for r in routes[:-1]] == [200] * (len(routes) - 1)
        assert _get(f"{base}/api/runs?token={token}") == 200
    finally:
        flwr.stop_tree(proc.pid)


# ------------------------------------------------------------------ the live page in Chromium
@contextlib.contextmanager
def serving_console(runs):
    """The console's app over ``runs`` on a free loopback port, in a thread; yields its base URL."""
    import uvicorn

    from hospitrust.console.app import create_app
    from hospitrust.ops import flwr

    port = flwr.free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(runs), host="127.0.0.1", port=port, log_level="warning"))
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "the console did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        serving.join(timeout=10)


@pytest.mark.slow
def test_the_live_page_shows_hospitals_new_rounds_and_a_rejected_hospitals_reason(browser, tmp_path, data_dir):
    from hospitrust.ops.inprocess import run_inprocess

    out = tmp_path / "runs"
    out.mkdir()
    cfg = small_run_config(tmp_path, strategy="hta", attack="nan-update", **{"malicious-hospitals": "1",
                                                                             "num-server-rounds": 4, "run-name": "live"})

    def slow(index, incoming, reply):  # a round of about 1.5 s, so rounds arrive while the page is open
        time.sleep(0.4)
        return reply

    run_thread = threading.Thread(target=run_inprocess, args=(cfg, 4), kwargs={"reply_filter": slow}, daemon=True)
    with serving_console(out) as base:
        run_thread.start()
        browser.get(base + "/")
        browser.execute_script("window.__first_load = performance.timeOrigin;")
        # the run appears in the list, then its page (the only run: opened at once)
        wait_for(browser, lambda d: d.find_elements("css selector", "#hospitals tr[data-hospital]"), timeout=120,
                 what="the hospitals' rows")
        rows = browser.find_elements("css selector", "#hospitals tr[data-hospital]")
        assert {r.get_attribute("data-hospital") for r in rows} == {"hospital-0", "hospital-1", "hospital-2", "hospital-3"}
        shown = int(browser.find_element("id", "hospitals").get_attribute("data-round"))
        # a new round appears without a reload
        wait_for(browser, lambda d: int(d.find_element("id", "hospitals").get_attribute("data-round")) > shown,
                 timeout=120, what="a new round")
        assert browser.execute_script("return window.__first_load === performance.timeOrigin;"), "the page reloaded"
        row = browser.find_element("css selector", '#hospitals tr[data-hospital="hospital-1"]')
        assert "rejected" in row.text and "arrays contain NaN or Inf" in row.text
        alerts = browser.find_element("id", "alerts").text
        assert "hospital-1's update was rejected" in alerts
        run_thread.join(timeout=120)
        wait_for(browser, lambda d: "completed" in d.find_element("id", "run-head").text, timeout=30, what="completed")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "console-live.png"))


def test_a_hospital_that_could_not_join_is_the_first_alert():
    from hospitrust.console import views

    rounds = [RoundRecord.from_json({"round": 1, "clients": [], "offline": [], "missing": ["h2"]})]
    alerts = views.all_alerts(rounds, ground_truth=False, rare=set(), left_out=[
        {"node_id": 7, "hospital": "st-broken", "reason": "1 of 6 images cannot be used: file not found (row 4 of the manifest)"}])
    assert [a["kind"] for a in alerts] == ["left-out", "missing"]
    assert alerts[0]["text"] == "st-broken could not join: 1 of 6 images cannot be used: file not found (row 4 of the manifest)"


# ------------------------------------------------------------------ every state: left out, stopped, Flower's own
def _copy_run(src, dst, *, left_out=None, finished=True, age=0.0, flower_run=None):
    import shutil

    shutil.copytree(src, dst)
    if left_out is not None:
        config = json.loads((dst / "config.json").read_text())
        config["failed-hospitals"] = left_out
        (dst / "config.json").write_text(json.dumps(config))
    if not finished:  # the records end without a summary: a crash, or the operator's flwr stop
        (dst / "summary.json").unlink()
        rounds = (dst / "rounds.jsonl").read_text().splitlines()
        (dst / "rounds.jsonl").write_text("\n".join(rounds[:1]) + "\n")
    if flower_run is not None:
        (dst / "flower-runs.jsonl").write_text(json.dumps({"run_id": flower_run, "started": 0}) + "\n")
    for p in dst.iterdir():
        os.utime(p, (time.time() - age, time.time() - age))
    return dst


LEFT_OUT = [{"node_id": 7, "hospital": "st-broken", "reason": "1 of 6 images cannot be used: file not found (row 4 of the manifest)"}]


def test_flowers_status_decides_a_run_whose_records_end_early(hta_run, tmp_path):
    import fcntl

    from hospitrust.console.app import round_rows, run_state

    answers = {11: ("finished:stopped", ""), 12: ("finished:failed", "Task failed with unknown error."), 13: ("running", ""),
               14: ("unknown", "connection refused")}
    asked = []

    def flower(run_id):
        asked.append(run_id)
        return answers[run_id]

    runs = {i: RunReader(_copy_run(hta_run, tmp_path / f"r{i}", finished=False, flower_run=i, age=3600), f"r{i}", flower)
            for i in answers}
    for r in runs.values():
        r.refresh()
    assert runs[11].status == "stopped" and runs[11].row()["failure"] == "stopped by the operator (flwr stop)"
    assert runs[12].status == "failed" and runs[12].row()["failure"] == "finished:failed: Task failed with unknown error."
    assert runs[13].status == "running"  # an hour without a new round, yet Flower says it runs
    assert runs[14].status == "stopped"  # the SuperLink did not answer: the records' own age decides
    with open(runs[11].path / ".lock", "w") as lock:  # an orphaned ServerApp holding the lock: Flower's word wins
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert runs[11].lock_held() and runs[11].status == "stopped"
    n = len(asked)
    runs[12].status
    assert len(asked) == n  # asked again only after FLOWER_POLL seconds

    left = RunReader(_copy_run(hta_run, tmp_path / "left", left_out=LEFT_OUT), "left")
    left.refresh()
    state = run_state(left, 0)
    assert state["alerts"][0]["kind"] == "left-out" and "st-broken could not join" in state["alerts"][0]["text"]
    assert all(a["kind"] != "left-out" for a in run_state(left, 1)["alerts"])  # already shown
    rows = round_rows(left, 1)["rows"]
    assert rows[-1]["hospital"] == "st-broken" and rows[-1]["status"] == "left out"


@pytest.mark.slow
def test_the_live_page_shows_a_left_out_hospital_and_a_stopped_run(hta_run, browser, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    _copy_run(hta_run, runs / "left", left_out=LEFT_OUT)
    _copy_run(hta_run, runs / "stopped", finished=False, age=3600)  # no summary, no lock, an hour old
    with serving_console(runs) as base:
        browser.get(base + "/")
        listed = _run_list(browser, runs=2)
        assert "stopped" in listed["stopped"] and "completed" in listed["left"], listed
        browser.get(base + "/#/run/left")
        wait_for(browser, lambda d: d.find_elements("css selector", '#hospitals tr[data-hospital="st-broken"]'),
                 what="the left-out hospital's row")
        row = browser.find_element("css selector", '#hospitals tr[data-hospital="st-broken"]')
        assert "left out" in row.text and "file not found (row 4 of the manifest)" in row.text
        assert "1 left out" in browser.find_element("id", "run-head").text
        assert "st-broken could not join" in browser.find_element("id", "alerts").text
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "console-left-out.png"))


def test_the_round_in_flight_from_the_progress_file(tmp_path):
    from hospitrust.console.progress import round_in_flight

    path = tmp_path / "progress.jsonl"
    events = [
        {"time": 100.0, "round": 1, "event": "asked", "reply_timeout": 60, "hospitals": ["a", "b", "c", "d"]},
        {"time": 101.0, "round": 1, "event": "replied", "hospital": "a"},
        {"time": 102.0, "round": 1, "event": "error", "hospital": "b", "reason": "refused by site policy: max-local-epochs: 3 > 2"},
    ]
    path.write_text("\n".join(json.dumps(e) for e in events) + "\n{\"time\": 10")  # a line being written
    early = round_in_flight(path, 0, now=120.0)
    assert early["round"] == 1 and early["replied"] == ["a"] and early["waiting"] == ["c", "d"] and early["late"] == []
    assert early["errors"] == {"b": "refused by site policy: max-local-epochs: 3 > 2"}
    assert round_in_flight(path, 0, now=131.0)["late"] == ["c", "d"]  # past half of reply-timeout
    assert round_in_flight(path, 1, now=131.0) is None  # its record is in rounds.jsonl: not in flight


@pytest.mark.slow
def test_the_live_page_shows_a_late_hospital_while_its_round_is_in_flight(browser, tmp_path, data_dir):
    from hospitrust.ops.inprocess import run_inprocess

    out = tmp_path / "runs"
    out.mkdir()
    cfg = small_run_config(tmp_path, **{"num-server-rounds": 2, "run-name": "late", "reply-timeout": 6.0})

    def slow_second_round(index, incoming, reply):  # hospital-2 takes 5 s more over its round-2 training
        config = incoming.content.config_records.get("config") if incoming.has_content() else None
        if index == 2 and str(reply.metadata.message_type) == "train" and config is not None and config.get("server-round") == 2:
            time.sleep(5)
        return reply

    run_thread = threading.Thread(target=run_inprocess, args=(cfg, 3), kwargs={"reply_filter": slow_second_round}, daemon=True)
    with serving_console(out) as base:
        run_thread.start()
        browser.get(base + "/#/run/late")
        wait_for(browser, lambda d: d.find_element("id", "in-flight").get_attribute("data-round") == "2"
                 and d.find_elements("css selector", '#in-flight .late[data-hospital="hospital-2"]'), timeout=120,
                 what="hospital-2 shown late in round 2")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "console-late.png"))
        run_thread.join(timeout=120)
        wait_for(browser, lambda d: not d.find_element("id", "in-flight").is_displayed(), timeout=30, what="the round done")


@pytest.mark.slow
def test_the_live_page_lists_a_query_round_failure_closes_a_stopped_runs_panel_and_labels_a_killed_hospital(
        hta_run, browser, tmp_path):
    """Issue 47: a run that failed in its query round (only failed.json) is listed with why, and its page opens
    (before: absent, and `Error: 404 Not Found`), naming the silent node by the name another run learnt; a stopped
    run's in-flight panel is closed (before: "round 2 in progress: 0 of 3 replied, waiting 868.5 s", every hospital
    red "late"); a hospital whose SuperNode was killed is "node unavailable", as Flower said, not "no reply"."""
    runs = tmp_path / "runs"
    runs.mkdir()
    done = _copy_run(hta_run, runs / "done")
    names = json.loads((done / "config.json").read_text())["hospitals"]
    silent = next(nid for nid, name in names.items() if name == "hospital-2")
    failed = runs / "query-failed"
    failed.mkdir()
    (failed / "failed.json").write_text(json.dumps({"error": (
        f"RuntimeError: only 2 hospital(s) answered the query round; min-hospitals is 3; left out:\n  node {silent}: "
        "unresponsive: online at the SuperLink but did not answer the query within reply-timeout (60 s)"),
        "time": "2026-12-03T08:00:00+00:00", "traceback": ""}))
    stopped = _copy_run(hta_run, runs / "stopped", finished=False, age=3600)
    (stopped / "progress.jsonl").write_text(json.dumps({"time": time.time() - 900, "round": 2, "event": "asked",
                                                        "reply_timeout": 60, "hospitals": list(names.values())}) + "\n")
    killed = _copy_run(hta_run, runs / "killed")
    rounds = read_round_records(killed)
    last = rounds[-1]
    last.clients = [c for c in last.clients if c.hospital != "hospital-1"]
    last.missing, last.node_unavailable, last.unresponsive = ["hospital-1"], ["hospital-1"], []
    last.hospital_accuracy.pop("hospital-1", None)
    RunDirectory(killed).rewrite_rounds(rounds)
    with serving_console(runs) as base:
        browser.get(base + "/")
        listed = _run_list(browser, runs=4)
        assert "failed" in listed["query-failed"] and "answered the query round" in listed["query-failed"], listed
        assert f"hospital-2 (node {silent}): unresponsive" in listed["query-failed"], listed

        browser.get(base + "/#/run/query-failed")
        wait_for(browser, lambda d: "query-failed" in d.find_element("id", "run-head").text, what="the failed run's page")
        assert "404" not in browser.find_element("id", "app").text
        assert "failed: RuntimeError: only 2 hospital(s) answered" in browser.find_element("id", "run-head").text

        browser.get(base + "/#/run/stopped")
        wait_for(browser, lambda d: "stopped" in d.find_element("id", "run-head").text, what="the stopped run's page")
        time.sleep(0.5)  # a poll later: the panel stays closed
        panel = browser.find_element("id", "in-flight")
        assert not panel.is_displayed() and not browser.find_elements("css selector", "#in-flight .late")

        browser.get(base + "/#/run/killed")
        wait_for(browser, lambda d: d.find_elements("css selector", '#hospitals tr[data-hospital="hospital-1"]'),
                 what="the killed hospital's row")
        row = browser.find_element("css selector", '#hospitals tr[data-hospital="hospital-1"]')
        assert "node unavailable" in row.text and "Flower answered Node Unavailable" in row.text, row.text
        assert "reply-timeout" not in row.text
        assert "hospital-1 unavailable: Flower answered Node Unavailable" in browser.find_element("id", "alerts").text
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "console-node-unavailable.png"))
