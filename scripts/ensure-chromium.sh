#!/usr/bin/env bash
# Make sure Debian's Chromium is installed for the console's browser tests (tests/service/
# test_console_browser.py drive it with Playwright through executable_path, never a downloaded
# browser). Installs the packages chromium + chromium-driver through apt-get when running as root
# on Debian/Ubuntu; otherwise says exactly what to install and fails.
set -euo pipefail

BROWSER=${VERSIQ_CHROMIUM:-/usr/bin/chromium}

if [ -x "$BROWSER" ]; then
    exit 0
fi
echo "No Chromium at $BROWSER; the console's browser tests need one." >&2
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    echo "Installing chromium and chromium-driver with apt-get ..."
    apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
    if [ -x "$BROWSER" ]; then
        echo "Chromium installed: $("$BROWSER" --version 2>/dev/null || echo "$BROWSER")"
        exit 0
    fi
    echo "apt-get could not install Chromium." >&2
fi

cat >&2 <<MSG
Install Chromium, then run make again:
  Debian/Ubuntu:  sudo apt-get install chromium chromium-driver
or point VERSIQ_CHROMIUM at a Chromium/Chrome binary.
MSG
exit 1
