#!/bin/bash
# Oracle: fill in and submit the sign-up form in headless chromium, driven by Playwright.
set -euo pipefail
python3 - <<'PY'
from playwright.sync_api import sync_playwright

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True)
    page = browser.new_page()
    page.goto("http://127.0.0.1:8080/signup")
    page.fill("#name", "Ada Lovelace")
    page.fill("#email", "ada@example.org")
    page.select_option("#plan", "pro")
    page.check("#terms")
    page.click("text=Create account")
    page.wait_for_selector("text=Account created")
    browser.close()
PY
