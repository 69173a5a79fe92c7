"""Make docs/explorer.png, the README's picture of the explorer page.

Runs ``gnnattn demo`` into a temporary folder, opens its ``explorer.html`` in
headless Chromium (Debian's ``chromium``, driven by Playwright), clicks a token
and hovers one of its edges, and saves the screenshot::

    python docs/explorer_screenshot.py [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from gnnattn.cli import main as gnnattn

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]


def shoot(chromium: str, out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        assert gnnattn(["demo", "--out", tmp, "--text", "The bank of the river was steep"]) == 0
        page_path = Path(tmp) / "explorer.html"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=ARGS)
            try:
                tab = browser.new_page(viewport={"width": 1280, "height": 900})
                tab.goto(page_path.as_uri())
                tab.wait_for_function("window.gnnattnExplorer && window.gnnattnExplorer.ready")
                target, source = 4, 1  # "river", and its edge from "bank"
                tab.mouse.click(*tab.evaluate(f"gnnattnExplorer.nodePoint({target})"))
                tab.wait_for_function(f"gnnattnExplorer.state().focus === {target}")
                point = tab.evaluate(f"gnnattnExplorer.edgePoint({source}, {target})")
                tab.mouse.move(*point)
                tab.wait_for_selector("#tooltip:not([hidden])")
                tab.screenshot(path=str(out))
            finally:
                browser.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("explorer.png"))
    a = p.parse_args()
    shoot(a.chromium, a.out)
    print(f"wrote {a.out}")
