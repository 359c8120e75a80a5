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
# hanging step is reported in the table instead of stalling the run. Uses
# $PYTHON (default: python) and MAX_JOBS (default 16) for the build.
set -uo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python}"
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
  timeout --kill-after=10 "$t" "$@"
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
"$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPU available:', torch.cuda.is_available())"

built=0
if step build 240 env TORCH_RENAISSANCE_CUDA=1 "$PY" setup.py build_ext --inplace; then
  if step import 60 "$PY" -c "import torch_renaissance._C as C; assert C.with_cuda, 'built without CUDA'; print('extension with CUDA:', C.__file__)"; then
    built=1
  fi
fi
if [ $built -eq 1 ]; then
  step tests 240 "$PY" -m pytest -m gpu tests/gpu -q -p no:cacheprovider --junitxml="$OUT/pytest.xml"
  # Three configurations, one process each: share what is left between them.
  per=$(( ($(left) - 45) / 3 ))
  [ "$per" -gt 100 ] && per=100
  step benchmarks 330 "$PY" benchmarks/gpu/bench_gpu.py --out "$OUT" --timeout "$per"
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
