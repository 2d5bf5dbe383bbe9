"""The web app of `vlm-decade view`: Starlette routes over a RunView, pages rendered on the server
from Jinja templates, pictures made on demand, and nothing served but the run folder's own files
and the images its images table lists.
"""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import quote, urlencode

import duckdb
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from vlm_decade.view import decade, openworld, pictures
from vlm_decade.view.runs import RunView

HERE = Path(__file__).parent
SVG = "image/svg+xml"
NO_STORE = {"Cache-Control": "no-store"}


def _number(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    env = templates.env
    env.filters["q"] = lambda value: quote(str(value), safe="")
    env.filters["num"] = _number
    env.filters["qs"] = lambda params: urlencode(params)
    env.filters["pair"] = lambda value: (value, value)
    env.filters["named"] = lambda error_type: (error_type, decade.ERROR_NAMES[error_type])
    env.globals["error_names"] = decade.ERROR_NAMES
    return templates


def create_app(view: RunView) -> Starlette:
    templates = _templates()
    env = templates.env
    env.globals["run"] = view
    env.globals["study"] = view.study

    def page(request: Request, name: str, context: dict, status: int = 200) -> Response:
        return templates.TemplateResponse(request, name, context, status_code=status)

    def image_of(image_id: str) -> dict:
        image = view.image(image_id)
        if image is None:
            raise HTTPException(404, f"the run lists no image '{image_id}'")
        return image

    def gallery(request: Request) -> Response:
        if view.kind == "openworld":
            q = openworld.GalleryQuery.parse(request.query_params, openworld.models(view), openworld.prompts(view))
            return page(request, "openworld_gallery.html", {
                "q": q, "result": openworld.gallery(view, q), "models": openworld.models(view), "prompts": openworld.prompts(view),
                "datasets": openworld.datasets(view), "granularities": openworld.GRANULARITIES, "outcomes": openworld.OUTCOMES,
                "outcome_counts": openworld.outcome_counts(view, q.prompt),
            })
        models, metrics = decade.models(view), decade.metrics(view)
        q = decade.GalleryQuery.parse(request.query_params, metrics, models)
        return page(request, "decade_gallery.html", {
            "q": q, "result": decade.gallery(view, q), "models": models, "metrics": metrics, "datasets": decade.datasets(view),
            "error_types": decade.ERROR_TYPES,
        })

    def image_page(request: Request) -> Response:
        image_id = request.path_params["image_id"]
        data = (openworld if view.kind == "openworld" else decade).image_page(view, image_id)
        if data is None:
            raise HTTPException(404, f"the run lists no image '{image_id}'")
        data["present"] = pictures.exists(data["image"])
        return page(request, f"{view.kind}_image.html", data)

    def model_page(request: Request) -> Response:
        if view.kind != "decade":
            raise HTTPException(404, "model pages are Study A's")
        try:
            number = max(1, int(request.query_params.get("page", "1")))
        except ValueError:
            number = 1
        data = decade.model_page(view, request.path_params["name"], number)
        if data is None:
            raise HTTPException(404, f"the study has no model '{request.path_params['name']}'")
        return page(request, "decade_model.html", data)

    def picture(request: Request) -> Response:
        kind, image = request.path_params["kind"], image_of(request.path_params["image_id"])
        try:
            if kind == "original":
                if not pictures.exists(image):
                    raise pictures.Missing(f"{image['path']}: not found")
                return FileResponse(image["path"])
            if kind == "thumb":
                return Response(pictures.thumbnail(view, image), media_type="image/jpeg")
            return Response(pictures.variant(view, image, kind), media_type="image/jpeg")
        except KeyError:
            raise HTTPException(404, f"the study has no variant '{kind}'") from None
        except pictures.Missing as exc:
            return Response(pictures.placeholder(f"image not found: {exc}"), media_type=SVG, headers=NO_STORE)

    def heatmap(request: Request) -> Response:
        image = image_of(request.path_params["image_id"])
        try:
            data = pictures.heatmap(view, image)
        except pictures.Missing as exc:
            return Response(pictures.placeholder(f"image not found: {exc}"), media_type=SVG, headers=NO_STORE)
        if data is None:
            raise HTTPException(404, "no heat map: no subject has a complete masked profile for this image")
        return Response(data, media_type="image/png")

    def run_file(request: Request) -> Response:
        """A file inside the run folder (the report, its figures and tables); anything that resolves
        outside it, through `..`, an absolute path or a link, is not found."""
        relative = request.path_params["path"]
        root = view.root.resolve()
        target = (root / relative).resolve()
        if Path(relative).is_absolute() or not target.is_relative_to(root) or not target.is_file():
            raise HTTPException(404, "no such file in the run folder")
        return FileResponse(target)

    async def not_found(request: Request, exc: HTTPException) -> Response:
        return page(request, "problem.html", {"title": "Not found", "detail": exc.detail}, status=exc.status_code)

    async def table_error(request: Request, exc: duckdb.Error) -> Response:
        detail = f"a table of this run cannot be read as the view expects: {exc}"
        return page(request, "problem.html", {"title": "Unreadable table", "detail": detail}, status=500)

    routes = [
        Route("/", gallery),
        Route("/image/{image_id:path}", image_page),
        Route("/model/{name:path}", model_page),
        Route("/picture/{kind}/{image_id:path}", picture),
        Route("/heatmap/{image_id:path}", heatmap),
        Route("/run/{path:path}", run_file),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: not_found, duckdb.Error: table_error})


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


def serve(view: RunView, sock: socket.socket) -> None:
    """Serve the run until interrupted."""
    import uvicorn

    config = uvicorn.Config(create_app(view), log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
