"""The dashboard's web layer: routes, login, CSRF, rendering and error pages.

Every response is server-rendered HTML with a Content-Security-Policy that allows no script at
all, so even a value that escaped escaping could not run. Bad input gets a 4xx page that says
what was wrong; an unexpected failure gets a plain 500 page and is logged, never shown.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, quote

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from jobguard.app import App
from jobguard.core.text import utc_text
from jobguard.dashboard import pages, params
from jobguard.dashboard.security import CSRF_COOKIE, SESSION_COOKIE, SESSION_TTL_S, Access
from jobguard.exceptions import (
    ConfigurationError,
    DuplicateJobError,
    JobGuardError,
    NotFoundError,
    StoreUnavailableError,
)
from jobguard.models import JobStatus

log = logging.getLogger("jobguard.dashboard")

MAX_FORM_BYTES = 4096
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
Handler = Callable[[Request], Awaitable[Response]]
ERROR_STATUS: tuple[tuple[type[JobGuardError], int], ...] = (
    (NotFoundError, 404),
    (DuplicateJobError, 409),
    (ConfigurationError, 400),
    (StoreUnavailableError, 503),
    (JobGuardError, 409),
)


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return utc_text(ts)


class Dashboard:
    """Builds the Starlette app over one :class:`~jobguard.App` and its :class:`Access`."""

    def __init__(self, app: App, access: Access, *, title: str = "jobguard") -> None:
        self.app = app
        self.access = access
        self.title = title
        self.templates = Environment(
            loader=PackageLoader("jobguard.dashboard", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters["when"] = _when

    # -- responses ------------------------------------------------------------------------------

    def render(
        self, request: Request, template: str, context: dict[str, Any], status: int = 200
    ) -> HTMLResponse:
        """Render a page with what every page needs (user, CSRF token, title)."""
        browser = request.cookies.get(CSRF_COOKIE) or secrets.token_hex(16)
        body = self.templates.get_template(template).render(
            **context,
            title=self.title,
            user=request.scope.get("jobguard.user"),
            login_required=self.access.required,
            csrf=self.access.csrf_token(browser),
            path=request.url.path,
        )
        response = HTMLResponse(body, status_code=status)
        self.harden(response)
        if request.cookies.get(CSRF_COOKIE) != browser:
            response.set_cookie(CSRF_COOKIE, browser, httponly=True, samesite="strict")
        return response

    @staticmethod
    def harden(response: Response) -> None:
        """Set the headers every response carries (no script, no sniffing, no caching)."""
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-store"

    def error(self, request: Request, status: int, message: str) -> HTMLResponse:
        """The error page: the status, what was wrong, and a way back."""
        return self.render(request, "error.html", {"status": status, "message": message}, status)

    # -- access ---------------------------------------------------------------------------------

    def user_of(self, request: Request) -> str | None:
        """The logged-in user (``local`` when no login is required), or ``None``."""
        if not self.access.required:
            return "local"
        return self.access.session_user(
            request.cookies.get(SESSION_COOKIE)
        ) or self.access.check_header(request.headers.get("authorization"))

    def actor(self, request: Request) -> str:
        """Who did it, for the audit trail: the user and the client's address."""
        client = request.client.host if request.client else "?"
        return f"{request.scope.get('jobguard.user', '?')}@{client}"

    async def form(self, request: Request) -> dict[str, str]:
        """A small URL-encoded form (empty if there is no body); anything else is a 400."""
        body = await request.body()
        if not body:
            return {}
        kind = request.headers.get("content-type", "").split(";")[0].strip()
        if kind != "application/x-www-form-urlencoded":
            raise params.BadRequest("forms must be sent as application/x-www-form-urlencoded")
        if len(body) > MAX_FORM_BYTES:
            raise params.BadRequest("the form is too large")
        try:
            fields = parse_qs(body.decode("utf-8"), max_num_fields=20)
        except (UnicodeDecodeError, ValueError) as exc:
            raise params.BadRequest(f"the form could not be read: {exc}") from None
        return {name: values[0] for name, values in fields.items() if len(values) == 1}

    async def admit(self, request: Request, post: bool) -> Response | None:
        """Check the login (and the CSRF token of a POST); a response if refused, else ``None``."""
        if len(request.url.query) > params.MAX_QUERY_LENGTH:
            raise params.BadRequest("the query string is too long")
        user = self.user_of(request)
        if user is None:
            if post:
                return self.error(request, 403, "log in first")
            target = quote(request.url.path, safe="/")
            return RedirectResponse(f"/login?next={target}", status_code=303)
        request.scope["jobguard.user"] = user
        if post:
            fields = await self.form(request)
            if not self.access.csrf_ok(request.cookies.get(CSRF_COOKIE), fields.get("csrf")):
                return self.error(
                    request,
                    403,
                    "this form has no valid CSRF token: reload the page and send it again",
                )
        return None

    def guarded(self, handler: Handler, *, post: bool = False) -> Handler:
        """Wrap a handler with the login check, CSRF check (POST) and the error pages."""

        async def endpoint(request: Request) -> Response:
            try:
                refused = await self.admit(request, post)
                return refused if refused is not None else await handler(request)
            except (params.BadRequest, JobGuardError) as exc:
                return self.error(request, status_of(exc), str(exc))

        return endpoint

    # -- routes ---------------------------------------------------------------------------------

    def page(self, build: Callable[[App, pages.Params], pages.Page]) -> Handler:
        """A GET page built in a worker thread (store reads block)."""

        async def handler(request: Request) -> Response:
            query = params.query(request.url.query)
            template, context = await run_in_threadpool(build, self.app, query)
            return self.render(request, template, context)

        return self.guarded(handler)

    async def job_page(self, request: Request) -> Response:
        """``/jobs/{id}``."""
        query = params.query(request.url.query)
        job_id = request.path_params["job_id"]
        template, context = await run_in_threadpool(pages.job, self.app, job_id, query)
        return self.render(request, template, context)

    async def replay(self, request: Request) -> Response:
        """POST ``/dlq/{id}/replay``: back to the queue, audited."""
        job_id = params.job_id(request.path_params["job_id"])
        await run_in_threadpool(self.app.dlq.replay, job_id, actor=self.actor(request))
        return RedirectResponse(f"/jobs/{job_id}?notice=replayed", status_code=303)

    async def cancel(self, request: Request) -> Response:
        """POST ``/jobs/{id}/cancel``: the job page's button, audited (#17)."""
        job_id = params.job_id(request.path_params["job_id"])
        job = await run_in_threadpool(self.app.cancel, job_id, actor=self.actor(request))
        notice = "cancelled" if job.status == JobStatus.DEAD else "cancel-requested"
        return RedirectResponse(f"/jobs/{job_id}?notice={notice}", status_code=303)

    async def retry_now(self, request: Request) -> Response:
        """POST ``/jobs/{id}/retry-now``: a job waiting on its backoff is due now, audited."""
        job_id = params.job_id(request.path_params["job_id"])
        await run_in_threadpool(self.app.retry_now, job_id, actor=self.actor(request))
        return RedirectResponse(f"/jobs/{job_id}?notice=retried", status_code=303)

    async def purge(self, request: Request) -> Response:
        """POST ``/dlq/{id}/purge``: delete a dead job and its attempts, audited."""
        job_id = params.job_id(request.path_params["job_id"])
        await run_in_threadpool(self.app.dlq.show, job_id)  # 404 unless it is dead
        purged = await run_in_threadpool(self.app.dlq.purge, job_id, actor=self.actor(request))
        notice = "purged" if purged else "purged-none"
        return RedirectResponse(f"/dlq?notice={notice}", status_code=303)

    async def pause_queue(self, request: Request) -> Response:
        """POST ``/queues/{queue}/pause``: the overview's button, audited."""
        actor = self.actor(request)
        await run_in_threadpool(self.app.pause_queue, request.path_params["queue"], actor=actor)
        return RedirectResponse("/?notice=paused", status_code=303)

    async def resume_queue(self, request: Request) -> Response:
        """POST ``/queues/{queue}/resume``: the overview's button, audited."""
        actor = self.actor(request)
        await run_in_threadpool(self.app.resume_queue, request.path_params["queue"], actor=actor)
        return RedirectResponse("/?notice=resumed", status_code=303)

    async def bulk(self, request: Request) -> Response:
        """POST ``/dlq/bulk/replay`` or ``/dlq/bulk/purge``: act on a selection, audited (#17).

        The form carries the selection the preview page showed and the preview's store time:
        it acts on the jobs buried before that (validated again here), not on jobs that died
        since.
        """
        action = request.path_params["action"]
        if action not in ("replay", "purge"):
            raise params.NotFound(f"there is no bulk action {action[:40]!r}")
        fields = await self.form(request)
        selected = params.confirmed({k: [v] for k, v in fields.items() if k != "csrf"})
        actor = self.actor(request)
        if action == "replay":
            report = await run_in_threadpool(self.app.replay_dead, selected, actor=actor)
            context: dict[str, Any] = {
                "verb": "Replayed",
                "count": len(report.replayed),
                "held": report.held,
                "gone": report.gone,
            }
        else:
            purged = await run_in_threadpool(self.app.purge_dead, selected, actor=actor)
            context = {"verb": "Purged", "count": purged, "held": [], "gone": 0}
        previewed = _when(selected.cutoff)
        return self.render(
            request,
            "dlq_bulk_done.html",
            {**context, "described": selected.describe(), "previewed": previewed},
        )

    async def login_page(self, request: Request) -> Response:
        """The login form (``next`` is where to go afterwards, a local path only)."""
        try:
            query = params.query(request.url.query, max_fields=5)
        except params.BadRequest as exc:
            return self.error(request, 400, str(exc))
        return self.render(
            request,
            "login.html",
            {"next": _local_path(query.get("next", ["/"])[0]), "failed": False},
        )

    async def login(self, request: Request) -> Response:
        """Check the credentials; on success set the session cookie and go on."""
        try:
            fields = await self.form(request)
        except params.BadRequest as exc:
            return self.error(request, 400, str(exc))
        target = _local_path(fields.get("next", "/"))
        if not self.access.csrf_ok(request.cookies.get(CSRF_COOKIE), fields.get("csrf")):
            return self.error(request, 403, "the login form has no valid CSRF token: reload it")
        user = self.access.check(fields.get("user", ""), fields.get("secret", ""))
        if user is None:
            await asyncio.sleep(0.2)  # a little friction for guessing
            return self.render(request, "login.html", {"next": target, "failed": True}, 401)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            self.access.session_cookie(user),
            max_age=SESSION_TTL_S,
            httponly=True,
            samesite="strict",
        )
        return response

    async def logout(self, request: Request) -> Response:
        """End the session."""
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE)
        return response

    async def not_found(self, request: Request, exc: Exception) -> Response:
        """Unknown paths and methods get the same error page as the rest."""
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        message = "no such page" if status == 404 else "this page does not take that method"
        return self.error(request, status, message)

    async def crashed(self, request: Request, exc: Exception) -> Response:
        """Log an unexpected failure; show a plain 500 page without details."""
        log.error("dashboard: %s %s failed", request.method, request.url.path, exc_info=exc)
        return self.error(request, 500, "something went wrong on the server; it was logged")

    def starlette(self) -> Starlette:
        """The ASGI application."""
        routes = [
            Route("/", self.page(pages.overview)),
            Route("/jobs", self.page(pages.jobs)),
            Route("/jobs/{job_id}", self.guarded(self.job_page)),
            Route(
                "/jobs/{job_id}/retry-now",
                self.guarded(self.retry_now, post=True),
                methods=["POST"],
            ),
            Route("/operations", self.page(pages.operations)),
            Route("/dlq", self.page(pages.dlq)),
            Route("/doctor", self.page(pages.doctor)),
            Route("/audit", self.page(pages.audit)),
            Route("/dlq/bulk", self.page(pages.dlq_bulk)),
            Route(
                "/dlq/bulk/{action:str}",
                self.guarded(self.bulk, post=True),
                methods=["POST"],
            ),
            Route("/jobs/{job_id}/cancel", self.guarded(self.cancel, post=True), methods=["POST"]),
            Route("/dlq/{job_id}/replay", self.guarded(self.replay, post=True), methods=["POST"]),
            Route("/dlq/{job_id}/purge", self.guarded(self.purge, post=True), methods=["POST"]),
            Route(
                "/queues/{queue}/pause", self.guarded(self.pause_queue, post=True), methods=["POST"]
            ),
            Route(
                "/queues/{queue}/resume",
                self.guarded(self.resume_queue, post=True),
                methods=["POST"],
            ),
            Route("/login", self.login_page, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.guarded(self.logout, post=True), methods=["POST"]),
        ]
        return Starlette(
            routes=routes,
            middleware=[Middleware(HostCheck, dashboard=self)],
            exception_handlers={HTTPException: self.not_found, Exception: self.crashed},
        )


class HostCheck:
    """Answer only requests whose ``Host`` the dashboard's :class:`Access` allows.

    Before every route and error page: a page of another site whose name was made to resolve to
    this machine (DNS rebinding) must not read the dead letter queue, nor fetch a CSRF token.
    """

    def __init__(self, app: ASGIApp, dashboard: Dashboard) -> None:
        self.app = app
        self.dashboard = dashboard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a foreign host with a 400 page; pass anything else on."""
        if scope["type"] == "http":
            request = Request(scope)
            host = request.headers.get("host")
            if not self.dashboard.access.host_ok(host):
                refused = PlainTextResponse(
                    f"400: this dashboard does not answer to the host name {host!r}; start it "
                    "with --allowed-host NAME (or Access(allowed_hosts=...)) to allow that name",
                    status_code=400,
                )
                self.dashboard.harden(refused)
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


def status_of(exc: Exception) -> int:
    """The HTTP status of an input or store error (400 if nothing more precise)."""
    if isinstance(exc, params.BadRequest):
        return exc.status_code
    for kind, status in ERROR_STATUS:
        if isinstance(exc, kind):
            return status
    return 400


def _local_path(target: str) -> str:
    """``target`` if it is a path on this site, else ``/`` (no open redirect)."""
    if target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target[:512]
    return "/"


def create_app(app: App, access: Access | None = None, *, title: str = "jobguard") -> Starlette:
    """The dashboard as an ASGI app over ``app`` (serve it with uvicorn, or mount it)."""
    return Dashboard(app, access or Access(), title=title).starlette()
