# The gateway image; the same image runs the simulator (`gateway sim`) in docker-compose.yml.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY migrations ./migrations
# Editable: `gateway migrate` finds migrations/ beside the package in the source tree.
RUN pip install -e . \
    && useradd --system --uid 10001 --home-dir /var/lib/gateway gateway \
    && mkdir -p /var/lib/gateway/spool \
    && chown -R gateway /var/lib/gateway

USER gateway
WORKDIR /var/lib/gateway
EXPOSE 8080
ENTRYPOINT ["gateway"]
CMD ["serve", "--config", "/etc/gateway/gateway.yaml"]
