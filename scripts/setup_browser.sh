#!/usr/bin/env bash
# Install the browser the JupyterLab test drives (tests/browser/test_browser_lab.py): Debian's
# chromium + chromium-driver. Playwright uses it through executable_path, so no browser
# download from the internet is needed. Idempotent: does nothing when /usr/bin/chromium exists.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
    echo "chromium present: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup_browser: no apt-get here; install chromium yourself (the browser test skips without it)" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "setup_browser: not root and no sudo; the browser test will skip" >&2
        exit 0
    fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver
/usr/bin/chromium --version
