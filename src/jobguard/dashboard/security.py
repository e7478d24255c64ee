"""Who may use the dashboard, and proof that a form was sent by the dashboard's own page.

* Bound to a loopback address, the dashboard is open unless a token or a password is set.
  Bound anywhere else it refuses to start without one (:func:`check_binding`).
* Logging in (a form, or an ``Authorization: Bearer``/``Basic`` header for scripts) gives a
  session cookie signed with a secret made at start-up (HttpOnly, SameSite=Strict).
* Every form that changes something carries a CSRF token: an HMAC of a random per-browser cookie
  under the same secret; a POST whose token is missing or wrong is refused (403).
* Without a login, only requests whose ``Host`` header names this machine (``localhost`` or a
  loopback address) or an allowed host are answered: a page of another site whose name was made
  to resolve to 127.0.0.1 (DNS rebinding) gets a 400 instead of the dead letter queue.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
import time
from dataclasses import dataclass, field

from jobguard.exceptions import ConfigurationError

SESSION_COOKIE = "jobguard_session"
CSRF_COOKIE = "jobguard_csrf"
SESSION_TTL_S = 12 * 3600
TOKEN_USER = "token"  # noqa: S105 - the audit trail's name for token holders
LOOPBACK_NAMES = {"localhost"}
ANY_HOST = "*"
_HOST_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-._[]:")


def host_name(header: str | None) -> str | None:
    """The name of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), lower case,
    without a trailing dot; ``None`` if there is none or it is malformed."""
    text = (header or "").strip().lower()
    if text.startswith("["):
        name, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not (rest[0] == ":" and rest[1:].isdigit())):
            return None
        return name or None
    name, colon, port = text.partition(":")
    if colon and not port.isdigit():
        return None
    name = name.rstrip(".")
    if not name or not set(name) <= _HOST_CHARACTERS:
        return None
    return name


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Access:
    """The dashboard's credentials and its signing secret.

    Attributes:
        token: A shared secret; log in with it (user name ``token`` in the audit trail).
        user: With ``password``: basic credentials instead of (or besides) a token.
        password: The password of ``user``.
        secret: Signs sessions and CSRF tokens; random per process unless given.
        allowed_hosts: Host names (``Host`` header, any port) answered besides ``localhost`` and
            loopback addresses; ``"*"`` answers any. ``None``: only those without a login, any
            name with one (a browser sends its session cookie only to the name that set it).
    """

    token: str | None = None
    user: str | None = None
    password: str | None = None
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    allowed_hosts: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if (self.user is None) != (self.password is None):
            raise ConfigurationError("give both a dashboard user and a password, or neither")
        if self.user is not None and (not self.user.isprintable() or ":" in self.user):
            raise ConfigurationError("the dashboard user name must be printable, without ':'")
        for what, value in (("token", self.token), ("password", self.password)):
            if value is not None and len(value) < 8:
                raise ConfigurationError(f"the dashboard {what} must be at least 8 characters")
        for name in self.allowed_hosts or ():
            if name != ANY_HOST and host_name(name) != name.lower().rstrip("."):
                raise ConfigurationError(
                    f"allowed host {name!r} must be a host name or address without a port, "
                    f"or {ANY_HOST!r}"
                )

    def host_ok(self, header: str | None) -> bool:
        """Whether a request with this ``Host`` header may be answered (DNS rebinding)."""
        if self.allowed_hosts is None and self.required:
            return True
        allowed = {name.lower().rstrip(".") for name in self.allowed_hosts or ()}
        if ANY_HOST in allowed:
            return True
        name = host_name(header)
        return name is not None and (name in allowed or is_loopback(name))

    @property
    def required(self) -> bool:
        """Whether a login is needed at all."""
        return self.token is not None or self.user is not None

    def check(self, user: str, secret: str) -> str | None:
        """The user name these credentials log in as, or ``None``."""
        if self.token is not None and hmac.compare_digest(secret.encode(), self.token.encode()):
            return TOKEN_USER if not user or user == TOKEN_USER else None
        if (
            self.user is not None
            and self.password is not None
            and hmac.compare_digest(user.encode(), self.user.encode())
            and hmac.compare_digest(secret.encode(), self.password.encode())
        ):
            return self.user
        return None

    def check_header(self, header: str | None) -> str | None:
        """The user an ``Authorization`` header proves, or ``None``."""
        if not header:
            return None
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer":
            return self.check("", value.strip())
        if scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return None
            user, _, password = decoded.partition(":")
            return self.check(user, password)
        return None

    def _sign(self, text: str) -> str:
        return hmac.new(self.secret, text.encode(), hashlib.sha256).hexdigest()

    def session_cookie(self, user: str, now: float | None = None) -> str:
        """A signed session for ``user``, valid :data:`SESSION_TTL_S`."""
        expires = int((now or time.time()) + SESSION_TTL_S)
        body = f"{user}:{expires}"
        return f"{body}:{self._sign(body)}"

    def session_user(self, cookie: str | None, now: float | None = None) -> str | None:
        """The user of a valid, unexpired session cookie, or ``None``."""
        if not cookie or cookie.count(":") != 2:
            return None
        user, expires, signature = cookie.split(":")
        if not hmac.compare_digest(signature, self._sign(f"{user}:{expires}")):
            return None
        if not expires.isdigit() or int(expires) < (now or time.time()):
            return None
        return user

    def csrf_token(self, browser_cookie: str) -> str:
        """The token forms carry for the browser holding ``browser_cookie``."""
        return self._sign(f"csrf:{browser_cookie}")

    def csrf_ok(self, browser_cookie: str | None, sent: str | None) -> bool:
        """Whether a POST's token matches its browser cookie."""
        if not browser_cookie or not sent:
            return False
        return hmac.compare_digest(sent, self.csrf_token(browser_cookie))


def check_binding(host: str, access: Access) -> None:
    """Refuse to serve beyond this machine without a token or a password."""
    if not is_loopback(host) and not access.required:
        raise ConfigurationError(
            f"the dashboard would be open to the network on {host!r}: set a token "
            "(--token or JOBGUARD_DASHBOARD_TOKEN) or a user and password, or bind to 127.0.0.1"
        )
