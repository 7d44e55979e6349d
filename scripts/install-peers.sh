#!/usr/bin/env bash
# Installs the benchmark clients no one here wrote -- AIPerf and GuideLLM, from PyPI -- each into its own venv
# under a cache folder, once; reused afterwards (a stamp per tool and version). tests/e2e/test_peer_clients_e2e.py
# drives them against `specledger serve`.
#
#   scripts/install-peers.sh [CACHE_DIR]     -> CACHE_DIR/peers/{aiperf,guidellm}/bin/...
#
# CACHE_DIR defaults to $SPECLEDGER_CACHE or .cache/ in the repository (ignored by git).
# GuideLLM requires torch, and pip would pull a multi-GB CUDA build for it: it is installed with --no-deps, then its
# own requirements without torch, and the CPU torch of the project's venv ($TORCH_PYTHON, default .venv/bin/python)
# is made visible to it through a .pth file naming a folder of symlinks (torch, torchgen, functorch and torch's metadata).
# Set PEERS=aiperf (or guidellm) to install one. A failure prints the tail of the pip log and exits 1.
set -euo pipefail
AIPERF_VERSION="0.13.0"
GUIDELLM_VERSION="0.8.1"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-${SPECLEDGER_CACHE:-$ROOT/.cache}}/peers"
PY="${PYTHON:-python3}"
TORCH_PY="${TORCH_PYTHON:-$ROOT/.venv/bin/python}"
mkdir -p "$DEST"

fail() { tail -n 20 "$2" >&2 || true; echo "install-peers: $1 failed; log: $2" >&2; exit 1; }

venv() {  # venv NAME -> creates $DEST/NAME with a current pip
  local dir="$DEST/$1"
  rm -rf "$dir"
  "$PY" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --upgrade pip >>"$DEST/$1.log" 2>&1
}

install_aiperf() {
  local dir="$DEST/aiperf" stamp="$DEST/aiperf/.installed-$AIPERF_VERSION"
  [ -f "$stamp" ] && [ -x "$dir/bin/aiperf" ] && return 0
  : >"$DEST/aiperf.log"
  { venv aiperf && "$dir/bin/pip" install -q "aiperf==$AIPERF_VERSION" >>"$DEST/aiperf.log" 2>&1 \
      && "$dir/bin/aiperf" --help >/dev/null 2>&1; } || fail "AIPerf $AIPERF_VERSION" "$DEST/aiperf.log"
  touch "$stamp"
}

link_torch() {  # link_torch DIR: the project's CPU torch made importable in the venv DIR (symlinks + a .pth file)
  local dir="$1" torch_dir site
  torch_dir="$("$TORCH_PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')" &&
  site="$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" &&
  rm -rf "$dir/project-torch" && mkdir -p "$dir/project-torch" &&
  for pkg in "$torch_dir" "$(dirname "$torch_dir")"/torchgen "$(dirname "$torch_dir")"/functorch \
             "$(dirname "$torch_dir")"/torch-*.dist-info; do
    if [ -e "$pkg" ]; then ln -sfn "$pkg" "$dir/project-torch/"; fi
  done &&
  echo "$dir/project-torch" >"$site/project-torch.pth"
}

install_guidellm() {
  local dir="$DEST/guidellm" stamp="$DEST/guidellm/.installed-$GUIDELLM_VERSION" log="$DEST/guidellm.log"
  [ -x "$TORCH_PY" ] || { echo "install-peers: GuideLLM needs the project's venv for torch ($TORCH_PY): make install" >&2; exit 1; }
  if [ -f "$stamp" ] && [ -x "$dir/bin/guidellm" ]; then
    # installed before, maybe against another checkout's venv (a shared cache): its torch links must still resolve
    "$dir/bin/python" -c "import torch, guidellm" >/dev/null 2>&1 && return 0
    link_torch "$dir" && "$dir/bin/python" -c "import torch, guidellm" >>"$log" 2>&1 && return 0
  fi
  : >"$log"
  {
    venv guidellm &&
    "$dir/bin/pip" install -q --no-deps "guidellm==$GUIDELLM_VERSION" >>"$log" 2>&1 &&
    # its own requirements (no extras) and torch's pure-Python ones, never torch itself
    reqs="$("$dir/bin/python" - "$TORCH_PY" <<'EOF'
import importlib.metadata as md, re, subprocess, sys
out = []
for r in md.requires("guidellm") or []:
    if "extra ==" in r:
        continue
    if re.match(r"torch\b", r.strip()):
        continue
    out.append(r.split(";")[0].strip())
torch_reqs = subprocess.check_output([sys.argv[1], "-c", "import importlib.metadata as m; "
                                      "print('\\n'.join(m.requires('torch') or []))"], text=True).splitlines()
out += [r.split(";")[0].strip() for r in torch_reqs if r and "extra ==" not in r]
print("\n".join(out))
EOF
)" &&
    mapfile -t req_list <<<"$reqs" &&
    "$dir/bin/pip" install -q "${req_list[@]}" >>"$log" 2>&1 &&
    link_torch "$dir" &&
    "$dir/bin/python" -c "import torch, guidellm" >>"$log" 2>&1 &&
    "$dir/bin/guidellm" --help >/dev/null 2>&1
  } || fail "GuideLLM $GUIDELLM_VERSION" "$log"
  # no CUDA build may have come in through a dependency
  local site
  site="$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  if ls "$site" | grep -qiE '^(nvidia|triton)'; then
    echo "install-peers: a CUDA package entered the GuideLLM venv" >&2; exit 1
  fi
  touch "$stamp"
}

case "${PEERS:-aiperf,guidellm}" in
  *aiperf*) install_aiperf ;;
esac
case "${PEERS:-aiperf,guidellm}" in
  *guidellm*) install_guidellm ;;
esac
echo "$DEST"
