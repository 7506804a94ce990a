#!/usr/bin/env bash
# Install Debian's chromium for the status page's browser test (Playwright drives it
# through executable_path; no browser is downloaded). Soft: where it cannot be
# installed (no apt-get, not root) it says so and the browser test skips saying why.
set -uo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-chromium: no apt-get here; install chromium to run the status page's browser test" >&2
  exit 0
fi
sudo=""
if [[ "$(id -u)" != 0 ]]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo -n"
  else
    echo "install-chromium: not root; run 'apt-get install chromium' to run the status page's browser test" >&2
    exit 0
  fi
fi
echo "install-chromium: apt-get install chromium" >&2
$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null \
  || echo "install-chromium: apt-get install chromium failed; the browser test will skip" >&2
