"""The demo's mail service sends only what was fully asked for (G4.4, the demo)."""

from __future__ import annotations

import socket
from urllib.parse import urlparse

import pytest

from jobguard.demo.mailserver import MailServer, MailUnavailableError, send_mail


@pytest.mark.parametrize("partial_body", [b"", b'{"to": "a@'])
def test_a_request_cut_off_mid_body_sends_nothing(partial_body: bytes) -> None:
    """A worker killed while posting leaves a truncated request: no email may come of it."""
    with MailServer() as server:
        address = urlparse(server.url)
        with socket.create_connection((address.hostname, address.port), timeout=2) as conn:
            conn.sendall(
                b"POST /send HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Idempotency-Key: k1\r\nContent-Length: 200\r\n\r\n" + partial_body
            )
            conn.shutdown(socket.SHUT_WR)
            conn.recv(1024)  # the server closes without answering
        assert server.sent == []
        assert send_mail(server.url, to="a@example.com", subject="hi", idempotency_key="k1")
        assert [m["to"] for m in server.sent] == ["a@example.com"]


def test_a_message_without_recipient_is_refused_and_not_sent() -> None:
    """The service answers 400 to a message it cannot deliver, and records no email."""
    with MailServer() as server:
        with pytest.raises(MailUnavailableError, match="400"):
            send_mail(server.url, to="", subject="hi", idempotency_key="k2")
        assert server.sent == []
