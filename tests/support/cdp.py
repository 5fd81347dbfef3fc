"""A small Chrome DevTools Protocol client: headless Chromium driven over aiohttp's websocket.

Enough for the UI tests and the screenshot script: open a page, evaluate JavaScript,
collect console errors and uncaught exceptions, wait for a DOM condition, capture a PNG.
No dependency beyond aiohttp and a `chromium` binary (Debian's package).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

__all__ = ["Browser", "CdpError", "Page", "chromium_path", "launch"]

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
START_TIMEOUT_S = 30.0


class CdpError(Exception):
    """A CDP command answered with an error, or the browser went away."""


def chromium_path() -> str | None:
    """The Chromium (or Chrome) executable on PATH, None if there is none."""
    for name in CANDIDATES:
        found = shutil.which(name)
        if found is not None:
            return found
    return None


class Browser:
    """One Chromium process and its browser-level DevTools websocket."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        ws: aiohttp.ClientWebSocketResponse,
        http: aiohttp.ClientSession,
    ) -> None:
        self.proc = proc
        self._ws = ws
        self._http = http
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._pages: dict[str, Page] = {}
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            async for message in self._ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    continue
                data: dict[str, Any] = message.json()
                if "id" in data:
                    future = self._waiting.pop(data["id"], None)
                    if future is not None and not future.done():
                        future.set_result(data)
                    continue
                page = self._pages.get(data.get("sessionId", ""))
                if page is not None:
                    page.on_event(data["method"], data.get("params", {}))
        finally:
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(CdpError("the browser closed its DevTools socket"))
            self._waiting.clear()

    async def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout_s: float = 30.0,
    ) -> dict[str, Any]:
        """Send one command; return its `result` (CdpError on an error answer)."""
        if self._reader.done():
            raise CdpError("the browser closed its DevTools socket")
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        await self._ws.send_json(message)
        answer = await asyncio.wait_for(future, timeout_s)
        if "error" in answer:
            raise CdpError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    async def new_page(self, width: int = 1280, height: int = 900) -> Page:
        """A fresh tab (about:blank) with Runtime, Log and Page events on."""
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        page = Page(self, attached["sessionId"], target["targetId"])
        self._pages[page.session] = page
        for domain in ("Runtime", "Log", "Page"):
            await page.send(f"{domain}.enable")
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        return page

    async def close(self) -> None:
        with contextlib.suppress(CdpError, ConnectionError, asyncio.TimeoutError):
            await self.send("Browser.close", timeout_s=5.0)
        await self._ws.close()
        await self._http.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        try:
            await asyncio.wait_for(self.proc.wait(), 10.0)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


class Page:
    """One tab: commands go through its flattened session; events land here."""

    def __init__(self, browser: Browser, session: str, target_id: str) -> None:
        self.browser = browser
        self.session = session
        self.target_id = target_id
        self.errors: list[str] = []  # console errors, uncaught exceptions, error log entries
        self._loaded = asyncio.Event()

    def on_event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            exception = details.get("exception", {})
            self.errors.append(f"exception: {exception.get('description') or details.get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = [a.get("value", a.get("description", "")) for a in params.get("args", [])]
            self.errors.append(f"console.{params['type']}: {' '.join(map(str, args))}")
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            if entry.get("level") == "error":
                self.errors.append(
                    f"log ({entry.get('source')}): {entry.get('text')} "
                    f"{entry.get('url', '')}".rstrip()
                )
        elif method == "Page.loadEventFired":
            self._loaded.set()

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.browser.send(method, params, session=self.session)

    async def goto(self, url: str, timeout_s: float = 30.0) -> None:
        """Navigate and wait for the load event."""
        self._loaded.clear()
        answer = await self.send("Page.navigate", {"url": url})
        if answer.get("errorText"):
            raise CdpError(f"navigation to {url} failed: {answer['errorText']}")
        await asyncio.wait_for(self._loaded.wait(), timeout_s)

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of `expression` (awaited if it is a promise)."""
        answer = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in answer:
            details = answer["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CdpError(f"evaluating {expression!r}: {text}")
        return answer["result"].get("value")

    async def wait_for(self, expression: str, within: float = 20.0) -> Any:
        """Poll `expression` until it is truthy (its value), up to `within` seconds."""
        deadline = time.monotonic() + within
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} still falsy after {within}s (last: {value!r})")
            await asyncio.sleep(0.05)  # polling cadence: the page changes on its own timer

    async def screenshot(self) -> bytes:
        """A PNG of the whole page (beyond the viewport down to the content's height)."""
        metrics = await self.send("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        shot = await self.send(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {
                    "x": 0,
                    "y": 0,
                    "width": size["width"],
                    "height": size["height"],
                    "scale": 1,
                },
            },
        )
        return base64.b64decode(shot["data"])


async def _devtools_url(profile: Path, proc: asyncio.subprocess.Process) -> str:
    """The browser websocket URL Chromium writes to <profile>/DevToolsActivePort."""
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if marker.exists():
            lines = marker.read_text().split()
            if len(lines) >= 2:
                return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
        if proc.returncode is not None:
            raise CdpError(f"chromium exited with status {proc.returncode} before listening")
        if time.monotonic() > deadline:
            raise CdpError(f"chromium did not write {marker} within {START_TIMEOUT_S}s")
        await asyncio.sleep(0.05)  # no event to wait on: the file appears when it listens


@contextlib.asynccontextmanager
async def launch(executable: str | None = None) -> AsyncIterator[Browser]:
    """Start headless Chromium with a throwaway profile; close it on exit."""
    binary = executable or chromium_path()
    if binary is None:
        raise CdpError("no chromium on PATH (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="shardlimit-cdp-") as tmp:
        profile = Path(tmp)
        log = (profile / "stderr.log").open("wb")
        proc = await asyncio.create_subprocess_exec(
            binary,
            "--headless=new",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-sync",
            "--disable-component-update",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--mute-audio",
            "about:blank",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=log,
        )
        browser: Browser | None = None
        try:
            url = await _devtools_url(profile, proc)
            http = aiohttp.ClientSession()
            try:
                ws = await http.ws_connect(url, max_msg_size=0)
            except BaseException:
                await http.close()
                raise
            browser = Browser(proc, ws, http)
            yield browser
        finally:
            if browser is not None:
                await browser.close()
            elif proc.returncode is None:
                proc.kill()
                await proc.wait()
            log.close()
