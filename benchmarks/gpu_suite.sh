#!/usr/bin/env bash
# Everything OpenREALM measures on a lent GPU, in one run (benchmarks/performance.md, the "On a GPU" sections):
#   1. exact MIPS over 13,353,718 x 128 against the measured memory and matmul ceilings (bench_gpu_mips.py)
#   2. BERT-base block embedding at 288 wordpieces, bf16 + SDPA, against the measured bf16 peak (bench_index_build.py)
#   3. REALM pre-training throughput at BERT-base, bf16, with and without an async build, and a kernel profile
#   4. REALM's learning at an effective batch of 512 (64 x 8 accumulated) on the quickstart's world, two seeds at once:
#      the learned reader (the reading warm-up's encoder) against the oracle reader, refresh async against off,
#      while the CUDA tests run beside them
# Each step has its own time limit and writes its log to $OUT. The device machine lacks some of the package's
# dependencies: they travel as wheels in .whl/ (each GPU session in benchmarks/performance.md lists them) and install
# to /tmp/site.
#
#   benchmarks/gpu_suite.sh             on the GPU machine, from the repository root ($OUT set by the device tool)
#   benchmarks/gpu_suite.sh --dry-run   here, on the CPU at tiny sizes (checks the script end to end)
#   ONLY=pretrain,learning benchmarks/gpu_suite.sh   those steps alone
set -u
cd "$(dirname "$0")/.."
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
OUT=${OUT:-/tmp/gpu_suite_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=python3
if [ $DRY = 1 ]; then
  PY=${PYTHON:-.venv/bin/python}
else
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade --target /tmp/site . \
      || echo "openrealm install failed"
    echo "libcublas.so.12 (faiss-gpu-cu12 needs it): $(ls /usr/lib/x86_64-linux-gnu/libcublas.so.12* /usr/local/cuda*/lib64/libcublas.so.12* 2>/dev/null | head -1) $(find / -xdev -name 'libcublas.so.12*' 2>/dev/null | head -1)"
  } > "$OUT/env.txt" 2>&1
  export PYTHONPATH=/tmp/site
  $PY -c "import torch, transformers, datasets, faiss, openrealm; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'datasets', datasets.__version__, 'faiss', faiss.__version__, 'gpus', faiss.get_num_gpus())" >> "$OUT/env.txt" 2>&1
fi
tail -3 "$OUT/env.txt" 2>/dev/null
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $OUT/NAME.log, print its tail
  local name=$1 limit=$2
  [[ -n "${ONLY:-}" && ",$ONLY," != *",$name,"* ]] && return  # ONLY=pretrain,tests runs those steps alone
  shift 2
  local started=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? in $((SECONDS - started)) s"
  grep -v "it/s\]\|examples/s\]\|blocks/s\]" "$OUT/$name.log" | tail -n 18
}
learning() {  # learning SEED STEPS BATCH ACCUMULATION ENCODER MODES: bench_learning.py, its log and results in one file
  $PY benchmarks/research/bench_learning.py --output /tmp/learning-s$1-$6 --seed $1 --steps $2 --batch-size $3 \
    --pretrain-args "--gradient-accumulation-steps $4" --eval-every $(( $2 / 3 )) --encoder $5 --modes $6 \
    --oracle-reader-weight 0,1 --hold-out 30 --queries-per-block 4 --recall-k 5 --learning-rate 3e-5 \
    --embedder-learning-rate 3e-4
  cat /tmp/learning-s$1-$6/results.json
}
if [ $DRY = 1 ]; then
  step mips 300 bash -c "cd benchmarks && ../$PY bench_gpu_mips.py --device cpu --num-blocks 50000 --dtypes float32,bfloat16 --repeats 2 --chunk-sizes 8192 --tile-rows 128"
  step index_build 300 bash -c "cd benchmarks && ../$PY bench_index_build.py --models bert-base-288 --dtype bfloat16 --num-blocks 4 --batch-size 2 --measure-peak"
  step pretrain 600 bash -c "cd benchmarks && ../$PY bench_pretrain.py --steps 7 --batch-size 2 --measure-peak --repeats 1 --profile $OUT/profile.txt"
  export -f learning; export PY
  step learning 600 bash -c "learning 0 3 8 2 random async,off"
  step tests 300 $PY -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_index_realm.py -k "cuda or half_precision or tiled"
else
  step mips 60 bash -c "cd benchmarks && $PY bench_gpu_mips.py --device cuda --dtypes float32,bfloat16 --chunk-sizes 262144,4194304 --tile-rows 128,1024 --repeats 10"
  step index_build 60 bash -c "cd benchmarks && $PY bench_index_build.py --device cuda --models bert-base-288 --dtype bfloat16 --half-weights cast,autocast --num-blocks 32768 --batch-size 256 --measure-peak"
  step pretrain 130 bash -c "cd benchmarks && $PY bench_pretrain.py --model bert-base --bf16 --measure-peak --steps 40 --batch-size 16 --repeats 2 --profile $OUT/profile.txt"
  export -f learning; export PY
  step tests 150 $PY -m pytest -q -p no:cacheprovider -n 4 --durations=10 tests/test_gpu.py tests/test_index_realm.py -k "cuda or half_precision or tiled" &
  if [[ -z "${ONLY:-}" || ",$ONLY," == *",learning,"* ]]; then
    for seed in 0 1; do for mode in async off; do  # 4 processes: the tiny towers leave the GPU and 16 cores idle
      ( timeout 280 bash -c "learning $seed 60 64 8 reading-warmup $mode" > /tmp/learning$seed$mode.log 2>&1 ) &
    done; done
  fi
  wait
  cat /tmp/learning*.log 2>/dev/null | grep -v "it/s\]\|Loading weights\|Writing model" > "$OUT/learning.log"
  grep -h -A12 "^| refresh | step\|^| embedder | zero-shot" /tmp/learning*.log
fi
