#!/usr/bin/env bash
# The one-command GPU check, made for a single run on a lent GPU: build in
# place, a 10-second smoke case, the GPU tests, the GPU benchmarks side by
# side with PyTorch's allocator, and one table last, whatever happened.
#
#   benchmarks/gpu/run_all.sh OUTDIR
#
# Writes OUTDIR/log.txt (everything printed; complete when the script exits:
# the script re-runs itself into `tee` and waits for it), OUTDIR/results.json
# (the numbers, the GPU, torch and CUDA versions, the date, each step's
# status), OUTDIR/steps.json and OUTDIR/pytest.xml.
#
# Steps, in order:
#   build       benchmarks/gpu/build_inplace.py (about 90 s on 16 cores)
#   import      the extension has CUDA
#   smoke       tests/gpu/_cases.py smoke: install, 3 allocations, stats, one
#               record_stream, one CUDA-graph capture (about 10 s). If it fails
#               with address ranges (CUDA VMM) on, it runs again with
#               TORCH_RENAISSANCE_CUDA_VMM=0; if that passes, the rest of the
#               check runs in that mode and the table says so on its first line.
#   tests       pytest -m gpu tests/gpu, 4 workers when pytest-xdist is
#               importable, serially otherwise (about 60 s with 4 workers)
#   benchmarks  benchmarks/gpu/bench_gpu.py, three configurations (about 25 s
#               each), then model slots in what is left of their time
# Estimated total on one H200: about 4 to 5 minutes. Every step runs under a
# timeout taken from one budget (TORCH_RENAISSANCE_GPU_BUDGET seconds,
# default 360: 6 minutes), keeping 20 s for the report; a step that runs out
# of time gets SIGINT first (pytest then still writes its report), and a step
# with no time left is reported as "not run: no time". SIGINT or SIGTERM to
# the script prints the table of what ran before it exits.
#
# Uses $PYTHON (default: python3, else python), MAX_JOBS (default 16) and
# CUDA_HOME (default /usr/local/cuda when it holds the toolkit). Without a
# usable GPU it stops at once with exit status 2. Exit status 0 when every
# step passed.
set -uo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
if [ -z "${_TR_GPU_CHECK_INNER:-}" ]; then
  : > "$OUT/log.txt"
  # No process substitution: the pipeline ends only when tee has written
  # everything, so the log is complete when this script returns. tee
  # ignores SIGINT and SIGTERM (sent to the whole process group when the
  # run is stopped) so that the report the inner script prints then still
  # reaches the log; it ends when the inner script does.
  trap 'true' INT TERM
  _TR_GPU_CHECK_INNER=1 "$0" "$@" 2>&1 | ( trap '' INT TERM; exec tee -a "$OUT/log.txt" )
  exit "${PIPESTATUS[0]}"
fi
cd "$(dirname "$0")/../.."
REPO="$PWD"
PY="${PYTHON:-$(command -v python3 || command -v python)}"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "${CUDA_HOME:-}" ] && [ -e /usr/local/cuda/include/cuda.h ]; then
  export CUDA_HOME=/usr/local/cuda
fi
BUDGET="${TORCH_RENAISSANCE_GPU_BUDGET:-360}"
RESERVE=20  # seconds kept for the report
export MAX_JOBS="${MAX_JOBS:-16}"
MODE=""

declare -A STATUS
ORDER=(build import smoke tests benchmarks)
for name in "${ORDER[@]}"; do STATUS[$name]="not run: no time"; done
left() { echo $(( BUDGET - RESERVE - SECONDS )); }

# step NAME CAP_SECONDS COMMAND...: runs COMMAND with timeout min(CAP, budget
# left) and records "ok (N s)" / "FAILED (...)" / "TIMEOUT after N s".
step() {
  local name="$1" cap="$2"; shift 2
  local t
  t=$(left)
  [ "$t" -gt "$cap" ] && t="$cap"
  if [ "$t" -le 5 ]; then
    STATUS[$name]="not run: no time"
    echo "== $name: not run, no time left"
    return 1
  fi
  echo "== $name (timeout ${t} s): $*"
  local t0=$SECONDS rc
  CURRENT="$name"
  STEP_T0=$SECONDS
  # In the background, so that a signal to the script is handled at once.
  timeout -s INT --kill-after=10 "$t" "$@" &
  CHILD=$!
  wait "$CHILD"
  rc=$?
  CHILD=""
  CURRENT=""
  local dt=$(( SECONDS - t0 ))
  if [ $rc -eq 0 ]; then
    STATUS[$name]="ok (${dt} s)"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    STATUS[$name]="TIMEOUT after ${dt} s"
  else
    STATUS[$name]="FAILED (exit $rc, ${dt} s)"
  fi
  echo "== $name: ${STATUS[$name]}"
  return $rc
}

REPORTED=0
report() {
  [ "$REPORTED" -eq 1 ] && return
  REPORTED=1
  # The step statuses (and the mode) go into results.json with the numbers.
  {
    echo "{"
    printf '  "mode": "%s"' "${MODE//\"/\'}"
    for name in "${ORDER[@]}"; do
      printf ',\n  "%s": "%s"' "$name" "${STATUS[$name]//\"/\'}"
    done
    printf '\n}\n'
  } > "$OUT/steps.json"
  echo "total: ${SECONDS} s (budget ${BUDGET} s)"
  echo
  timeout 15 "$PY" benchmarks/gpu/bench_gpu.py --report "$OUT"
}
CHILD=""
CURRENT=""
STEP_T0=0
interrupted() {
  echo "== interrupted after ${SECONDS} s"
  if [ -n "$CHILD" ]; then
    kill -TERM "$CHILD" 2>/dev/null
    wait "$CHILD" 2>/dev/null
  fi
  [ -n "$CURRENT" ] && STATUS[$CURRENT]="INTERRUPTED after $(( SECONDS - STEP_T0 )) s"
  report
  exit 1
}
trap interrupted INT TERM

echo "torch_renaissance GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), output in $OUT, budget ${BUDGET} s"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if ! "$PY" -c "import torch, sys; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPU available:', torch.cuda.is_available()); sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no usable CUDA GPU for $PY: nothing to check (the tests would all be skipped)"
  exit 2
fi

built=0
if step build 200 "$PY" benchmarks/gpu/build_inplace.py; then
  if step import 30 "$PY" -c "import torch_renaissance._C as C; assert C.with_cuda, 'built without CUDA'; print('extension with CUDA:', C.__file__)"; then
    built=1
  fi
fi
if [ $built -eq 1 ]; then
  if ! step smoke 30 "$PY" tests/gpu/_cases.py smoke; then
    first="${STATUS[smoke]}"
    if [ "$first" != "not run: no time" ] && \
       TORCH_RENAISSANCE_CUDA_VMM=0 step smoke 30 "$PY" tests/gpu/_cases.py smoke; then
      export TORCH_RENAISSANCE_CUDA_VMM=0
      MODE="TORCH_RENAISSANCE_CUDA_VMM=0: the smoke case failed with address ranges on (${first}) and passed without them; everything below ran without expandable segments (cudaMalloc segments)"
      STATUS[smoke]="${STATUS[smoke]} with TORCH_RENAISSANCE_CUDA_VMM=0 (with VMM: ${first})"
      echo "== $MODE"
    else
      STATUS[smoke]="${STATUS[smoke]} (with VMM: ${first}; also without)"
    fi
  fi
  if [ "${STATUS[smoke]}" != "not run: no time" ]; then
    xdist=()
    if "$PY" -c "import xdist" 2>/dev/null; then
      xdist=(-n 4)
    fi
    step tests 150 "$PY" -m pytest -m gpu tests/gpu -q -rfEs -p no:cacheprovider ${xdist[@]+"${xdist[@]}"} \
      --junitxml="$OUT/pytest.xml"
    if [ -f "$OUT/pytest.xml" ]; then
      summary=$("$PY" - "$OUT/pytest.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
cases = list(root.iter("testcase"))
failed = sum(1 for c in cases if c.find("failure") is not None or c.find("error") is not None)
skipped = [c.find("skipped") for c in cases if c.find("skipped") is not None]
notes = sorted({s.get("message", "") for s in skipped if "not deterministic" in s.get("message", "")})
text = f"{len(cases) - failed - len(skipped)} passed, {failed} failed, {len(skipped)} skipped"
print(text + "".join(f"; {n}" for n in notes))
EOF
)
      [ -n "$summary" ] && STATUS[tests]="${STATUS[tests]}: $summary"
    fi
    # Three configurations, one process each, in what is left (15 s for
    # the driver itself).
    per=$(( ($(left) - 15) / 3 ))
    [ "$per" -gt 100 ] && per=100
    if [ "$per" -ge 30 ]; then
      step benchmarks $(( 3 * per + 15 )) "$PY" benchmarks/gpu/bench_gpu.py --out "$OUT" --timeout "$per"
    else
      echo "== benchmarks: not run, only $(left) s left"
    fi
  fi
else
  for name in smoke tests benchmarks; do STATUS[$name]="not run (no CUDA build)"; done
fi

report
for name in "${ORDER[@]}"; do
  case "${STATUS[$name]}" in ok*) ;; *) exit 1 ;; esac
done
exit 0
