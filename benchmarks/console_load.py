"""How fast the console is on a large run: 100 rounds x 100 hospitals, in headless Chromium.

Writes a synthetic run directory (HTA-like records: weights, s / m / v / reputation, a few
rejected and excluded hospitals, federated accuracies), serves it with the console on
127.0.0.1, and measures in the browser:

- the first load: from navigation until the hospitals' rows and both plots are drawn;
- a live update: from a round appended to rounds.jsonl until its rows are shown.

The target is under 1 s each. Prints the figures; ``--json`` writes them.

    python benchmarks/console_load.py --rounds 100 --hospitals 100 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def synthetic_round(rnd: int, hospitals: int, rng: random.Random) -> dict:
    clients = []
    for h in range(hospitals):
        rejected = rng.random() < 0.02
        excluded = not rejected and rng.random() < 0.05
        rep = rng.random()
        clients.append({
            "hospital": f"hospital-{h}", "node_id": 1000 + h, "num_examples": rng.randint(20, 400),
            "weight": 0.0 if rejected or excluded else rng.random() / hospitals, "train_loss": rng.random(),
            "benchmark_error": rng.random(), "selected": not (rejected or excluded), "rejected": rejected,
            "reason": "arrays contain NaN or Inf: ['w']" if rejected else "",
            "s": rng.random(), "m": rng.random(), "v": rng.random(), "tau": rng.random(), "reputation": rep,
            "excluded": excluded, "exclusion_reason": f"reputation {rep:.3f} < mu - lambda MAD" if excluded else "",
            "flagged": excluded, "malicious": h % 10 == 0, "duplicates_of": [], "duplicate_group_size": 1,
        })
    return {
        "round": rnd, "round_seconds": 3.0, "aggregation_seconds": 0.2, "asked": hospitals, "missing": [], "offline": [],
        "central": {"balanced_accuracy": 0.5 + 0.4 * rnd / 100, "auc": 0.6 + 0.3 * rnd / 100, "accuracy": 0.7,
                    "worst_class_recall": 0.5, "macro_f1": 0.6, "per_class_recall": [0.5, 0.9], "loss": 0.4},
        "clients": clients, "kept_previous_model": False, "note": "",
        "hospital_accuracy": {f"hospital-{h}": rng.random() for h in range(hospitals)},
        "fairness": {"mean": 0.8, "min": 0.5, "max": 1.0, "std": 0.1, "spread": 0.5},
        "detection": {"tpr": 0.5, "fpr": 0.05},
    }


def write_run(folder: Path, rounds: int, hospitals: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    run = folder / "large-run"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({
        "strategy": "hta", "dataset": "pneumoniamnist", "attack": "sign-flip", "num-server-rounds": rounds + 1,
        "ground-truth": True, "hospitals": {str(1000 + h): f"hospital-{h}" for h in range(hospitals)},
        "class-names": ["normal", "pneumonia"]}))
    with open(run / "rounds.jsonl", "w") as fh:
        for r in range(1, rounds + 1):
            fh.write(json.dumps(synthetic_round(r, hospitals, rng)) + "\n")
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--hospitals", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="runs/console-load")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)

    import shutil

    import uvicorn
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from browser import CHROMEDRIVER, CHROMIUM, FLAGS, missing_browser
    from hospitrust.ops import flwr
    from hospitrust.console.app import create_app

    if problem := missing_browser():
        print(problem, file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    run = write_run(out, args.rounds, args.hospitals)
    size = (run / "rounds.jsonl").stat().st_size
    port = flwr.free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(out), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    options = webdriver.ChromeOptions()
    for flag in FLAGS:
        options.add_argument(flag)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)

    def wait(condition, timeout=60.0):
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            try:
                if condition():
                    return
            except Exception:
                pass
            time.sleep(0.01)
        raise TimeoutError("the page did not get there")

    rng = random.Random(1)
    loads, updates = [], []
    next_round = args.rounds + 1
    try:
        for _ in range(args.repeats):
            driver.get("about:blank")
            start = time.perf_counter()
            driver.get(f"http://127.0.0.1:{port}/#/run/large-run")
            wait(lambda: driver.execute_script(
                "return document.querySelectorAll('#hospitals tr[data-hospital]').length === arguments[0] && "
                "document.querySelectorAll('#metrics-plot canvas, #trust-plot canvas').length === 2", args.hospitals))
            loads.append(time.perf_counter() - start)
            time.sleep(1.0)  # settled: the next poll finds nothing new
            with open(run / "rounds.jsonl", "a") as fh:
                fh.write(json.dumps(synthetic_round(next_round, args.hospitals, rng)) + "\n")
                fh.flush()
            start = time.perf_counter()
            wait(lambda: driver.execute_script("return document.getElementById('hospitals').dataset.round") == str(next_round))
            updates.append(time.perf_counter() - start)
            next_round += 1
    finally:
        driver.quit()
        server.should_exit = True
    figures = {"rounds": args.rounds, "hospitals": args.hospitals, "rounds_jsonl_mb": round(size / 1e6, 1),
               "first_load_s": [round(x, 3) for x in loads], "first_load_median_s": round(statistics.median(loads), 3),
               "live_update_s": [round(x, 3) for x in updates], "live_update_median_s": round(statistics.median(updates), 3)}
    print(f"console on {args.rounds} rounds x {args.hospitals} hospitals (rounds.jsonl {figures['rounds_jsonl_mb']} MB):")
    print(f"  first load (navigation -> {args.hospitals} rows and both plots): median {figures['first_load_median_s']} s "
          f"of {figures['first_load_s']}")
    print(f"  live update (a round appended -> its rows shown): median {figures['live_update_median_s']} s "
          f"of {figures['live_update_s']}")
    print(f"  target under 1 s each: {'met' if max(figures['first_load_median_s'], figures['live_update_median_s']) < 1 else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
