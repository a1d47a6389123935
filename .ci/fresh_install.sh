#!/usr/bin/env bash
# A hospital's install, checked for real: a fresh venv, torch, then `pip install .` with no extra (a wheel, not
# editable), and in it: `hospitrust deploy supernode --help`, flower-supernode, the ClientApp and the ServerApp
# imported without the heavy stacks, a SuperNode (hospitrust deploy supernode, warm launcher) started against a
# SuperLink that is not there until its launcher is ready, then stopped; `hospitrust bench` and `simulate` naming
# their missing extra in one line. Prints which distributions of the full install (.[all]) are absent, as pip
# resolves them, and its time.
#
#   bash .ci/fresh_install.sh                          torch==2.14.1 and torchvision==0.29.1 installed into the venv
#   bash .ci/fresh_install.sh --torch-from .venv       torch, torchvision and what they require linked from that venv
#                                                      (.ci/link_torch.py: no second 5-6 GB unpack; what .ci/run does)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
TORCH_FROM=""
if [ "${1:-}" = "--torch-from" ]; then TORCH_FROM=$(cd "$2" && pwd); fi
unset PYTHONPATH VIRTUAL_ENV
WORK=$(mktemp -d /tmp/hospitrust-fresh-XXXXXX)
SN_PID=""
cleanup() {
    if [ -n "$SN_PID" ] && kill -0 "$SN_PID" 2>/dev/null; then kill -TERM -- "-$SN_PID" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "fresh install: FAILED: $*" >&2; exit 1; }
start=$(date +%s)

python3 -m venv "$WORK/venv"
PY="$WORK/venv/bin/python"
if [ -n "$TORCH_FROM" ]; then
    echo "fresh install: torch: $("$TORCH_FROM/bin/python" .ci/link_torch.py "$("$PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')")"
else
    "$PY" -m pip install --quiet torch==2.14.1 torchvision==0.29.1 2> >(grep -v "^WARNING: Location" >&2)
fi
"$PY" -m pip install --quiet "$REPO" 2> >(grep -v "^WARNING: Location" >&2)
installed=$(date +%s)

# the checks run outside the clone (its sources are not on sys.path), in the venv, with a home of their own
cd "$WORK"
mkdir -p home
export PATH="$WORK/venv/bin:$PATH" HOME="$WORK/home" FLWR_HOME="$WORK/home/.flwr"
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1

for cmd in "hospitrust deploy supernode --help" "flower-supernode --help"; do
    $cmd >help.txt 2>&1 || { cat help.txt >&2; fail "$cmd"; }
done
heavy=$("$PY" -c "
import sys
from hospitrust.client_app import app  # the ClientApp the SuperNode runs
from hospitrust.server_app import app as server  # and the ServerApp (the operator adds figures and DP as extras)
print(' '.join(m for m in ('ray', 'opacus', 'matplotlib', 'pandas', 'scipy', 'flwr_datasets', 'datasets') if m in sys.modules))
") || fail "the ClientApp or the ServerApp does not import"
[ -z "$heavy" ] || fail "importing the ClientApp and the ServerApp loads $heavy"

# a SuperNode against nothing: certificates, a key, a folder of class folders; up when its launcher is ready
hospitrust deploy ca --out etc >/dev/null
hospitrust deploy keygen --out etc --name st-mary >/dev/null
"$PY" -c "
import pathlib
import numpy as np
from PIL import Image
rng = np.random.default_rng(0)
for name in ('normal', 'pneumonia'):
    folder = pathlib.Path('images') / name
    folder.mkdir(parents=True)
    for i in range(12):
        Image.fromarray(rng.integers(0, 255, (28, 28), dtype=np.uint8)).save(folder / f'{i}.png')
"
port=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
nowhere=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
sn_start=$(date +%s)
: >supernode.log  # there before the first grep below, whenever the background job opens it
setsid hospitrust deploy supernode --superlink "127.0.0.1:$nowhere" --ca etc/ca.crt --key etc/st-mary.key \
    --data-path images --hospital st-mary --classes normal,pneumonia --cache-dir cache --port "$port" \
    >supernode.log 2>&1 </dev/null &
SN_PID=$!
for _ in $(seq 1 120); do
    grep -q '"launcher": "ready"' supernode.log && break
    kill -0 "$SN_PID" 2>/dev/null || { cat supernode.log >&2; fail "hospitrust deploy supernode exited"; }
    sleep 0.5
done
grep -q '"launcher": "ready"' supernode.log || { cat supernode.log >&2; fail "the SuperNode's launcher not ready in 60 s"; }
grep -q "Starting Flower SuperNode" supernode.log || { cat supernode.log >&2; fail "flower-supernode did not start"; }
ready=$(( $(date +%s) - sn_start ))
kill -TERM "$SN_PID"
for _ in $(seq 1 60); do kill -0 "$SN_PID" 2>/dev/null || break; sleep 0.5; done
kill -0 "$SN_PID" 2>/dev/null && fail "hospitrust deploy supernode still running 30 s after SIGTERM"
wait "$SN_PID" || true
left=$( { ps -o pid= -s "$SN_PID" 2>/dev/null || true; } | wc -l)  # ps exits 1 when the session is empty
[ "$left" -eq 0 ] || fail "$left processes of the SuperNode's session left after it stopped"
SN_PID=""
echo "fresh install: a SuperNode (hospitrust deploy supernode, warm launcher) came up in ${ready} s and stopped on SIGTERM"

# what needs an extra says so in one line, with the pip command
for cmd in "bench $REPO/benchmarks/smoke.toml:bench" "simulate:simulation"; do
    args=${cmd%:*} extra=${cmd##*:}
    set +e
    hospitrust $args >out.txt 2>err.txt
    rc=$?
    set -e
    [ "$rc" -eq 2 ] && [ "$(wc -l <err.txt)" -eq 1 ] && [ ! -s out.txt ] \
        && grep -q "needs the '$extra' extra (not installed: .*): pip install '.*\[$extra\]'" err.txt \
        || { cat out.txt err.txt >&2; fail "hospitrust $args (exit $rc) did not name the '$extra' extra in one line"; }
    echo "fresh install: hospitrust ${args%% *} -> $(cat err.txt)"
done

# the distributions the extras would add: what pip resolves for .[all] in this venv
"$PY" -m pip install --dry-run --quiet --report report.json "$REPO[all]" 2> >(grep -v "^WARNING: Location" >&2)
absent=$("$PY" -c "
import json
names = sorted({i['metadata']['name'].lower().replace('_', '-') for i in json.load(open('report.json'))['install']} - {'hospitrust'})
print(f'{len(names)}: ' + ', '.join(names))
")
size=$(du -sm "$WORK/venv/lib" | cut -f1)
torch_size=$(du -smc "$WORK"/venv/lib/python3*/site-packages/{torch,nvidia,triton} 2>/dev/null | tail -1 | cut -f1)
echo "fresh install: absent after \`pip install .\` (.[all] adds them) $absent"
if [ -n "$TORCH_FROM" ]; then
    echo "fresh install: the venv holds ${size} MB besides the torch it links"
else
    echo "fresh install: the venv holds ${size} MB, ${torch_size} MB of it torch with its CUDA libraries and triton"
fi
echo "fresh install: $(( $(date +%s) - start )) s ($(( installed - start )) s installing) on $(nproc) cores, $(date -u +%Y-%m-%d)"
