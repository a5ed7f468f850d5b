#!/bin/bash
# The desktop tasks' app: X display :1 (1024x768, also on TCP 127.0.0.1:6001 for the agent's xdotool and
# screenshots), the site, and chromium in kiosk mode showing its /desktop page. Ready once that page is shown.
set -u
state=/var/lib/openforge/app
Xvfb :1 -screen 0 1024x768x24 -listen tcp -ac -nolisten unix >/tmp/xvfb.log 2>&1 &
python3 /opt/site/site.py --ready /tmp/site-ready &
for _ in $(seq 100); do [ -e /tmp/site-ready ] && [ -e /tmp/.X1-lock ] && break; sleep 0.1; done
DISPLAY=127.0.0.1:1 chromium --kiosk --no-sandbox --disable-gpu --no-first-run --window-position=0,0 \
  --window-size=1024,768 --user-data-dir=/tmp/kiosk http://127.0.0.1:8080/desktop >/tmp/kiosk.log 2>&1 &
for _ in $(seq 200); do [ -e /tmp/desktop-shown ] && break; sleep 0.1; done
sleep 2  # the page is fetched; give chromium time to paint it
touch "$state/ready"
wait
