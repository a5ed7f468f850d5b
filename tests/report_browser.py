"""Opening report pages in a real headless browser (Debian's chromium, driven by Playwright) for the tests.

`Browser.open(path)` loads a page from its file:// URL, waits for its plots, and returns a `Loaded` with the
page and every console error, warning and uncaught exception it raised. Screenshots go to `ARTIFACTS`
(`test-artifacts/report/`, ignored by git), kept after the run.
"""

from dataclasses import dataclass, field
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "report"

# Per plot on the page: the number of points of each of its traces (plotly keeps them on the div).
PLOT_POINTS = "Array.from(document.querySelectorAll('.plot')).map(d => (d.data || []).map(t => (t.x || []).length))"
RENDERED_TRACES = "document.querySelectorAll('.plot .scatterlayer .trace, .plot .barlayer .trace').length"


@dataclass
class Loaded:
    """A loaded page and what went wrong on it."""

    page: object
    errors: list[str] = field(default_factory=list)


class Browser:
    """One chromium for a test module; a fresh page per `open`."""

    def __init__(self, playwright):
        self.chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        self.pages: list = []

    def open(self, path: Path, screenshot: str | None = None) -> Loaded:
        """Loads `path`, waits until the page and its plots are drawn, screenshots it when named. The page
        opened before is closed (one page at a time keeps chromium small)."""
        for earlier in self.pages:
            earlier.close()
        page = self.chromium.new_page(viewport={"width": 1280, "height": 900})
        self.pages = [page]
        loaded = Loaded(page)
        page.on("console", lambda m: loaded.errors.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: loaded.errors.append(f"uncaught: {e}"))
        page.goto(path.resolve().as_uri(), wait_until="load")
        page.wait_for_function("Array.from(document.querySelectorAll('.plot')).every(d => d.data !== undefined)",
                               timeout=20_000)
        if screenshot:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"{screenshot}.png"), full_page=True)
        return loaded

    def close(self) -> None:
        """Closes every page and the browser."""
        for page in self.pages:
            page.close()
        self.chromium.close()


@pytest.fixture(scope="module")
def browser():
    """Headless chromium for the module; skips with what to run when it is not installed."""
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium: run `make system`")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        opened = Browser(playwright)
        yield opened
        opened.close()
