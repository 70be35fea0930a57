"""Who may look, who may act: the ``authorize`` hook, read-only mode and CSRF tokens.

- ``authorize(request)`` runs before every page and action; False answers 403, and an
  ``HTTPException`` it raises (a FastAPI security dependency's 401, say) is answered as is.
- Actions exist only when the dashboard is writable. ``read_only=None`` decides per request:
  writable when an ``authorize`` hook is configured, or else when the request came in on a
  loopback address with no proxy header (a request a proxy forwarded may come from anywhere).
- Every action carries a CSRF token: an HMAC, under the app's secret, of a random nonce kept
  in an HttpOnly, SameSite=Strict cookie (double submit, bound to the secret). A missing or
  wrong token is refused with 403 before anything is read or written.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import ipaddress
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from cyclone._model.errors import InvalidInputError, InvalidOptionError

Authorize = Callable[[Request], bool | Awaitable[bool]]
COOKIE = "cyclone_csrf"
FIELD = "csrf"
HEADER = "x-cyclone-csrf"
_PROXY_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip")


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Guard:
    """The dashboard's access rules (see the module docstring)."""

    authorize: Authorize | None
    read_only: bool | None
    secret: bytes

    @classmethod
    def make(
        cls, authorize: Authorize | None, read_only: bool | None, secret: str | bytes | None
    ) -> Guard:
        """Check the options; a missing secret is a random one (tokens die with the app)."""
        if authorize is not None and not callable(authorize):
            raise InvalidInputError("authorize must be a callable taking the request")
        if read_only is not None and not isinstance(read_only, bool):
            raise InvalidInputError("read_only must be True, False or None (decide per request)")
        if secret is None:
            key = secrets.token_bytes(32)
        elif isinstance(secret, str):
            key = secret.encode()
        else:
            key = bytes(secret)
        if len(key) < 16:
            raise InvalidOptionError("secret must be at least 16 bytes; use secrets.token_hex(32)")
        return cls(authorize=authorize, read_only=read_only, secret=key)

    async def check(self, request: Request) -> None:
        """Run the ``authorize`` hook: 403 unless it allows the request."""
        if self.authorize is None:
            return
        allowed = self.authorize(request)
        if inspect.isawaitable(allowed):
            allowed = await allowed
        if allowed is not True:
            raise HTTPException(403, "not authorized to use this dashboard")

    def writable(self, request: Request) -> bool:
        """Whether this request may act (rather than only look)."""
        if self.read_only is not None:
            return not self.read_only
        if self.authorize is not None:
            return True
        server = request.scope.get("server")
        local = is_loopback(server[0] if server else None)
        return local and not any(h in request.headers for h in _PROXY_HEADERS)

    def token(self, request: Request) -> tuple[str, str | None]:
        """The CSRF token for this request's pages, and a new nonce to set as the cookie
        (None when the request already has one)."""
        nonce = request.cookies.get(COOKIE)
        fresh = None
        if not nonce or len(nonce) > 64:
            nonce = fresh = secrets.token_urlsafe(24)
        return self._sign(nonce), fresh

    def _sign(self, nonce: str) -> str:
        return hmac.new(self.secret, nonce.encode(), hashlib.sha256).hexdigest()

    async def verify(self, request: Request) -> None:
        """403 unless the request carries the token matching its cookie."""
        nonce = request.cookies.get(COOKIE)
        sent = request.headers.get(HEADER)
        if sent is None:
            sent = next(iter((await read_form(request)).get(FIELD, [])), None)
        if not nonce or not sent or not hmac.compare_digest(self._sign(nonce), sent):
            raise HTTPException(
                403,
                "missing or wrong CSRF token: reload the dashboard page and try again"
                " (cookies must be enabled)",
            )


MAX_FORM = 256 * 1024


async def read_form(request: Request) -> dict[str, list[str]]:
    """The request's URL-encoded form (read once per request, at most ``MAX_FORM`` bytes)."""
    cached: dict[str, list[str]] | None = getattr(request.state, "cyclone_form", None)
    if cached is not None:
        return cached
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise HTTPException(413, f"the form is larger than {MAX_FORM} bytes")
    form: dict[str, list[str]] = {}
    try:
        pairs = parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise HTTPException(400, "the form is not URL-encoded UTF-8 text") from None
    for name, value in pairs:
        form.setdefault(name, []).append(value)
    request.state.cyclone_form = form
    return form


def set_cookie(response: Response, request: Request, nonce: str) -> None:
    """Keep the CSRF nonce in a cookie scoped to the dashboard's mount path."""
    response.set_cookie(
        COOKIE,
        nonce,
        path=(request.scope.get("root_path") or "") + "/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
