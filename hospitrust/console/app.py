"""``hospitrust console``: a read-only web page that follows runs from their files.

A Starlette app (FastAPI's foundation, shipped with Flower) on uvicorn. The page is one static
HTML file with its script and uPlot (shipped in ``static/vendor``: no CDN, hospitals' networks
are closed); it polls a small JSON API for what changed since the round it has. The API reads
the run directories (``runs.RunIndex``) and never writes to them: no load on the ServerApp.

On loopback it is open; on any other address every request needs the token printed at start
(``?token=`` once, then a cookie, or ``Authorization: Bearer``), else 401.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from hospitrust.console import views
from hospitrust.console.progress import PROGRESS, round_in_flight
from hospitrust.console.runs import RunIndex, RunReader

STATIC = Path(__file__).resolve().parent / "static"
COOKIE = "hospitrust_console_token"


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_VIEWS: dict[tuple[str, int, int], tuple[Any, Any, Any]] = {}  # (run, rounds, hospitals) -> computed views


def _views(reader: RunReader, hospitals: list[str]) -> tuple[Any, Any, Any]:
    """The run's series, trust and alerts, computed once per new round (a poll that finds nothing new is cheap)."""
    key = (reader.id, len(reader.rounds), len(hospitals))
    if key not in _VIEWS:
        for old in [k for k in _VIEWS if k[0] == reader.id]:
            del _VIEWS[old]
        rare = views.rare_holders(reader.class_counts)
        _VIEWS[key] = (views.metric_series(reader.rounds), views.trust_series(reader.rounds, hospitals),
                       views.all_alerts(reader.rounds, ground_truth=reader.ground_truth, rare=rare,
                                        left_out=reader.left_out))
    return _VIEWS[key]


def run_state(reader: RunReader, since: int = 0) -> dict[str, Any]:
    """What changed in a run since its ``since``-th round (0: everything)."""
    rounds = reader.rounds
    hospitals = reader.hospitals
    since = max(0, min(int(since), len(rounds)))
    series, trust, every_alert = _views(reader, hospitals)
    # round 0: the hospitals left out at the query round, shown with the first state
    alerts = [a for a in every_alert if a["round"] > since or (since == 0 and a["round"] == 0)]
    row = reader.row()
    if reader.failure:
        alerts.append({"round": len(rounds), "kind": "run-failed", "hospital": "", "text": f"the run failed: {row['failure']}"})
    return {
        "run": row,
        "since": since,
        "rounds": len(rounds),
        "hospitals": hospitals,
        "ground_truth": reader.ground_truth,
        "series": {k: v[since:] for k, v in series.items()},
        "trust": {"signal": trust["signal"], "values": {h: v[since:] for h, v in trust["values"].items()},
                  "marks": {h: [r for r in m if r > since] for h, m in trust["marks"].items()}},
        "alerts": alerts,
        "summary": _summary_view(reader.summary),
        # the round the ServerApp waits on now: none once its record is in rounds.jsonl, or once the run completed,
        # stopped or failed (nobody waits any more: its hospitals are not late)
        "in_flight": (round_in_flight(reader.path / PROGRESS, len(rounds)) if row["status"] == "running"
                      else None),
    }


def _summary_view(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    if not summary:
        return None
    keep = ("final", "best_round", "rounds", "wall_seconds", "malicious_hospitals", "security", "participation",
            "near_duplicates", "resumed_at", "privacy")
    return {k: summary[k] for k in keep if k in summary}


def round_rows(reader: RunReader, rnd: int) -> dict[str, Any]:
    """The hospitals' rows of round ``rnd`` (1-based)."""
    if not 1 <= rnd <= len(reader.rounds):
        raise KeyError(f"run {reader.id} has rounds 1..{len(reader.rounds)}, not {rnd}")
    record = reader.rounds[rnd - 1]
    left_out = [{"hospital": f.get("hospital", ""), "status": "left out", "reason": f.get("reason", ""), "signals": [],
                 "weight": None, "accuracy": None} for f in reader.left_out]
    return {"round": rnd, "rows": views.hospital_rows(record, reader.hospitals, reader.ground_truth) + left_out,
            "asked": record.asked, "note": record.note,
            "aggregation_seconds": record.aggregation_seconds, "round_seconds": record.round_seconds}


class TokenGate(BaseHTTPMiddleware):
    """Every request needs the token (query, cookie or bearer header), else 401."""

    def __init__(self, app, token: str) -> None:
        super().__init__(app)
        self.token = token

    async def dispatch(self, request: Request, call_next) -> Response:
        given = (request.query_params.get("token") or request.cookies.get(COOKIE)
                 or request.headers.get("authorization", "").removeprefix("Bearer ").strip())
        if not given or not hmac.compare_digest(given, self.token):
            return PlainTextResponse("401: this console needs its token (printed when it started): ?token=...",
                                     status_code=401)
        response = await call_next(request)
        if request.query_params.get("token"):
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
        return response


def create_app(root: Path, token: str | None = None, connection: str | None = None) -> Starlette:
    """The console's app over the runs under ``root``; ``token``: required on every request when given;
    ``connection``: the operator's flwr connection, to ask the SuperLink about runs whose records end early.
    """
    flower_status = None
    if connection:
        from hospitrust.ops import flwr

        def flower_status(run_id: int) -> tuple[str, str]:
            return flwr.run_status(run_id, connection)
    index = RunIndex(root, flower_status)

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "console.html", media_type="text/html")

    async def api_runs(request: Request) -> Response:
        return JSONResponse({"root": str(index.root), "runs": index.rows()})

    async def api_state(request: Request) -> Response:
        try:
            reader = index.get(request.query_params["run"])
            since = int(request.query_params.get("since", 0))
        except (KeyError, ValueError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        return JSONResponse(run_state(reader, since))

    async def api_round(request: Request) -> Response:
        try:
            reader = index.get(request.query_params["run"])
            return JSONResponse(round_rows(reader, int(request.query_params["round"])))
        except (KeyError, ValueError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)

    middleware = [Middleware(TokenGate, token=token)] if token else []
    return Starlette(routes=[
        Route("/", page),
        Route("/api/runs", api_runs),
        Route("/api/state", api_state),
        Route("/api/round", api_round),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ], middleware=middleware)


def serve(root: Path, *, host: str = "127.0.0.1", port: int = 8080, token: str | None = None,
          certfile: str | None = None, keyfile: str | None = None, out=None, connection: str | None = None) -> None:
    """Serve the console until interrupted. Off loopback a token is required (made here when not given)."""
    import sys

    import uvicorn

    out = out or sys.stdout
    if not is_loopback(host) and not token:
        token = secrets.token_urlsafe(24)
    app = create_app(root, token, connection)
    scheme = "https" if certfile else "http"
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    url = f"{scheme}://{shown}:{port}/" + (f"?token={token}" if token else "")
    print(f"hospitrust console: {Path(root).resolve()}\n  open {url}" +
          ("\n  (requests without the token get 401)" if token else ""), file=out, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", ssl_certfile=certfile, ssl_keyfile=keyfile)
