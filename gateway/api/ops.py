"""Operator routes: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

import orjson
from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from gateway.api.openai import ServicesDep
from gateway.metrics import render

router = APIRouter()


@router.get("/health")
async def health() -> Response:
    """Liveness: the process serves requests."""
    return Response(b'{"status":"ok"}', media_type="application/json")


@router.get("/ready")
async def ready(svc: ServicesDep) -> Response:
    """Readiness: every model has a healthy backend and the stores answer."""
    models = {name: sum(b.healthy for b in m.backends) for name, m in svc.backends.models.items()}
    ok = all(models.values())
    body = {"status": "ready" if ok else "unavailable", "healthy_backends": models}
    return Response(orjson.dumps(body), status_code=200 if ok else 503,
                    media_type="application/json")  # fmt: skip


@router.get("/metrics")
async def metrics(svc: ServicesDep) -> Response:
    """Prometheus exposition; the index is measured here, off the request path."""
    svc.metrics.index_size.set(await svc.index.size())
    text = render(svc.registry, svc.settings.metrics_multiproc_dir)
    return Response(text, media_type=CONTENT_TYPE_LATEST)
