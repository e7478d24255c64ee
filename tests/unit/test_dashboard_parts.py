"""The dashboard's pure parts: parameter validation, sessions and CSRF tokens, SVG escaping."""

from __future__ import annotations

import pytest

from jobguard.dashboard import charts, params
from jobguard.dashboard.security import Access, check_binding, is_loopback
from jobguard.exceptions import ConfigurationError
from jobguard.models import Attempt, Outcome


@pytest.mark.parametrize("text", ["0", "-1", "1001", "1e3", "١٢", "x", "99999999999999999999"])
def test_a_page_outside_1_to_1000_or_not_decimal_is_refused(text: str) -> None:
    with pytest.raises(params.BadRequest, match="page must be"):
        params.page({"page": [text]})


def test_a_page_in_range_is_read_and_absent_means_the_first() -> None:
    assert params.page({"page": ["1000"]}) == 1000
    assert params.page({}) == 1


def test_a_session_cookie_cannot_be_forged_or_outlive_its_expiry() -> None:
    access = Access(token="token-of-the-test")
    cookie = access.session_cookie("token", now=1000.0)
    assert access.session_user(cookie, now=1001.0) == "token"
    user, expires, signature = cookie.split(":")
    assert access.session_user(f"admin:{expires}:{signature}", now=1001.0) is None
    assert access.session_user(f"{user}:{int(expires) + 10**6}:{signature}", now=1001.0) is None
    assert access.session_user(cookie, now=float(expires) + 1) is None
    assert Access(token="token-of-the-test").session_user(cookie, now=1001.0) is None  # new secret


def test_a_csrf_token_belongs_to_one_browser_cookie() -> None:
    access = Access()
    token = access.csrf_token("browser-a")
    assert access.csrf_ok("browser-a", token)
    assert not access.csrf_ok("browser-b", token)
    assert not access.csrf_ok("browser-a", None)
    assert not access.csrf_ok(None, token)


def test_credentials_are_checked_from_the_form_and_the_headers() -> None:
    access = Access(user="ops", password="s3cret-pass")
    assert access.check("ops", "s3cret-pass") == "ops"
    assert access.check("ops", "wrong-pass") is None
    assert access.check_header("Basic b3BzOnMzY3JldC1wYXNz") == "ops"
    assert access.check_header("Basic !!!") is None
    assert Access(token="a-long-token").check_header("Bearer a-long-token") == "token"


def test_serving_beyond_loopback_needs_a_login() -> None:
    assert is_loopback("127.0.0.1")
    assert is_loopback("::1")
    assert not is_loopback("0.0.0.0")
    check_binding("127.0.0.1", Access())
    check_binding("0.0.0.0", Access(token="a-long-token"))
    with pytest.raises(ConfigurationError, match="open to the network"):
        check_binding("0.0.0.0", Access())
    with pytest.raises(ConfigurationError, match="at least 8"):
        Access(token="short")


def test_text_from_the_store_is_escaped_inside_the_svg() -> None:
    attempt = Attempt(
        id=1, job_id=1, attempt=1, task="t", queue="q", operation_key=None,
        worker_id="<script>alert(1)</script>", lease_token="x" * 32, lock_owner=None,
        fence=None, started_at=10.0, ended_at=11.0, duration_s=1.0,
        outcome=Outcome.COMPLETED, error_type=None, error_message=None, traceback=None,
        steps_run=0, steps_skipped=0,
    )  # fmt: skip
    svg = str(charts.timeline([attempt], now=12.0))
    assert "<script>" not in svg
    assert "&lt;script&gt;" in svg
    line = charts.Line(2.0, "<b>timeout</b>", "#c62828")
    assert "<b>" not in str(charts.histogram([0.5, 1.0], [line]))
