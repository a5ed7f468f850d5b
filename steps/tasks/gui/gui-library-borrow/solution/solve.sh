#!/bin/bash
# Oracle: search the library, pick the right result, borrow it; headless chromium driven by Playwright.
set -euo pipefail
python3 - <<'PY'
from playwright.sync_api import sync_playwright

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True)
    page = browser.new_page()
    page.goto("http://127.0.0.1:8080/library")
    page.fill("#q", "Le Guin")
    page.click("text=Search")
    page.locator("#results li", has_text="The Dispossessed, by").get_by_role("button", name="Borrow").click()
    page.wait_for_selector("text=You borrowed The Dispossessed")
    browser.close()
PY
