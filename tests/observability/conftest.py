"""Processes the observability tests run: real CLI workers, exporters and dashboards."""

from __future__ import annotations

import html.parser
import http.cookiejar
import os
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from jobguard import App, Outcome
from tests.support.procs import REPO_ROOT, clean_env, entry_point, spawn_worker, wait_until, workers

APP = "tests.support.observed_app:app"


@dataclass
class Served:
    """A CLI process that printed the URL it serves on."""

    popen: subprocess.Popen[str]
    url: str
    first_line: str

    def stop(self) -> None:
        """Kill and reap, close the pipes."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)
        for pipe in (self.popen.stdout, self.popen.stderr):
            if pipe is not None:
                pipe.close()


def start_cli(url: str, args: list[str], marker: str) -> Served:
    """Run ``jobguard ARGS`` with the observed app on ``url``; wait for the line with ``marker``.

    The URL printed on that line (``http://...``, if any) is returned with the process.
    """
    env = clean_env()
    env["OBSERVED_APP_URL"] = url
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    popen = subprocess.Popen(
        [*entry_point(), *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert popen.stderr is not None
    seen = []
    for _ in range(50):
        line = popen.stderr.readline()
        seen.append(line)
        if marker in line:
            url = next((word for word in line.split() if word.startswith("http")), "")
            return Served(popen, url.rstrip("/"), line)
        if not line and popen.poll() is not None:
            break
    popen.kill()
    popen.wait()
    popen.stderr.close()
    raise RuntimeError(f"`jobguard {' '.join(args)}` did not start:\n{''.join(seen)}")


def serve_dashboard(url: str, served: list[Served], *options: str) -> str:
    """Start ``jobguard dashboard`` on ``url`` (with ``options``, e.g. ``--token``); its base."""
    proc = start_cli(url, ["--url", url, "dashboard", "--port", "0", *options], "dashboard at")
    served.append(proc)
    return proc.url


@pytest.fixture
def served() -> Iterator[list[Served]]:
    """Processes started by the test, killed at its end whatever happened."""
    started: list[Served] = []
    yield started
    for proc in started:
        proc.stop()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    """Let the test see a redirect instead of following it."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


@dataclass
class Reply:
    """One HTTP response, read whole."""

    status: int
    headers: dict[str, str]
    body: str


class _FormReader(html.parser.HTMLParser):
    """The hidden inputs of one form, found by its ``action``."""

    def __init__(self, action: str) -> None:
        super().__init__()
        self.action = action
        self.inside = False
        self.found = False
        self.fields: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "form":
            self.inside = values.get("action") == self.action
            self.found = self.found or self.inside
        elif tag == "input" and self.inside and values.get("type") == "hidden":
            self.fields[values.get("name") or ""] = values.get("value") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False


class Client:
    """A cookie-keeping HTTP client that does not follow redirects."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.cookies), NoRedirect()
        )

    def request(
        self,
        path: str,
        form: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        method: str | None = None,
    ) -> Reply:
        """GET ``path`` (or POST ``form``) and return the reply, errors included."""
        data = None if form is None else urllib.parse.urlencode(form).encode()
        request = urllib.request.Request(  # noqa: S310 - our own local URL
            self.base + path, data=data, headers=headers or {}, method=method
        )
        try:
            with self.opener.open(request, timeout=30) as response:
                return Reply(response.status, dict(response.headers), response.read().decode())
        except urllib.error.HTTPError as exc:
            body = exc.read().decode()
            exc.close()
            return Reply(exc.code, dict(exc.headers), body)

    def form_fields(self, path: str, action: str) -> dict[str, str]:
        """The hidden fields of the form posting to ``action`` on the page at ``path``: what
        a browser would send when its button is clicked."""
        reply = self.request(path)
        assert reply.status == 200, reply.body
        reader = _FormReader(action)
        reader.feed(reply.body)
        assert reader.found, f"no form posting to {action} on {path}"
        return reader.fields

    def csrf(self, path: str = "/login") -> str:
        """The CSRF token the page at ``path`` puts in its forms."""
        body = self.request(path).body
        marker = 'name="csrf" value="'
        start = body.index(marker) + len(marker)
        return body[start : body.index('"', start)]


def kill_a_worker_mid_job(url: str, app: App, stalled: int) -> None:
    """SIGKILL a worker (id ``victim-1``) once it runs all ``stalled`` queued ``stall`` jobs.

    Their attempts stay ``running`` until a later fetch finds the leases expired and closes them
    as ``lost``.
    """
    victim = spawn_worker(
        url, "tests.support.observed_app", queues=["crashing"], concurrency=stalled,
        worker_id="victim-1",
    )  # fmt: skip
    with workers(victim):
        victim.wait_ready()

        def running() -> int:
            return sum(a.outcome == Outcome.RUNNING for a in app.attempts(limit=1000))

        wait_until(lambda: running() == stalled)
        victim.signal(signal.SIGKILL)
        victim.wait()
