"""The workbench through each loopback name, and a rebound name refused, in a real headless
Chromium (Debian's `chromium` through Playwright).

HANGAR_URL is a server listening on [::1] with one stub model, `chat`. The page is opened
through `http://[::1]:PORT/ui` and `http://localhost:PORT/ui` (the main workbench run covers
`127.0.0.1`): each sees the model live and loads and unloads it by its buttons — requests
the browser sends with its `Origin`, which the server must accept as its own. Then the
browser resolves `rebind.test` to the server (as a DNS-rebinding attacker's name would) and
opens the page through it: the server answers 403 `host_not_allowed`. Any page or console
error fails it.
"""

import json
import os
import sys
import urllib.request
from urllib.parse import urlsplit

from playwright.sync_api import expect, sync_playwright

BASE = os.environ["HANGAR_URL"].rstrip("/")
CHROMIUM = os.environ.get("HANGAR_CHROMIUM", "/usr/bin/chromium")
PORT = urlsplit(BASE).port


def state():
    with urllib.request.urlopen(BASE + "/v1/admin/models/chat", timeout=30) as response:
        return json.load(response)["runtime_state"]


def main():
    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--host-resolver-rules=MAP rebind.test [::1]"],
        )
        for base in [f"http://[::1]:{PORT}", f"http://localhost:{PORT}"]:
            page = browser.new_page()
            page.on("console", lambda m: m.type == "error" and errors.append(f"{base}: console: {m.text}"))
            page.on("pageerror", lambda e: errors.append(f"{base}: page error: {e}"))
            page.goto(base + "/ui")
            row = page.locator('#models tbody tr[data-model="chat"]')
            expect(page.locator("#live")).to_have_attribute("data-state", "live", timeout=15000)
            row.locator('button[data-action="load"]').click()
            page.locator("#load-submit").click()
            expect(row).to_have_attribute("data-state", "loaded", timeout=30000)
            assert state() == "loaded", base
            row.locator('button[data-action="unload"]').click()
            expect(row).to_have_attribute("data-state", "unloaded", timeout=30000)
            assert state() == "unloaded", base
            print(f"ok: the workbench through {base}")
            page.close()

        page = browser.new_page()
        response = page.goto(f"http://rebind.test:{PORT}/ui")
        assert response is not None and response.status == 403, response and response.status
        body = json.loads(page.locator("body").inner_text())
        assert body["error"]["code"] == "host_not_allowed", body
        print("ok: a rebound name is refused")
        browser.close()
    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
