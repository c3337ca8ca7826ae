#!/usr/bin/env bash
# Screenshots of the built documentation site in headless Chromium (Debian's `chromium`
# package), to check that its pages render without console errors: the front page, one API
# page and the widest table's page.
#
#   sphinx-build -W --keep-going -n -b html docs docs/_build/html && bash tools/docs_screenshots.sh
set -euo pipefail
cd "$(dirname "$0")/.."
HTML=$(realpath "${1:-docs/_build/html}")
OUT=${2:-docs/screenshots}
command -v chromium >/dev/null || { echo "needs chromium (apt-get install chromium)" >&2; exit 1; }
mkdir -p "$OUT"
for page in index api/linen which_norm; do
  # (which_norm: its six-column table must fit the content column at 1280 px)
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1500 \
    --disable-background-networking --disable-component-update --disable-sync \
    --no-first-run --user-data-dir="$(mktemp -d)" --enable-logging=stderr --v=0 \
    --screenshot="$OUT/$(echo "$page" | tr / _).png" "file://$HTML/$page.html" \
    2>"$OUT/console.log" || true
  test -s "$OUT/$(echo "$page" | tr / _).png"
  if grep -i "CONSOLE.*\(error\|invalid\)" "$OUT/console.log"; then
    echo "docs: $page logs the errors above in the browser console" >&2
    exit 1
  fi
done
rm -f "$OUT/console.log"
ls -l "$OUT"
