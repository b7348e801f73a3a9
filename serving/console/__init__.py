"""The operator's console: static files shipped in the package, served under ``/ui/``.

The console is a view, not a second API: its script reads only the public routes (``/v1/sessions``, a session and
its requests, ``/v1/memory/search``) with the key its user signed in with, kept in the browser's session storage
and sent as a bearer token, never in a URL. The files hold no data and need no key; every value the script shows is
set as text, and the policy below lets the page run nothing but its own script file.
"""

from __future__ import annotations

import functools
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from serving.errors import APIError

FILES = {"": ("index.html", "text/html; charset=utf-8"), "console.js": ("console.js", "text/javascript; charset=utf-8"),
         "console.css": ("console.css", "text/css; charset=utf-8"),
         "admin.js": ("admin.js", "text/javascript; charset=utf-8")}
HEADERS = {
    # its own script and style files only: no inline script or style, nothing from elsewhere, no frames, no forms
    # that post anywhere; fetch() to this server only
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter()


@functools.cache
def _file(name: str) -> bytes:  # read once a process, not on every request
    return (resources.files("serving.console") / name).read_bytes()


@router.get("/ui", include_in_schema=False)
async def console_root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=308)


@router.get("/ui/", include_in_schema=False)
async def console_page() -> Response:
    return await console_file("")


@router.get("/ui/{name}", include_in_schema=False)
async def console_file(name: str) -> Response:
    if name not in FILES:
        raise APIError(404, f"the console has no file {name[:60]!r}", type="not_found_error")
    file, media = FILES[name]
    return Response(_file(file), media_type=media, headers=HEADERS)
