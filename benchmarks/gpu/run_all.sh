#!/usr/bin/env bash
# The one-command GPU check: build in place, run the GPU tests, run the GPU
# benchmarks side by side with PyTorch's allocator, print one table last.
#
#   benchmarks/gpu/run_all.sh OUTDIR
#
# Writes OUTDIR/log.txt (everything printed), OUTDIR/results.json (the
# numbers, the GPU, torch and CUDA versions, the date, each step's status) and
# OUTDIR/pytest.xml. Every step runs under a timeout taken from one budget
# (TORCH_RENAISSANCE_GPU_BUDGET seconds, default 450, under 8 minutes), so a
# hanging step is reported in the table instead of stalling the run; a step
# that runs out of time gets SIGINT first (pytest then still writes its
# report). Uses $PYTHON (default: python3, else python), MAX_JOBS (default 16)
# and CUDA_HOME (default /usr/local/cuda when it holds the toolkit). Without
# a usable GPU it stops at once with exit status 2.
set -uo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
cd "$(dirname "$0")/../.."
PY="${PYTHON:-$(command -v python3 || command -v python)}"
export PYTHONUNBUFFERED=1
if [ -z "${CUDA_HOME:-}" ] && [ -e /usr/local/cuda/include/cuda.h ]; then
  export CUDA_HOME=/usr/local/cuda
fi
BUDGET="${TORCH_RENAISSANCE_GPU_BUDGET:-450}"
export MAX_JOBS="${MAX_JOBS:-16}"
: > "$OUT/log.txt"
exec > >(tee -a "$OUT/log.txt") 2>&1

declare -A STATUS
ORDER=()
left() { echo $(( BUDGET - SECONDS )); }
# step NAME CAP_SECONDS COMMAND...: runs COMMAND with timeout min(CAP, budget
# left - 30 s reserved for the report) and records "ok (N s)" / "FAILED" / "TIMEOUT".
step() {
  local name="$1" cap="$2"; shift 2
  local t=$(( $(left) - 30 ))
  [ "$t" -gt "$cap" ] && t="$cap"
  ORDER+=("$name")
  if [ "$t" -le 5 ]; then
    STATUS[$name]="SKIPPED (no time left)"
    echo "== $name: skipped, no time left"
    return 1
  fi
  echo "== $name (timeout ${t} s): $*"
  local t0=$SECONDS rc
  timeout -s INT --kill-after=15 "$t" "$@"
  rc=$?
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

echo "torch_renaissance GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), output in $OUT"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if ! "$PY" -c "import torch, sys; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPU available:', torch.cuda.is_available()); sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no usable CUDA GPU for $PY: nothing to check (the tests would all be skipped)"
  exit 2
fi

built=0
if step build 240 "$PY" benchmarks/gpu/build_inplace.py; then
  if step import 60 "$PY" -c "import torch_renaissance._C as C; assert C.with_cuda, 'built without CUDA'; print('extension with CUDA:', C.__file__)"; then
    built=1
  fi
fi
if [ $built -eq 1 ]; then
  step tests 220 "$PY" -m pytest -m gpu tests/gpu -q -rfE -p no:cacheprovider --junitxml="$OUT/pytest.xml"
  # Three configurations, one process each: share what is left between them
  # (30 s stay for the report, 15 s for the driver itself).
  per=$(( ($(left) - 45) / 3 ))
  [ "$per" -gt 100 ] && per=100
  if [ "$per" -ge 45 ]; then
    step benchmarks 330 "$PY" benchmarks/gpu/bench_gpu.py --out "$OUT" --timeout "$per"
  else
    ORDER+=(benchmarks)
    STATUS[benchmarks]="SKIPPED (only $(left) s left)"
  fi
else
  ORDER+=(tests benchmarks)
  STATUS[tests]="not run (no CUDA build)"
  STATUS[benchmarks]="not run (no CUDA build)"
fi

# The step statuses go into results.json with the numbers.
{
  echo "{"
  sep=""
  for name in "${ORDER[@]}"; do
    printf '%s  "%s": "%s"' "$sep" "$name" "${STATUS[$name]}"
    sep=$',\n'
  done
  printf '\n}\n'
} > "$OUT/steps.json"
echo "total: ${SECONDS} s"
echo
"$PY" benchmarks/gpu/bench_gpu.py --report "$OUT"
for name in "${ORDER[@]}"; do
  case "${STATUS[$name]}" in ok*) ;; *) exit 1 ;; esac
done
exit 0
