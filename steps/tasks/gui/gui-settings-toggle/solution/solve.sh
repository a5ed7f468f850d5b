#!/bin/bash
# Oracle: toggle two settings and save, in headless chromium driven by Playwright.
set -euo pipefail
python3 - <<'PY'
from playwright.sync_api import sync_playwright

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True)
    page = browser.new_page()
    page.goto("http://127.0.0.1:8080/settings")
    page.check("#two_factor")
    page.uncheck("#marketing_emails")
    page.click("text=Save")
    page.wait_for_selector("text=Your settings were saved")
    browser.close()
PY
