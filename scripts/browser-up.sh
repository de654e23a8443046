#!/usr/bin/env bash
# Make headless Chromium and its WebDriver available for depsi's browser tests
# (tests/test_view.py). Installs Debian's chromium and chromium-driver with apt when missing.
# Running it again when both are there does nothing.
#
#   bash scripts/browser-up.sh
#
# Exit status: 0 when chromium and chromedriver are on PATH; 2 when they cannot be installed here
# (not root, no apt-get, install failed), with the reason on stderr in a line starting
# "browser-up: cannot install Chromium:" and in $DEPSI_BROWSER_DIR/unavailable (default
# /tmp/depsi-browser), which the tests print when they skip.
set -uo pipefail

STATE="${DEPSI_BROWSER_DIR:-/tmp/depsi-browser}"
PACKAGES=(chromium chromium-driver)

log() { echo "browser-up: $*" >&2; }
cannot() { log "cannot install Chromium: $*"; echo "$*" > "$STATE/unavailable" 2>/dev/null; exit 2; }

mkdir -p "$STATE" 2>/dev/null || { echo "browser-up: cannot create $STATE" >&2; exit 2; }
rm -f "$STATE/unavailable"

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
[[ "$(id -u)" == 0 ]] || cannot "chromium or chromedriver missing and not root (uid $(id -u)) to install ${PACKAGES[*]}"
command -v apt-get >/dev/null 2>&1 || cannot "chromium or chromedriver missing and no apt-get to install ${PACKAGES[*]}"
log "installing ${PACKAGES[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq "${PACKAGES[@]}"; } >"$STATE/apt.log" 2>&1; then
    cannot "apt-get install ${PACKAGES[*]} failed (log: $STATE/apt.log)"
fi
command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 \
    || cannot "apt-get installed ${PACKAGES[*]} but chromium or chromedriver is not on PATH"
log "$(chromium --version 2>/dev/null | head -1)"
exit 0
