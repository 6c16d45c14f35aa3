"""Headless Chromium for the browser tests: Debian's package (`apt-get install -y chromium`,
which .ci/run does), driven by playwright from PyPI pointed at that executable. Playwright's
own browser download (`playwright install`) is never used.

A missing playwright module or a missing Chromium is a missing test dependency (`require`,
`missing`): outside CI the browser tests skip and say how to install it; under CI=true they
fail. Screenshots go to $STRATA_TEST_ARTIFACTS (default: a pytest temporary directory, printed).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from tests.conftest import missing, require

CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser")


def chromium_executable() -> str:
    found = next((p for p in CHROMIUM_PATHS if os.access(p, os.X_OK)), None) or shutil.which("chromium")
    if found is None:  # skips outside CI, fails under CI=true (.ci/run installs it)
        missing("a Chromium executable (looked for " + ", ".join(CHROMIUM_PATHS) + " and `chromium` on PATH)",
                "apt-get update && apt-get install -y chromium")
    return found


def artifacts_dir(tmp_path_factory) -> Path:
    given = os.environ.get("STRATA_TEST_ARTIFACTS")
    path = Path(given) if given else tmp_path_factory.mktemp("browser-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    print(f"\nbrowser test screenshots: {path}", file=sys.stderr)
    return path


def problems(page) -> list[str]:
    """What went wrong in the page: uncaught errors, then Content-Security-Policy violations."""
    return page.errors + page.evaluate("window.cspViolations")


class BrowserSession:
    """One playwright driver and one Chromium for a module's tests."""

    def __init__(self) -> None:
        sync_api = require("playwright.sync_api")
        executable = chromium_executable()
        self._driver = sync_api.sync_playwright().start()
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        self.browser = self._driver.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox"]
        )

    def new_context(self):
        """A browser profile with the app's strict Content-Security-Policy enforced (no
        bypass_csp: a page the policy blanks fails). Every page records the policy's
        violations in `window.cspViolations` from before its first script (an init script,
        which the devtools protocol runs outside the policy, as it runs playwright's waits)."""
        context = self.browser.new_context(viewport={"width": 1360, "height": 860})
        context.add_init_script(
            "window.cspViolations = [];"
            "document.addEventListener('securitypolicyviolation',"
            " e => window.cspViolations.push(`${e.violatedDirective} ${e.blockedURI}`));")
        return context

    def new_page(self, context=None):
        context = context or self.new_context()
        page = context.new_page()
        page.set_default_timeout(120_000)
        page.errors = []  # uncaught errors in the page: every test asserts there were none
        page.on("pageerror", lambda error: page.errors.append(str(error)))
        return page

    def close(self) -> None:
        self.browser.close()
        self._driver.stop()
