"""Who the viewer answers, and the headers every answer carries.

- The `Host` a request names must be a loopback name, the address the viewer is bound to, or one
  named with `--allow-host`: a page on another site that points its own name at this machine (DNS
  rebinding) gets 400, not the run.
- Bound to anything but loopback, the viewer asks for a token: printed in the address at start
  (`/?token=...`), as notebook servers do; the first request that carries it gets a cookie (and is
  sent on to the same address without the token), later requests are checked by the cookie.
- A path or query with a control character (a NUL byte, a line break) is a bad request (400).
- Every answer says `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer` and a
  Content-Security-Policy: the pages load scripts, styles and pictures from the viewer only, the run
  folder's own files (the report) run no script, and no page may be framed (`frame-ancestors 'none'`).
"""

from __future__ import annotations

import hmac
import re
import secrets
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from vlm_decade.core.hosts import LOOPBACK_NAMES, host_name, is_loopback

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
    "base-uri 'none'; frame-ancestors 'none'"
)
# The run folder's files are the report and its figures: inline styles and embedded pictures, no script.
RUN_FILE_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = ((b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY"))


@dataclass(frozen=True)
class Access:
    """The Host names the viewer answers to and, bound beyond loopback, the token it asks for."""

    hosts: frozenset[str]
    token: str | None
    cookie: str

    @classmethod
    def bound(cls, host: str, port: int, allow: tuple[str, ...] | list[str] = (), token: str | None = None) -> Access:
        """For a viewer bound to `host`:`port` (port in the cookie's name: cookies do not tell ports apart)."""
        hosts = frozenset(
            {*LOOPBACK_NAMES, host_name(host) or host.lower(), *(host_name(a) for a in allow if a.strip())}
        )
        needed = not is_loopback(host)
        return cls(hosts, (token or secrets.token_urlsafe(24)) if needed else None, f"vlm_decade_view_{port}")

    def url(self, host: str, port: int) -> str:
        """The address to print at start: with the token when one is needed."""
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/" + (f"?{urlencode({'token': self.token})}" if self.token else "")

    def _same(self, given: str | None) -> bool:
        return given is not None and self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def refusal(self, request: Request) -> Response | None:
        """The answer to a request that may not pass, or None."""
        host = host_name(request.headers.get("host", ""))
        if host not in self.hosts:
            return PlainTextResponse(
                f"400: this viewer does not answer for the host '{host[:100]}' (start it with "
                f"--allow-host NAME to add a name)",
                status_code=400,
            )
        if CONTROL.search(request.scope["path"]) or any(
            CONTROL.search(k) or CONTROL.search(v) for k, v in request.query_params.multi_items()
        ):
            return PlainTextResponse("400: the request holds a control character", status_code=400)
        if self.token is None or self._same(request.cookies.get(self.cookie)):
            return None
        if self._same(request.query_params.get("token")):
            rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
            answer = RedirectResponse(quote(request.scope["path"]) + (f"?{rest}" if rest else ""), status_code=303)
            answer.set_cookie(self.cookie, self.token, httponly=True, samesite="strict")
            return answer
        return PlainTextResponse(
            "403: this viewer needs the token in the address it printed when it started (http://HOST:PORT/?token=...)",
            status_code=403,
        )


class Guard:
    """ASGI middleware: `Access.refusal` before the app, the security headers on every answer."""

    def __init__(self, app, access: Access):
        self.app, self.access = app, access

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = (RUN_FILE_POLICY if scope.get("path", "").startswith("/run/") else PAGE_POLICY).encode()

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = {
                    **message,
                    "headers": [*message.get("headers", []), *HEADERS, (b"content-security-policy", policy)],
                }
            await send(message)

        refusal = self.access.refusal(Request(scope))
        if refusal is not None:
            await refusal(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)
