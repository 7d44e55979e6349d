#!/usr/bin/env bash
# System packages the browser test of the HTML report needs (Debian chromium). Best effort:
# the test skips with a clear reason when no browser can be had.
set -u
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "test-setup: could not install chromium; the browser test will be skipped"
  fi
fi
exit 0
