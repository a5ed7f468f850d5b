"""The built-in GUI tasks' web app: a small shop, library, sign-up form, settings page, order list and kiosk page.

    python3 /opt/site/site.py [--port 8080] [--ready FILE]

It listens on 127.0.0.1 only and keeps everything the verifiers grade in STATE (JSON, rewritten whole after
every change). It runs beside the agent in a sandbox of its own (task.toml `[environment] app`), so the agent
changes STATE only through these pages. Per-run values (the orders' totals) are drawn at start, so that no
copy of this file tells them. It creates the ready file once it listens.
"""

import argparse
import html
import json
import os
import random
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

STATE_DIR = Path("/var/lib/openforge/app")
STATE = STATE_DIR / "state.json"
MAX_BODY = 64 * 1024
PLANS = ("free", "team", "pro")
SETTINGS = {"two_factor": "Two-factor authentication", "marketing_emails": "Marketing emails",
            "weekly_digest": "Weekly digest", "dark_mode": "Dark mode"}
BOOKS = [{"id": "b1", "title": "The Left Hand of Darkness", "author": "Ursula K. Le Guin"},
         {"id": "b2", "title": "The Dispossessed", "author": "Ursula K. Le Guin"},
         {"id": "b3", "title": "A Wizard of Earthsea", "author": "Ursula K. Le Guin"},
         {"id": "b4", "title": "Dune", "author": "Frank Herbert"},
         {"id": "b5", "title": "The Dispossessed: A Study Guide", "author": "M. Reader"},
         {"id": "b6", "title": "Kindred", "author": "Octavia E. Butler"}]
PRODUCTS = {"p1": ("Blue Mug", 1200), "p2": ("Tea Sampler", 1850), "p3": ("Red Mug", 1200), "p4": ("Teapot", 3400)}
LOCK = threading.Lock()


def fresh_state() -> dict:
    """The state at start: defaults, and the orders with totals drawn for this run."""
    draw = random.SystemRandom()
    orders = {str(number): {"customer": name, "total_cents": draw.randrange(1000, 99999)}
              for number, name in zip(range(1040, 1046), ("Kim", "Ravi", "Ines", "Tomas", "Mei", "Olu"))}
    return {"signups": [], "settings": {"two_factor": False, "marketing_emails": True, "weekly_digest": True,
                                        "dark_mode": False},
            "settings_saved": 0, "orders": orders, "answers": [], "borrowed": [], "cart": {}, "placed": [],
            "launched": 0}


def save(state: dict) -> None:
    """Write the state whole (a temporary file renamed over it), so a reader never sees half of it."""
    partial = STATE.with_suffix(".partial")
    partial.write_text(json.dumps(state, indent=1))
    os.replace(partial, STATE)


def page(title: str, body: str) -> bytes:
    """A whole HTML page."""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:2em} label{display:block;margin:.5em 0}"
            "button{font-size:1em;margin:.3em}</style></head>"
            f"<body><h1>{html.escape(title)}</h1>{body}</body></html>").encode()


def money(cents: int) -> str:
    """`1234` -> `$12.34`."""
    return f"${cents // 100}.{cents % 100:02d}"


class Site(BaseHTTPRequestHandler):
    """Every page; GETs read the state, POSTs change it under LOCK."""

    state: dict = {}

    def log_message(self, *args) -> None:  # one line per request, in the app's log
        print(self.address_string(), self.requestline, flush=True)

    def send(self, body: bytes, status: int = 200, location: str | None = None) -> None:
        self.send_response(status)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def form(self) -> dict[str, str]:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return {}
        fields = urllib.parse.parse_qs(self.rfile.read(length).decode(errors="replace"))
        return {key: values[-1] for key, values in fields.items()}

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        parts = [p for p in url.path.split("/") if p]
        with LOCK:
            if url.path == "/":
                links = "".join(f"<li><a href='/{p}'>{p}</a></li>"
                                for p in ("signup", "settings", "orders", "library", "shop"))
                return self.send(page("Welcome", f"<ul>{links}</ul>"))
            if parts[:1] == ["orders"] and len(parts) == 2 and parts[1] in self.state["orders"]:
                order = self.state["orders"][parts[1]]
                return self.send(page(f"Order #{parts[1]}", f"<p>Customer: {order['customer']}</p>"
                                      f"<p id='total'>Total: {money(order['total_cents'])}</p>"
                                      "<p><a href='/orders'>All orders</a></p>"))
            handler = {"/signup": self.signup_page, "/settings": self.settings_page, "/orders": self.orders_page,
                       "/answer": self.answer_page, "/library": self.library_page, "/shop": self.shop_page,
                       "/cart": self.cart_page, "/checkout": self.checkout_page, "/desktop": self.desktop_page}
            if url.path in handler:
                return self.send(handler[url.path](query))
        self.send(page("Not found", "<p>No such page.</p>"), 404)

    def do_POST(self) -> None:
        fields = self.form()
        handler = {"/signup": self.signup, "/settings": self.save_settings, "/answer": self.answer,
                   "/library/borrow": self.borrow, "/cart/add": self.add_to_cart, "/checkout": self.checkout,
                   "/desktop/launch": self.launch}.get(urllib.parse.urlsplit(self.path).path)
        if handler is None:
            return self.send(page("Not found", "<p>No such form.</p>"), 404)
        with LOCK:
            body = handler(fields)
            save(self.state)
        self.send(body)

    def signup_page(self, query: dict) -> bytes:
        plans = "".join(f"<option value='{p}'>{p.title()}</option>" for p in PLANS)
        return page("Sign up", "<form method='post' action='/signup'>"
                    "<label>Full name <input name='name' id='name'></label>"
                    "<label>Email <input name='email' id='email' type='email'></label>"
                    f"<label>Plan <select name='plan' id='plan'>{plans}</select></label>"
                    "<label><input type='checkbox' name='terms' id='terms' value='yes'> I accept the terms</label>"
                    "<button type='submit'>Create account</button></form>")

    def signup(self, fields: dict) -> bytes:
        entry = {key: fields.get(key, "")[:200] for key in ("name", "email", "plan", "terms")}
        self.state["signups"].append(entry)
        return page("Welcome aboard", f"<p>Account created for {html.escape(entry['name'])}.</p>")

    def settings_page(self, query: dict) -> bytes:
        boxes = "".join(f"<label><input type='checkbox' name='{key}' id='{key}' value='on'"
                        f"{' checked' if self.state['settings'][key] else ''}> {label}</label>"
                        for key, label in SETTINGS.items())
        return page("Settings", f"<form method='post' action='/settings'>{boxes}<button type='submit'>Save</button></form>")

    def save_settings(self, fields: dict) -> bytes:
        self.state["settings"] = {key: fields.get(key) == "on" for key in SETTINGS}
        self.state["settings_saved"] += 1
        return page("Settings saved", "<p>Your settings were saved.</p><p><a href='/settings'>Back</a></p>")

    def orders_page(self, query: dict) -> bytes:
        rows = "".join(f"<li><a href='/orders/{n}'>Order #{n}</a> ({o['customer']})</li>"
                       for n, o in self.state["orders"].items())
        return page("Orders", f"<ul>{rows}</ul><p><a href='/answer'>Report a total</a></p>")

    def answer_page(self, query: dict) -> bytes:
        return page("Report a total", "<form method='post' action='/answer'>"
                    "<label>Order number <input name='order' id='order'></label>"
                    "<label>Total <input name='total' id='total'></label>"
                    "<button type='submit'>Submit</button></form>")

    def answer(self, fields: dict) -> bytes:
        self.state["answers"].append({"order": fields.get("order", "")[:40], "total": fields.get("total", "")[:40]})
        return page("Thank you", "<p>Your answer was recorded.</p>")

    def library_page(self, query: dict) -> bytes:
        words = query.get("q", "").lower().split()
        found = [b for b in BOOKS if words and all(w in f"{b['title']} {b['author']}".lower() for w in words)]
        results = "".join(f"<li>{html.escape(b['title'])}, by {html.escape(b['author'])} <form method='post' "
                          f"action='/library/borrow' style='display:inline'><input type='hidden' name='book' "
                          f"value='{b['id']}'><button type='submit'>Borrow</button></form></li>" for b in found)
        shown = f"<ul id='results'>{results}</ul>" if words else ""
        return page("Library", "<form method='get' action='/library'><input name='q' id='q' placeholder='Search'>"
                    f"<button type='submit'>Search</button></form>{shown}")

    def borrow(self, fields: dict) -> bytes:
        book = next((b for b in BOOKS if b["id"] == fields.get("book")), None)
        if book is None:
            return page("Library", "<p>No such book.</p>")
        self.state["borrowed"].append(book["id"])
        return page("Borrowed", f"<p>You borrowed {html.escape(book['title'])}.</p>")

    def shop_page(self, query: dict) -> bytes:
        items = "".join(f"<li>{name} {money(price)} <form method='post' action='/cart/add' style='display:inline'>"
                        f"<input type='hidden' name='product' value='{pid}'><button type='submit' "
                        f"aria-label='Add {name} to cart'>Add to cart</button></form></li>"
                        for pid, (name, price) in PRODUCTS.items())
        return page("Shop", f"<ul>{items}</ul><p><a href='/cart'>Cart ({sum(self.state['cart'].values())})</a></p>")

    def add_to_cart(self, fields: dict) -> bytes:
        product = fields.get("product")
        if product in PRODUCTS:
            self.state["cart"][product] = self.state["cart"].get(product, 0) + 1
        return page("Added", "<p>Added to your cart.</p><p><a href='/shop'>Keep shopping</a> | "
                    "<a href='/cart'>Cart</a></p>")

    def cart_page(self, query: dict) -> bytes:
        lines = "".join(f"<li>{PRODUCTS[p][0]} x {n}</li>" for p, n in self.state["cart"].items())
        return page("Cart", f"<ul>{lines or '<li>(empty)</li>'}</ul><p><a href='/checkout'>Checkout</a></p>")

    def checkout_page(self, query: dict) -> bytes:
        return page("Checkout", "<form method='post' action='/checkout'>"
                    "<label>Name <input name='name' id='name'></label>"
                    "<label>Address <input name='address' id='address'></label>"
                    "<button type='submit'>Place order</button></form>")

    def checkout(self, fields: dict) -> bytes:
        if not self.state["cart"]:
            return page("Checkout", "<p>Your cart is empty.</p>")
        self.state["placed"].append({"items": {PRODUCTS[p][0]: n for p, n in self.state["cart"].items()},
                                     "name": fields.get("name", "")[:200], "address": fields.get("address", "")[:200]})
        self.state["cart"] = {}
        return page("Order placed", "<p>Thank you for your order.</p>")

    def desktop_page(self, query: dict) -> bytes:
        Path("/tmp/desktop-shown").touch()
        return ("<!doctype html><html><body style='margin:0;background:#223'>"
                "<form method='post' action='/desktop/launch'><button type='submit' id='launch' style='position:"
                "absolute;left:412px;top:334px;width:200px;height:100px;background:#2a2;color:#fff;font-size:28px;"
                "border:0'>Launch</button></form></body></html>").encode()

    def launch(self, fields: dict) -> bytes:
        self.state["launched"] += 1
        return page("Launched", "<p>Launched.</p>")


def main() -> None:
    """Serve on 127.0.0.1 until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--ready", type=Path, default=STATE_DIR / "ready")
    args = parser.parse_args()
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    Site.state = fresh_state()
    save(Site.state)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Site)
    args.ready.touch()
    server.serve_forever()


if __name__ == "__main__":
    main()
