#!/bin/bash
# Oracle: add to the cart three times, go to the cart, check out; headless chromium driven by Playwright.
set -euo pipefail
python3 - <<'PY'
from playwright.sync_api import sync_playwright

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True)
    page = browser.new_page()
    for product in ("Blue Mug", "Blue Mug", "Tea Sampler"):
        page.goto("http://127.0.0.1:8080/shop")
        page.get_by_role("button", name=f"Add {product} to cart").click()
        page.wait_for_selector("text=Added to your cart")
    page.get_by_role("link", name="Cart").click()
    page.wait_for_selector("text=Blue Mug x 2")
    page.click("text=Checkout")
    page.fill("#name", "Grace Hopper")
    page.fill("#address", "1 Navy Way, Arlington")
    page.click("text=Place order")
    page.wait_for_selector("text=Thank you for your order")
    browser.close()
PY
