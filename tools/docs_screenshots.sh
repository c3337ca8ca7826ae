#!/usr/bin/env bash
# Screenshots of the built documentation site in headless Chromium (Debian's `chromium`
# package), to check that its pages render: the front page and one API page.
#
#   sphinx-build -W --keep-going -n -b html docs docs/_build/html && bash tools/docs_screenshots.sh
set -euo pipefail
cd "$(dirname "$0")/.."
HTML=${1:-docs/_build/html}
OUT=${2:-docs/screenshots}
command -v chromium >/dev/null || { echo "needs chromium (apt-get install chromium)" >&2; exit 1; }
mkdir -p "$OUT"
for page in index api/linen; do
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1500 \
    --screenshot="$OUT/$(echo "$page" | tr / _).png" "file://$PWD/$HTML/$page.html" 2>/dev/null
  test -s "$OUT/$(echo "$page" | tr / _).png"
done
ls -l "$OUT"
