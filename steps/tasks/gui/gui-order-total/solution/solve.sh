#!/bin/bash
# Oracle: follow Ines's order link, read its total, report it; headless chromium driven by Playwright.
set -euo pipefail
python3 - <<'PY'
from playwright.sync_api import sync_playwright

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True)
    page = browser.new_page()
    page.goto("http://127.0.0.1:8080/orders")
    page.click("li:has-text('Ines') a")
    number = page.inner_text("h1").split("#")[1]
    total = page.inner_text("#total").split(": ")[1]
    page.click("text=All orders")
    page.click("text=Report a total")
    page.fill("#order", number)
    page.fill("#total", total)
    page.click("text=Submit")
    page.wait_for_selector("text=Your answer was recorded")
    browser.close()
PY
