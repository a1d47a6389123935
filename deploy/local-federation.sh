#!/usr/bin/env bash
# deploy/local-federation.sh [N_HOSPITALS] [RUN_CONFIG]
#
# The whole deployment guide (docs/deployment.md) on 127.0.0.1, as an operator and N hospitals
# would do it: a federation exported from PneumoniaMNIST (`hospitrust task export`: each hospital's
# own files, PNG folders / CSV manifest / DICOM in turn, the server's test set and cohort, a task
# file), CA, SuperLink certificate, an operator's certificate, hospitals' key pairs, the locked-down
# SuperLink (TLS + SuperNode authentication on 127.0.0.1, behind the nginx gateway), the operator's
# tunnel, registration through it, N SuperNodes (`hospitrust deploy supernode`: data check, then
# flower-supernode), one `flwr run` with the task file and the server's sets, then the run's
# per-round seconds. Exit 0 only if the run ended finished:completed. Everything lives in a fresh
# folder (printed); every process started here is stopped on exit.
#
#   HOSPITRUST_DATA_DIR=/path/to/medmnist deploy/local-federation.sh 3 'num-server-rounds=2'
#   EXPORT='--train-subsample 0.1 --partitioner iid' deploy/local-federation.sh 3
set -euo pipefail
N=${1:-3}
RUNCFG=${2:-"num-server-rounds=2"}
EXPORT=${EXPORT:-"--train-subsample 0.05 --partitioner iid --test-subsample 0.3"}
APP=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hospitrust-federation.XXXXXX")
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT=${PORT:-$(free_port)}   # the hospitals' listener
OPERATOR_PORT=$(free_port) SUPERLINK_PORT=$(free_port) TUNNEL_PORT=$(free_port)
: "${HOSPITRUST_DATA_DIR:?set HOSPITRUST_DATA_DIR to the folder with the MedMNIST .npz files}"
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
echo "work folder: $WORK   hospitals reach 127.0.0.1:$PORT, the operator 127.0.0.1:$OPERATOR_PORT"
cd "$WORK"

# the hospitals' own data (and the operator's test set, cohort and task file), from PneumoniaMNIST
# shellcheck disable=SC2086
hospitrust task export pneumoniamnist --out "$WORK/export" --hospitals "$N" --format png,csv,dicom $EXPORT
data_path() { case $(( $1 % 3 )) in 1) echo "$WORK/export/hospital-$1/manifest.csv";; *) echo "$WORK/export/hospital-$1";; esac; }

# operator: CA, the SuperLink's certificate and the operator's own
hospitrust deploy ca --out certs
hospitrust deploy server-cert --ca-dir certs --san 127.0.0.1 --san localhost
hospitrust deploy operator-cert --ca-dir certs --name operator --out operator-cert
# hospitals: each makes its own key pair and sends the .pub to the operator
for i in $(seq 0 $((N-1))); do hospitrust deploy keygen --out "hospital-$i" --name "hospital-$i"; done
# operator: SuperLink and its gateway (setsid: its own process group, so cleanup stops its children too)
setsid hospitrust deploy superlink --certs certs --database "$WORK/superlink/state.db" --host 127.0.0.1 --port "$PORT" \
  --operator-port "$OPERATOR_PORT" --superlink-port "$SUPERLINK_PORT" > superlink.log 2>&1 & PIDS+=($!)
export FLWR_HOME=$WORK/operator
hospitrust deploy connection local-tls --address "127.0.0.1:$OPERATOR_PORT" --ca certs/ca.crt \
  --operator-cert operator-cert/operator.crt --operator-key operator-cert/operator.key --tunnel-port "$TUNNEL_PORT" --default
setsid hospitrust deploy tunnel local-tls > tunnel.log 2>&1 & PIDS+=($!)
for _ in $(seq 1 100); do curl -sf --cacert certs/ca.crt "https://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.5; done
for _ in $(seq 1 40); do curl -sf --cacert certs/ca.crt "https://127.0.0.1:$TUNNEL_PORT/health" >/dev/null && break; sleep 0.5; done
hospitrust deploy register hospital-*/hospital-*.pub --connection local-tls
# hospitals: each checks its data against the task, then starts its SuperNode
for i in $(seq 0 $((N-1))); do
  FLWR_HOME=$WORK/hospital-$i/flwr setsid hospitrust deploy supernode --superlink "127.0.0.1:$PORT" --ca certs/ca.crt \
    --key "hospital-$i/hospital-$i.key" --data-path "$(data_path "$i")" --task "$WORK/export/task.toml" \
    --hospital "hospital-$i" --cache-dir "$WORK/cache/hospital-$i" --port "$(free_port)" > "hospital-$i.log" 2>&1 & PIDS+=($!)
done
for _ in $(seq 1 120); do
  n=$(flwr supernode list local-tls --format json 2>/dev/null | python3 -c 'import json,sys; print(sum(1 for x in json.load(sys.stdin).get("nodes", []) if x.get("status") == "online"))' 2>/dev/null || echo 0)
  [ "$n" -ge "$N" ] && break; sleep 1
done
echo "$n SuperNodes online"
# researcher: one run (absolute paths: the ServerApp's cwd is not this shell's)
START=$(date +%s)
RID=$(flwr run "$APP" local-tls --format json \
  --run-config "$RUNCFG output-dir=\"$WORK/runs\" run-name=\"local-federation\" task.file=\"$WORK/export/task.toml\" server-data.test-path=\"$WORK/export/server/test\" server-data.cohort-path=\"$WORK/export/server/cohort\"" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["run-id"])')
echo "run $RID submitted"
set +e
hospitrust deploy status "$RID" --connection local-tls --wait --timeout "${RUN_TIMEOUT:-3600}"; RC=$?
set -e
echo "wall seconds from submit to finished: $(( $(date +%s) - START ))"
flwr log "$RID" local-tls --show | grep -E "round +[0-9]+/|finished .* rounds" || true
python3 - "$WORK/runs/local-federation/rounds.jsonl" <<'PY' || true
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    print(f"round {r['round']}: {r['round_seconds']:.1f} s, asked {r['asked']}, missing {r['missing']}")
print(f"mean round seconds: {sum(r['round_seconds'] for r in rows) / len(rows):.1f}")
PY
exit $RC
