#!/usr/bin/env bash
# Install the headless browser that tests/test_slides.py drives (Debian's chromium), if it is missing.
# Never fails the build: when it cannot install, it says why and exits 0, and the slide test then skips
# with that reason. Quiet on success.
#   bash scripts/install_browser.sh          # install if needed
#   CHROMIUM=/path/to/chromium ...           # a browser elsewhere: nothing to install
set -u
browser="${CHROMIUM:-/usr/bin/chromium}"
if [ -x "$browser" ]; then
  exit 0
fi
for other in chromium chromium-browser google-chrome; do
  if command -v "$other" >/dev/null 2>&1; then
    exit 0
  fi
done
if [ "$(id -u)" != "0" ]; then
  echo "[browser] no chromium and not root: cannot apt-get install it; the slide browser test will skip" \
       "(install it yourself: sudo apt-get install chromium, or set CHROMIUM=/path/to/chromium)"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "[browser] no chromium and no apt-get on this machine; the slide browser test will skip" \
       "(set CHROMIUM=/path/to/a/chromium to run it)"
  exit 0
fi
echo "[browser] installing chromium with apt-get (once; about a minute)"
start=$(date +%s)
log=$(mktemp)
if DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$log" 2>&1 \
   && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >>"$log" 2>&1; then
  echo "[browser] chromium installed in $(( $(date +%s) - start )) s"
else
  echo "[browser] apt-get could not install chromium (the slide browser test will skip); last lines:"
  tail -n 5 "$log" | sed 's/^/[browser]   /'
fi
rm -f "$log"
exit 0
