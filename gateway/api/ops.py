"""Operator routes: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

import sys

import orjson
from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from gateway.api.openai import ServicesDep
from gateway.metrics import render
from gateway.readiness import readiness

router = APIRouter()


@router.get("/health")
async def health() -> Response:
    """Liveness: the process serves requests."""
    return Response(b'{"status":"ok"}', media_type="application/json")


@router.get("/ready")
async def ready(svc: ServicesDep) -> Response:
    """Readiness and what is degraded; 503 only when no call can be served (readiness.py)."""
    serving, body = await readiness(svc)
    status = 200 if serving else 503
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


@router.get("/metrics")
async def metrics(svc: ServicesDep) -> Response:
    """Prometheus exposition; the index and the heap are measured here, off the request path."""
    svc.metrics.index_size.set(await svc.index.size())
    svc.keys.stale()  # sets its gauges
    svc.metrics.python_blocks.set(sys.getallocatedblocks())
    text = render(svc.registry, svc.settings.metrics_multiproc_dir)
    return Response(text, media_type=CONTENT_TYPE_LATEST)
