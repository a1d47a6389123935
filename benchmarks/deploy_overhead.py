"""Where a deployed round's time goes, against the same config simulated, in one invocation.

Runs ``--hospitals`` hospitals (partitions of the run's dataset, the same in both) for
``--rounds`` rounds:

1. simulated: ``hospitrust simulate`` (Flower's simulation engine on Ray);
2. deployed, per ``--launchers`` entry: a SuperLink with TLS and SuperNode authentication on
   127.0.0.1 and one ``hospitrust deploy supernode --partition I/N`` per hospital, with
   ``--launcher warm`` (ClientApps forked from a preloaded launcher, hospitrust's) or
   ``--launcher flower`` (Flower's SuperExec: a fresh process per message), then ``flwr run``.

From every round's record (``timing``: the exchanges' wall-clock stamps; each hospital's reply:
its ClientApp's age when the handler started, setup, training step) it prints per phase, in
seconds per round (rounds after the first, which pays the one-off start-up of each side):

- **process start and imports**: the ClientApp process's age when its train handler started
  (a fresh process: interpreter, imports, FAB install; a forked one: FAB install and the app);
- **setup**: run and node config, the hospital's data (decoded cache), the model;
- **training**: the train step (benchmark error, local epochs);
- **delivery wait**: from the server's push until the hospital's ClientApp process existed
  (the SuperNode's poll of the SuperLink, transfer, the launcher);
- **reply wait**: from the last hospital's reply until the server had it (the SuperNode's reply
  poll, transfer, the ServerApp's poll);
- **aggregation**, **evaluate exchange** (federated evaluation), **central evaluation**, other.

**round** is the period from one round's record to the next. Deployed, the next round's train
messages go out together with this round's evaluation (``server_app.transport.pipelines``), so
there the train exchange's delivery wait includes the hospitals' evaluation of the last round,
and the phases overlap rather than add up to the round.

Flower's own fixed waits (the SuperNode polls the SuperLink every 3 s when idle and checks for
its ClientApp's reply every 0.5 s: ``flwr/supernode/start_client_internal.py``) are inside the
idle waits, printed on their own line: a round's period minus the busiest hospital's ClientApp
time and the server's own work (``idle_waits``), and the deployed round without them.

    python benchmarks/deploy_overhead.py --hospitals 3 --rounds 3                       # the default config
    python benchmarks/deploy_overhead.py --hospitals 3 --rounds 3 -c 'train-subsample=0.05'  # the tiny one
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hospitrust.ops import deploy, flwr  # noqa: E402
from hospitrust.server_app.results import read_round_records, round_periods  # noqa: E402
from hospitrust.ops.simulate import size_resources  # noqa: E402
from hospitrust.records import RoundRecord  # noqa: E402


def _seconds(value: float) -> float:
    """A record's seconds, 0 where the line had none (null: NaN in the record)."""
    return 0.0 if math.isnan(value) else float(value)


def phases(rounds: list[RoundRecord]) -> dict[str, float]:
    """Mean seconds per round of each phase, over the rounds after the first."""
    rows = rounds[1:] or rounds
    out: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        out.setdefault(key, []).append(float(value))

    # a round's period, not its round_seconds: the next round's train messages may go out with
    # this round's evaluation, and round_seconds overlap there
    period = dict(zip([r.number for r in rounds], round_periods(rounds)))
    for r in rows:
        t = r.timing
        clients = [c.timing for c in r.clients if c.timing]
        add("round", period[r.number])
        if not clients or "train_pushed_at" not in t:
            continue
        pushed, train_s = t["train_pushed_at"], t["train_seconds"]
        agg = _seconds(r.aggregation_seconds)
        last_reply = max(c["finished-at"] for c in clients)
        slowest = max(clients, key=lambda c: c["finished-at"])
        # a long-lived process (a Ray actor) started before this exchange: only its age since the push counts
        started_cost = min(slowest["process-age"], max(0.0, slowest["started-at"] - pushed))
        add("process start and imports", started_cost)
        add("setup (configs, data, model)", slowest["setup"])
        add("training", slowest["step"])
        # until the ClientApp process existed: the SuperNode's pull, transfer, the launcher (or Ray's dispatch)
        add("delivery wait", max(0.0, slowest["started-at"] - started_cost - pushed))
        add("reply wait", max(0.0, pushed + train_s - agg - last_reply))
        add("aggregation", agg)
        add("evaluate exchange", t["evaluate_seconds"])
        evals = list((t.get("evaluate_clients") or {}).values())
        if evals:
            e_last = max(e["finished-at"] for e in evals)
            e_slow = max(evals, key=lambda e: e["finished-at"])
            e_cost = min(e_slow["process-age"], max(0.0, e_slow["started-at"] - t["evaluate_pushed_at"]))
            add("  of which delivery wait", max(0.0, e_slow["started-at"] - e_cost - t["evaluate_pushed_at"]))
            add("  of which reply wait", max(0.0, t["evaluate_pushed_at"] + t["evaluate_seconds"] - e_last))
        else:  # a round without the hospitals' evaluation (federated-evaluation-every): no waits, per round
            add("  of which delivery wait", 0.0)
            add("  of which reply wait", 0.0)
        add("central evaluation", t["central_evaluation_seconds"])
        add("other", r.round_seconds - train_s - t["evaluate_seconds"] - t["central_evaluation_seconds"])
    return {k: statistics.mean(v) for k, v in out.items()}


def _busy(entry: dict, pushed: float) -> float:
    """A ClientApp's own time for one message: its process start (since the push, for a process
    older than the exchange), then its handler."""
    start_cost = min(entry["process-age"], max(0.0, entry["started-at"] - pushed))
    return start_cost + entry["finished-at"] - entry["started-at"]


def idle_waits(rounds: list[RoundRecord]) -> float:
    """Mean over the rounds after the first of: the round's period minus the busiest hospital's
    ClientApp time (its train and evaluate messages) and the server's own work (aggregation,
    central evaluation). What is left is where no one computes: the SuperNodes' idle 3 s poll and
    0.5 s reply checks (Flower's fixed waits), transfers and the ServerApp's 0.1 s poll. It holds
    whether or not the next round's train messages overlap this round's evaluation.
    """
    out = []
    for r, period in list(zip(rounds, round_periods(rounds)))[1:]:
        t = r.timing
        busy: dict[str, float] = {}
        for c in r.clients:
            if c.timing:
                busy[c.hospital] = busy.get(c.hospital, 0.0) + _busy(c.timing, t["train_pushed_at"])
        for hospital, e in (t.get("evaluate_clients") or {}).items():
            busy[hospital] = busy.get(hospital, 0.0) + _busy(e, t["evaluate_pushed_at"])
        server = _seconds(r.aggregation_seconds) + float(t.get("central_evaluation_seconds", 0.0))
        out.append(max(0.0, period - max(busy.values(), default=0.0) - server))
    return statistics.mean(out) if out else float("nan")


def simulated(work: Path, hospitals: int, run_config: str) -> tuple[list[RoundRecord], float]:
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "hospitrust.cli.main", "simulate", "--hospitals", str(hospitals), "-c",
                          f'{run_config} output-dir="{work / "sim"}" run-name="sim"'], cwd=REPO, capture_output=True,
                         text=True)
    if res.returncode != 0:
        raise SystemExit(f"simulation failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return read_round_records(work / "sim" / "sim"), time.perf_counter() - start


def deployed(work: Path, hospitals: int, run_config: str, launcher: str, threads: int) -> tuple[list[RoundRecord], float]:
    root = work / f"deploy-{launcher}"
    certs, keys = root / "certs", root / "keys"
    deploy.create_ca(certs)
    deploy.create_server_cert(certs / "ca.crt", certs / "ca.key", certs, ["127.0.0.1", "localhost"])
    names = [f"hospital-{i}" for i in range(hospitals)]
    for name in names:
        deploy.create_supernode_keys(keys, name)
    port = flwr.free_port()
    address = f"127.0.0.1:{port}"
    cli_home = root / "cli"
    env = flwr.flower_env(cli_home)
    procs = []
    try:
        cmd = deploy.superlink_command(ca=certs / "ca.crt", cert=certs / "server.pem", key=certs / "server.key",
                                       database=root / "superlink" / "state.db", host="127.0.0.1", port=port)
        (root / "superlink").mkdir(parents=True, exist_ok=True)
        procs.append(flwr.start("superlink", cmd, env=env, cwd=root, log_file=root / "superlink.log"))
        deploy.wait_healthy(address, ca=certs / "ca.crt", timeout=120, proc=procs[0])
        deploy.write_connection("bench", address, certs / "ca.crt", make_default=True, home=cli_home)
        for name in names:
            res = flwr.flwr_cli(["supernode", "register", str(keys / f"{name}.pub"), "bench"], env=env, cwd=root)
            if "registered successfully" not in res.stdout:
                raise SystemExit(f"registering {name} failed: {res.stdout}{res.stderr}")
        for i, name in enumerate(names):
            sn_env = flwr.flower_env(root / f"sn-{name}", {"OMP_NUM_THREADS": str(threads)})
            cmd = [sys.executable, "-m", "hospitrust.cli.main", "deploy", "supernode", "--superlink", address,
                   "--ca", str(certs / "ca.crt"), "--key", str(keys / f"{name}.key"), "--partition", f"{i}/{hospitals}",
                   "--hospital", name, "--port", str(flwr.free_port()), "--launcher", launcher]
            procs.append(flwr.start(name, cmd, env=sn_env, cwd=root, log_file=root / f"{name}.log"))
        deadline = time.monotonic() + 240
        while len(deploy.online_nodes("bench", env=env, cwd=root)) < hospitals:
            if time.monotonic() > deadline:
                raise SystemExit("SuperNodes not online:\n" + "\n".join(p.log_tail() for p in procs))
            time.sleep(1)
        start = time.perf_counter()
        run_id = flwr.submit_run(REPO, "bench", env=env, cwd=root,
                                 run_config=f'{run_config} output-dir="{root / "runs"}" run-name="dep"')
        status, details = deploy.wait_for_run(run_id, "bench", 3600, env=env, cwd=root, poll=1)
        wall = time.perf_counter() - start
        if status != deploy.COMPLETED:
            raise SystemExit(f"deployed run {status}: {details}\n" + procs[0].log_tail())
        return read_round_records(root / "runs" / "dep"), wall
    finally:
        for p in reversed(procs):
            p.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hospitals", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-c", "--run-config", default="", help="extra run config, e.g. 'train-subsample=0.05'")
    parser.add_argument("--launchers", default="warm,flower", help="deployed variants: warm, flower (default both)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    flwr.stop_on_signals()  # a stopped benchmark stops its SuperLinks, SuperNodes and what they started
    run_config = f"num-server-rounds={args.rounds} {args.run_config}".strip()
    threads = max(1, int(size_resources(args.hospitals).cpus_per_hospital))
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="hospitrust-deploy-overhead-") as tmp:
        work = Path(tmp)
        rounds, wall = simulated(work, args.hospitals, run_config)
        results["simulated"] = {"phases": phases(rounds), "wall": wall, "rounds": round_periods(rounds),
                                "idle": idle_waits(rounds)}
        print(f"simulated: {wall:.1f} s in all", flush=True)
        for launcher in [x.strip() for x in args.launchers.split(",") if x.strip()]:
            rounds, wall = deployed(work, args.hospitals, run_config, launcher, threads)
            results[f"deployed ({launcher})"] = {"phases": phases(rounds), "wall": wall,
                                                 "rounds": round_periods(rounds), "idle": idle_waits(rounds)}
            print(f"deployed ({launcher}): {wall:.1f} s from submit to finished", flush=True)
    names = list(results)
    keys = list(dict.fromkeys(k for r in results.values() for k in r["phases"]))
    print(f"\n{args.hospitals} hospitals, {args.rounds} rounds, run config {run_config!r}, {os.cpu_count()} CPUs; "
          f"seconds per round (mean of rounds 2..{args.rounds}); deployed hospitals OMP_NUM_THREADS={threads}")
    print(f"{'phase':<32}" + "".join(f"{n:>20}" for n in names))
    for k in keys:
        print(f"{k:<32}" + "".join(f"{results[n]['phases'].get(k, float('nan')):>20.2f}" for n in names))
    for n in names:
        print(f"{n}: each round's period, seconds {' '.join(f'{x:.2f}' for x in results[n]['rounds'])}")
    sim = results["simulated"]["phases"]["round"]
    for n in names[1:]:
        p = results[n]["phases"]
        waits = results[n]["idle"]
        print(f"{n}: round {p['round']:.2f} s = {p['round'] / sim:.2f}x simulated ({sim:.2f} s)")
        print(f"{n}: idle waits (Flower's fixed polls among them) {waits:.2f} s a round; without them "
              f"{p['round'] - waits:.2f} s = {(p['round'] - waits) / sim:.2f}x simulated")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "threads": threads, "results": results}, indent=2))


if __name__ == "__main__":
    main()
