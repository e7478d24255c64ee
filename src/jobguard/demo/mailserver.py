"""A real local HTTP mail service that honours ``Idempotency-Key``, with injectable faults.

Used by the demo and by the chaos tests as the "external API" of the article: it records every
request it received and every email it actually sent, so a run can prove that no email went out
twice. Faults are decided per ``(idempotency key, n-th request with that key)`` from the seed, so
a seed reproduces the same faults whatever order the workers happen to call in.

Faults:
    * ``error``: answer 503 without sending (the client retries).
    * ``timeout``: send, but answer only after ``timeout_s`` (the client gave up: ambiguous).
    * ``drop``: send, then close the connection without answering (ambiguous).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True, slots=True)
class MailFaults:
    """Probabilities (0..1) of each fault per request, and how long a timeout hangs."""

    error_rate: float = 0.0
    timeout_rate: float = 0.0
    drop_rate: float = 0.0
    timeout_s: float = 1.5

    def pick(self, seed: int, key: str, nth: int) -> str | None:
        """The fault for the ``nth`` request with ``key`` (deterministic), or ``None``."""
        digest = hashlib.blake2b(f"{seed}\x00{key}\x00{nth}".encode(), digest_size=8).digest()
        roll = int.from_bytes(digest, "big") / 2**64
        for name, rate in (
            ("error", self.error_rate),
            ("timeout", self.timeout_rate),
            ("drop", self.drop_rate),
        ):
            if roll < rate:
                return name
            roll -= rate
        return None


class MailUnavailableError(Exception):
    """The mail service failed or the answer was lost; the email may or may not have been sent."""


class MailServer:
    """The service: start it with ``with MailServer(...) as server:``; ``server.url`` to call.

    Attributes:
        requests: Every request received: ``{"key", "to", "fault", "applied"}``.
        sent: Every email actually sent: ``{"message_id", "key", "to", "subject"}``.
    """

    def __init__(self, *, faults: MailFaults | None = None, seed: int = 0) -> None:
        self.faults = faults or MailFaults()
        self.seed = seed
        self.requests: list[dict[str, Any]] = []
        self.sent: list[dict[str, Any]] = []
        self._by_key: dict[str, str] = {}
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> MailServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def log(self) -> dict[str, Any]:
        """A snapshot of what was received and sent (also served at ``GET /log``)."""
        with self._lock:
            return {"requests": list(self.requests), "sent": list(self.sent)}

    def _accept(self, key: str | None, message: dict[str, Any]) -> tuple[str | None, str, bool]:
        """Record the request; decide its fault; send unless it is an error or a replay."""
        with self._lock:
            fault_key = key or f"no-key:{len(self.requests)}"
            nth = self._seen.get(fault_key, 0)
            self._seen[fault_key] = nth + 1
            fault = self.faults.pick(self.seed, fault_key, nth)
            entry = {"key": key, "to": message.get("to"), "fault": fault, "applied": False}
            self.requests.append(entry)
            if fault == "error":
                return fault, "", False
            if key is not None and key in self._by_key:
                return fault, self._by_key[key], True
            message_id = f"msg-{len(self.sent) + 1}"
            self.sent.append(
                {
                    "message_id": message_id,
                    "key": key,
                    "to": message.get("to"),
                    "subject": message.get("subject"),
                }
            )
            entry["applied"] = True
            if key is not None:
                self._by_key[key] = message_id
            return fault, message_id, False

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        return type("MailHandler", (_MailHandler,), {"service": self})


class _MailHandler(BaseHTTPRequestHandler):
    """HTTP front of a :class:`MailServer` (bound to one through the ``service`` attribute)."""

    service: MailServer

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet; the service keeps its own log."""

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        # The client may have given up (a timeout fault): the email stands, the answer is lost.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    def do_GET(self) -> None:
        """Serve the log at ``/log``."""
        if self.path == "/log":
            self._reply(200, self.service.log())
        else:
            self._reply(404, {"error": "not found"})

    def do_POST(self) -> None:
        """Accept one email at ``/send`` and answer as the fault plan says."""
        if self.path != "/send":
            self._reply(404, {"error": "not found"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if len(body) < length:
            # The client went away mid-request (a killed worker): nothing was asked for.
            self.close_connection = True
            return
        try:
            message = json.loads(body)
        except ValueError:
            self._reply(400, {"error": "body is not JSON"})
            return
        if not isinstance(message, dict) or not message.get("to"):
            self._reply(400, {"error": "a message needs a recipient ('to')"})
            return
        fault, message_id, replayed = self.service._accept(
            self.headers.get("Idempotency-Key"), message
        )
        if fault == "error":
            self._reply(503, {"error": "mail service unavailable"})
            return
        if fault == "drop":
            self.close_connection = True
            return
        if fault == "timeout":
            time.sleep(self.service.faults.timeout_s)
        self._reply(200, {"message_id": message_id, "replayed": replayed})


def send_mail(
    url: str,
    *,
    to: str,
    subject: str,
    body: str = "",
    idempotency_key: str | None = None,
    timeout_s: float = 1.0,
) -> str:
    """POST one email; return its message id. Raises :class:`MailUnavailableError` when unsure."""
    data = json.dumps({"to": to, "subject": subject, "body": body}).encode()
    request = urllib.request.Request(f"{url}/send", data=data, method="POST")  # noqa: S310
    request.add_header("Content-Type", "application/json")
    if idempotency_key is not None:
        request.add_header("Idempotency-Key", idempotency_key)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - own URL
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise MailUnavailableError(f"mail service answered {exc.code}") from exc
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
        raise MailUnavailableError(f"no answer from the mail service: {exc}") from exc
    return str(answer["message_id"])
