"""The dashboard served for real: a request for a foreign host name is refused (#18).

A page served as ``attacker.example`` whose name then resolves to 127.0.0.1 talks to the local
dashboard with ``Host: attacker.example``: without a login it must not answer such a request,
read or write. A loopback name always passes; other names only with ``--allowed-host``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from jobguard import App
from jobguard.dashboard.security import Access
from jobguard.models import JobStatus
from tests.observability.conftest import Client, Served
from tests.observability.test_dashboard_http import TOKEN, dashboard, store

__all__ = ["store"]  # the fixture, shared with the other dashboard tests

FOREIGN = "attacker.example"


def port_of(client: Client) -> int:
    port = urlsplit(client.base).port
    assert port is not None
    return port


def test_a_foreign_host_header_can_neither_read_nor_purge(
    store: App, store_url: str, served: list[Served]
) -> None:
    """The rebinding attack: the CSRF token fetched, then a purge sent as ``attacker.example``;
    both refused with a 400 page naming the host, and the dead job is still there."""
    client = dashboard(store_url, served)
    port = port_of(client)
    foreign = {"Host": f"{FOREIGN}:{port}"}
    read = client.request("/dlq", headers=foreign)
    assert read.status == 400
    assert "flaky" not in read.body
    assert FOREIGN in read.body
    assert "--allowed-host" in read.body
    csrf = client.csrf("/dlq")  # as the page could have read it under the rebound name
    purge = client.request("/dlq/1/purge", form={"csrf": csrf}, headers=foreign)
    assert purge.status == 400
    for path in ("/login", "/no/such/page", "/jobs/1"):
        assert client.request(path, headers=foreign).status == 400, path
    assert store.get_job(1).status == JobStatus.DEAD
    assert store.audit_trail() == []
    for name in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", "localhost."):
        assert client.request("/dlq", headers={"Host": name}).status == 200, name
    assert client.request("/dlq", headers={"Host": f"{FOREIGN}.localhost.evil"}).status == 400


def test_allowed_host_admits_a_configured_name_and_no_other(
    store: App, store_url: str, served: list[Served]
) -> None:
    client = dashboard(store_url, served, "--allowed-host", "jobs.internal")
    assert client.request("/dlq", headers={"Host": "jobs.internal:8642"}).status == 200
    assert client.request("/dlq", headers={"Host": "jobs.internal"}).status == 200
    assert client.request("/dlq", headers={"Host": FOREIGN}).status == 400
    assert client.request("/dlq").status == 200  # 127.0.0.1 still answers


def test_with_a_login_and_no_allowed_host_any_name_gets_the_login(
    store: App, store_url: str, served: list[Served]
) -> None:
    """Behind a login the browser sends its session cookie only to the name that set it, so a
    rebound page has nothing to send: names stay open (a proxy's name need not be listed)."""
    client = dashboard(store_url, served, "--token", TOKEN)
    reply = client.request("/dlq", headers={"Host": FOREIGN})
    assert reply.status == 303
    assert reply.headers["location"].startswith("/login")


@pytest.mark.parametrize(
    ("allowed", "required", "host", "ok"),
    [
        (None, False, "localhost:1", True),
        (None, False, "[::1]:8642", True),
        (None, False, "127.0.0.1", True),
        (None, False, "127.0.0.2", True),
        (None, False, "attacker.example", False),
        (None, False, None, False),
        (None, False, "", False),
        (None, True, "attacker.example", True),
        (("jobs.internal",), True, "attacker.example", False),
        (("jobs.internal",), True, "Jobs.Internal:443", True),
        (("*",), False, "attacker.example", True),
    ],
)
def test_host_rules(allowed: tuple[str, ...] | None, required: bool, host: str, ok: bool) -> None:
    access = Access(token=TOKEN if required else None, allowed_hosts=allowed)
    assert access.host_ok(host) is ok


def test_a_bad_allowed_host_is_refused() -> None:
    for bad in ("", "has space", "a/b", "x:y:z"):
        with pytest.raises(Exception, match="allowed host"):
            Access(allowed_hosts=(bad,))
