#!/usr/bin/env bash
# CPU reproducer of the hang G6 fixes (issue 19 items 1 and 6), gloo ranks only, no GPU.
#
# SGLang 0.5.23's own layer path (layers/flashinfer_comm_fusion.py and the add_norm layer
# boundary), imported from the published wheel in two rank processes over a gloo TP group;
# GPU queries faked, FlashInfer replaced by a stand-in whose workspace creation makes the
# trtllm backend's collectives on SGLang's device group (allgather + barrier + broadcast,
# as FlashInfer 0.7.2's does). One rank's creation fails:
#   one-rank-create-fails  rank 1 fails before its first collective
#   one-rank-fails-midway  rank 1 fails between two of the handle exchange's collectives
# before/: stock 0.5.23: the failing rank returns and enters the gloo all-reduce of
#   _sync_allreduce_unavailable_across_tp while its peer waits in the exchange: the
#   collectives never match; each case is ended after 30 s and reported as hung.
# after/: the same stock files plus only G6 (0006-G6-...patch): every collective of the
#   creation carries a success flag over one group; both ranks fall back together, one
#   warning each, output still correct.
# Both runs accept SM12x in SGLang's gates in memory (--gates-in-memory, the stand-in of
# G1/G3; upstream's own gates already accept SM90/SM100, where the same hang happens), so
# the one difference between before/ and after/ is G6.
#
# Needs this checkout (the harness: python -m sm120fork.gpu sglang-layer --device cpu), a
# Python 3.11 with the toolkit and its test dependencies (e.g. nox -s tests' virtualenv),
# and the package index once (sglang 0.5.23's wheel, tests/requirements-sglang-0.5.23.txt).
# Usage: PYTHON=.nox/tests/bin/python bash reports/upstream/sglang-0.5.23-sglang/reproducer/run.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../../../.." && pwd)
PY=${PYTHON:-python3}; W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
ENV=$("$PY" -c 'import sys; print(sys.prefix)')  # shown as <python-env>: no machine paths
pipq() { "$PY" -m pip -q "$@"; }
pipq download --no-deps --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_34_x86_64 sglang==0.5.23 -d "$W/dl"
pipq install --no-deps --no-compile --target "$W/stock" "$W"/dl/sglang-0.5.23-cp311-*.whl
pipq install --no-deps --no-compile --target "$W/deps" -r "$ROOT/tests/requirements-sglang-0.5.23.txt"
G6=$(ls "$ROOT"/patches/sglang-0.5.23/sglang/0006-G6-*.patch)
cp -al "$W/stock" "$W/g6"
for f in sglang/srt/layers/flashinfer_comm_fusion.py sglang/srt/layers/layernorm.py; do
  rm "$W/g6/$f"; cp "$W/stock/$f" "$W/g6/$f"  # own copies: the patch must not touch stock
done
(cd "$W/g6" && git apply -p2 "$G6")
run() {  # name tree
  rm -rf "${HERE:?}/$1"
  PYTHONPATH="$ROOT/src" timeout 900 "$PY" -m sm120fork.gpu sglang-layer --device cpu \
    --layout layer_boundary --gates-in-memory --sglang-path "$W/$2" --site "$W/deps" \
    --case one-rank-create-fails --case one-rank-fails-midway --tokens 3,16 \
    --timeout 30 --start-timeout 300 \
    --title "sglang 0.5.23 $1 ($2): one rank fails FlashInfer's workspace creation, 2 gloo ranks on the CPU" \
    --out "$HERE/$1" > "$W/$1.log" 2>&1
  local rc=$?
  sed -e "s#$W#<work>#g" -e "s#$ROOT/##g" -e "s#$ENV#<python-env>#g" "$W/$1.log" \
    > "$HERE/$1/console.log"
  for f in "$HERE/$1"/report.*; do
    sed -i -e "s#$W#<work>#g" -e "s#$ROOT/##g" -e "s#$ENV#<python-env>#g" "$f"; done
  echo "$1: exit $rc"
}
set +e
run before stock
run after g6
( "$PY" - "$HERE" <<'PY'
import json, sys
from pathlib import Path
for name in ("before", "after"):
    doc = json.loads((Path(sys.argv[1]) / name / "report.json").read_text())
    for c in doc["cases"]:
        verdict = "HUNG (ended at the 30 s bound)" if c["hung"] else (
            "pass" if c["passed"] else "FAIL: " + "; ".join(c["problems"]))
        print(f"{name}: {c['case']}: {verdict}")
PY
) | tee "$HERE/summary.txt"
