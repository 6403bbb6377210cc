"""Headless Chromium driven over the DevTools protocol on a pipe, for the browser tests.

Chromium is Debian's `chromium` (.ci/run installs it), driven over the
DevTools protocol on a pipe (`--remote-debugging-pipe`): no browser
download, no Python dependency.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from durably.dev import signal_group

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NEEDS_CHROMIUM = pytest.mark.skipif(
    not Path(CHROMIUM).exists() and not os.environ.get("CI"),
    reason="headless Chromium is not installed (`apt-get install chromium`; .ci/run does it)",
)

# Headless, and quiet on a machine without a network: no background
# connections, updates or sync for it to refuse.
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
)
_PAGE = {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False}
_ALL_TEXT = """
[document, ...Array.from(document.querySelectorAll("iframe"), (f) => f.contentDocument)]
    .map((d) => (d && d.body ? d.body.innerText : ""))
    .join("\\n")
"""
_UI_WITHIN = 30.0  # the page shows what is expected by then (it takes 1-3 s)


@contextlib.asynccontextmanager
async def chromium(profile: Path, log: Path) -> AsyncIterator[Chromium]:
    """Headless Chromium with a new profile, killed on leaving."""
    browser = Chromium(profile, log)
    try:
        yield browser
    finally:
        await asyncio.to_thread(browser.close)


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe.

    Commands go to the browser's fd 3 and its answers and events come back on
    fd 4, each a JSON object ended by a NUL byte. Each command waits in a
    thread, so the event loop (and the worker on it, which the UI queries)
    runs meanwhile.
    """

    def __init__(self, profile: Path, log: Path) -> None:
        if not Path(CHROMIUM).exists():
            raise AssertionError(
                f"{CHROMIUM} is missing: `apt-get install chromium` (.ci/run does)"
            )
        to_browser, self._commands = os.pipe()
        self._answers, from_browser = os.pipe()
        with log.open("wb") as err:
            self._proc = subprocess.Popen(
                # The shell moves the pipes to fds 3 and 4, where Chromium expects them.
                [
                    "/bin/sh",
                    "-c",
                    'exec "$0" "$@" 3<&0 4>&1 0</dev/null 1>&2',
                    CHROMIUM,
                    *_FLAGS,
                    f"--user-data-dir={profile}",
                    "about:blank",
                ],
                stdin=to_browser,
                stdout=from_browser,
                stderr=err,
                start_new_session=True,
            )
        os.close(to_browser)
        os.close(from_browser)
        self._unread = b""
        self._last_id = 0

    async def send(self, method: str, session: str | None = None, **params: Any) -> Any:
        """The result of one DevTools command (to the page of `session`, if given)."""
        async with asyncio.timeout(_UI_WITHIN):
            return await asyncio.to_thread(self._send, method, session, params)

    async def open(self, url: str) -> Page:
        """A new page showing `url`, in a context of its own (its own storage)."""
        context = (await self.send("Target.createBrowserContext"))["browserContextId"]
        target = await self.send("Target.createTarget", url="about:blank", browserContextId=context)
        attached = await self.send(
            "Target.attachToTarget", targetId=target["targetId"], flatten=True
        )
        page = Page(self, attached["sessionId"])
        await self.send("Emulation.setDeviceMetricsOverride", page.session, **_PAGE)
        await self.send("Page.navigate", page.session, url=url)
        return page

    def close(self) -> None:
        signal_group(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        os.close(self._commands)
        os.close(self._answers)

    def _send(self, method: str, session: str | None, params: dict[str, Any]) -> Any:
        self._last_id += 1
        command: dict[str, Any] = {"id": self._last_id, "method": method, "params": params}
        if session is not None:
            command["sessionId"] = session
        os.write(self._commands, json.dumps(command).encode() + b"\0")
        while True:
            message = json.loads(self._read_message())
            if message.get("id") != self._last_id:
                continue  # an event, which nothing here waits for
            if "error" in message:
                raise AssertionError(f"Chromium refused {method}: {message['error']}")
            return message["result"]

    def _read_message(self) -> bytes:
        while b"\0" not in self._unread:
            chunk = os.read(self._answers, 1 << 16)
            if not chunk:
                raise AssertionError(f"Chromium exited (code {self._proc.poll()})")
            self._unread += chunk
        message, self._unread = self._unread.split(b"\0", 1)
        return message


class Page:
    """One page of a `Chromium`."""

    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser = browser
        self.session = session

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        answer = await self.browser.send(
            "Runtime.evaluate", self.session, expression=expression, returnByValue=True
        )
        return answer["result"].get("value")

    async def text(self) -> str:
        """What the page shows, as text, with its frames' (the UI shows Markdown in one)."""
        return str(await self.evaluate(_ALL_TEXT))

    async def wait_for_text(self, *texts: str, within: float = _UI_WITHIN) -> str:
        """The page's text once it shows every one of `texts` (fails after `within` s)."""
        shown = ""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                while True:
                    shown = await self.text()
                    if all(t in shown for t in texts):
                        return shown
                    await asyncio.sleep(0.1)
        missing = [t for t in texts if t not in shown]
        raise AssertionError(
            f"the page never showed {missing} within {within:.0f} s; it shows:\n{shown[-3000:]}"
        )

    async def click(self, selector: str) -> None:
        """Click the element `selector` finds, once it exists."""
        found = f"document.querySelector({json.dumps(selector)})"
        async with asyncio.timeout(_UI_WITHIN):
            while True:
                if await self.evaluate(f"{found} !== null"):
                    break
                await asyncio.sleep(0.1)
        await self.evaluate(f"{found}.click()")

    async def screenshot(self, path: Path) -> None:
        """Save what the page shows now as a PNG at `path`."""
        shot = await self.browser.send("Page.captureScreenshot", self.session, format="png")
        await asyncio.to_thread(path.write_bytes, base64.b64decode(shot["data"]))
