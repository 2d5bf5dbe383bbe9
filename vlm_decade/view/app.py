"""The web app of `vlm-decade view`: Starlette routes over a RunView, the same for every study (its
pages' data from its study's pages module, `view.pages`), pages rendered on the server from Jinja
templates, pictures made on demand, and nothing served but what was verified: the run
folder's own files (a table only while it hashes as the manifest records) and the images its images
table lists (only while their bytes match their sha256). `access` checks who asks; a bad request is
a 4xx page, never a 5xx.
"""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import quote, urlencode

import duckdb
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from vlm_decade.core.progress import counted
from vlm_decade.view import pictures
from vlm_decade.view.access import Access, Guard
from vlm_decade.view.gallery import BadRequest, page_number
from vlm_decade.view.pages import Pages, pages_of, template_folders
from vlm_decade.view.runs import RunView
from vlm_decade.view.verify import Missing, Unverified

HERE = Path(__file__).parent
SVG = "image/svg+xml"
NO_STORE = {"Cache-Control": "no-store"}
TITLES = {400: "Bad request", 403: "Forbidden", 404: "Not found", 405: "Method not allowed", 409: "Unverified table"}


def _number(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _templates(view: RunView, pages: Pages) -> Jinja2Templates:
    templates = Jinja2Templates(directory=template_folders(pages))
    env = templates.env
    env.filters["q"] = lambda value: quote(str(value), safe="")
    env.filters["num"] = _number
    env.filters["qs"] = lambda params: urlencode(params)
    env.filters["pair"] = lambda value: (value, value)
    env.filters["counted"] = counted
    env.globals["run"] = view
    env.globals["study"] = view.study
    env.globals["study_pages"] = pages  # its HEADER, LINKS and names; a page's own "pages" is its page count
    return templates


def create_app(view: RunView, access: Access | None = None) -> Starlette:
    """The app over `view`; `access` says whom it answers (default: this machine only, no token)."""
    routes = [
        Route("/", gallery),
        Route("/image/{image_id:path}", image_page),
        Route("/model/{name:path}", model_page),
        Route("/confusions", confusion_page),
        Route("/picture/{kind}/{image_id:path}", picture),
        Route("/heatmap/{image_id:path}", heatmap),
        Route("/run/{path:path}", run_file),
        # Browsers ask for it on every page, the report's too; an answer keeps their consoles clean.
        Route("/favicon.ico", lambda request: FileResponse(HERE / "static" / "favicon.svg", media_type=SVG)),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    handlers = {HTTPException: problem, BadRequest: bad_request, Unverified: unverified, duckdb.Error: table_error}
    guard = Middleware(Guard, access=access or Access.bound("127.0.0.1", 0))
    app = Starlette(routes=routes, exception_handlers=handlers, middleware=[guard])
    pages = pages_of(view)
    app.state.view, app.state.pages, app.state.templates = view, pages, _templates(view, pages)
    return app


def _view(request: Request) -> RunView:
    return request.app.state.view


def _page(request: Request, name: str, context: dict, status: int = 200) -> Response:
    """Template `name` (`<study>_` before it for a study's own page) rendered with `context`."""
    return request.app.state.templates.TemplateResponse(request, name, context, status_code=status)


def _image_of(request: Request) -> dict:
    image_id = request.path_params["image_id"]
    image = _view(request).image(image_id)
    if image is None:
        raise HTTPException(404, f"the run lists no image '{image_id}'")
    return image


def gallery(request: Request) -> Response:
    view = _view(request)
    return _page(request, f"{view.kind}_gallery.html", request.app.state.pages.gallery_page(view, request.query_params))


def image_page(request: Request) -> Response:
    view, image_id = _view(request), request.path_params["image_id"]
    data = request.app.state.pages.image_page(view, image_id)
    if data is None:
        raise HTTPException(404, f"the run lists no image '{image_id}'")
    data["present"] = pictures.exists(data["image"])
    return _page(request, f"{view.kind}_image.html", data)


def model_page(request: Request) -> Response:
    view, name = _view(request), request.path_params["name"]
    data = request.app.state.pages.model_page(view, name, page_number(request.query_params))
    if data is None:
        raise HTTPException(404, f"the study has no model '{name}'")
    return _page(request, f"{view.kind}_model.html", data)


def confusion_page(request: Request) -> Response:
    view, pages = _view(request), request.app.state.pages
    if not hasattr(pages, "confusion_page"):
        raise HTTPException(404, "the confusion view is Study B's")
    return _page(request, f"{view.kind}_confusions.html", pages.confusion_page(view, request.query_params))


def picture(request: Request) -> Response:
    view, kind, image = _view(request), request.path_params["kind"], _image_of(request)
    try:
        if kind == "original":
            data, media_type = pictures.original(image)
            return Response(data, media_type=media_type)
        if kind == "thumb":
            return Response(pictures.thumbnail(view, image), media_type="image/jpeg")
        return Response(pictures.variant(view, image, kind), media_type="image/jpeg")
    except KeyError:
        raise HTTPException(404, f"the study has no variant '{kind}'") from None
    except Missing as exc:
        return Response(pictures.placeholder(f"image not found: {exc}"), media_type=SVG, headers=NO_STORE)


def heatmap(request: Request) -> Response:
    image = _image_of(request)
    try:
        data = pictures.heatmap(_view(request), image)
    except Missing as exc:
        return Response(pictures.placeholder(f"image not found: {exc}"), media_type=SVG, headers=NO_STORE)
    if data is None:
        raise HTTPException(404, "no heat map: no subject has a complete masked profile for this image")
    return Response(data, media_type="image/png")


def run_file(request: Request) -> Response:
    """A file inside the run folder (the report, its figures and tables); anything that resolves
    outside it, through `..`, an absolute path or a link, is not found, and so are the folder's
    hidden files (the lock, the caches, the parts). A table is served only while it verifies."""
    view, relative = _view(request), Path(request.path_params["path"])
    root = view.root.resolve()
    try:
        target = (root / relative).resolve()
    except (OSError, RuntimeError):  # a loop of links
        target = None
    if (
        relative.is_absolute()
        or target is None
        or not target.is_relative_to(root)
        or not target.is_file()
        or any(part.startswith(".") for part in relative.parts + target.relative_to(root).parts)
    ):
        raise HTTPException(404, "no such file in the run folder")
    if target.parent == root and target.suffix == ".parquet":
        view.checks.require([target.stem])
    return FileResponse(target)


async def problem(request: Request, exc: HTTPException) -> Response:
    title = TITLES.get(exc.status_code, "Cannot answer")
    return _page(request, "problem.html", {"title": title, "detail": exc.detail}, status=exc.status_code)


async def bad_request(request: Request, exc: BadRequest) -> Response:
    return await problem(request, HTTPException(exc.status, exc.detail))


async def unverified(request: Request, exc: Unverified) -> Response:
    return await problem(request, HTTPException(409, str(exc)))


async def table_error(request: Request, exc: duckdb.Error) -> Response:
    detail = f"a table of this run cannot be read as the view expects: {exc}"
    return _page(request, "problem.html", {"title": "Unreadable table", "detail": detail}, status=500)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket; port 0 takes any free port (what tests use)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    # Listening at once: a client that connects as soon as the address is printed waits in the
    # backlog until the server accepts, instead of being refused.
    sock.listen(128)
    return sock


def serve(view: RunView, sock: socket.socket, access: Access) -> None:
    """Serve the run until interrupted."""
    import uvicorn

    config = uvicorn.Config(create_app(view, access), log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
