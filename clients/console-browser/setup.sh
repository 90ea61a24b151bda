#!/usr/bin/env bash
# Installs what tests/console.rs drives the console with: Chromium from the OS packages (Debian's
# `chromium`) when missing, and puppeteer-core from npm (package-lock.json).
#   bash clients/console-browser/setup.sh
set -euo pipefail
cd "$(dirname "$0")"
if [[ ! -x "${APTIX_CHROMIUM:-/usr/bin/chromium}" ]]; then
  sudo=""
  [[ "$(id -u)" -ne 0 ]] && sudo="sudo"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium
fi
npm ci --no-audit --no-fund
"${APTIX_CHROMIUM:-/usr/bin/chromium}" --version
