# The gateway as a container: the one-file build (scripts/build-pyz) on a slim Python.
#   docker build -t gateway .
#   docker run -p 8080:8080 -v gateway-data:/data gateway
# The embedded default listens on 0.0.0.0 here (GATEWAY_HOST) and keeps its SQLite
# database and media artifacts in /data. Give your own config with
#   docker run -p 8080:8080 -v gateway-data:/data -v "$PWD/gw.yaml:/etc/gateway/gateway.yaml:ro" \
#       gateway gateway run --config /etc/gateway/gateway.yaml
# (its server.host must be 0.0.0.0 to be reachable from outside the container).

# Stage 1: build dist/gateway.pyz for this image's Python, with the same script as on a host.
FROM python:3.11.14-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml setup.cfg README.md gateway.py ./
COPY config config
COPY plugins plugins
COPY providers providers
COPY scripts/build-pyz scripts/build-pyz
# The wheelhouse lives in a build cache, so rebuilding after a code change downloads nothing.
RUN --mount=type=cache,target=/root/.cache/gateway \
    scripts/build-pyz

# Stage 2: only Python and the one file.
FROM python:3.11.14-slim-bookworm
RUN useradd --create-home --uid 10001 --user-group gateway \
    && mkdir /data \
    && chown gateway:gateway /data
COPY --from=build --chmod=755 /src/dist/gateway.pyz /usr/local/bin/gateway
USER 10001:10001
# SHIV_ROOT: where the archive unpacks its packages, once, at build time (the line below),
# so a container starts as fast as an installed gateway.
ENV GATEWAY_HOST=0.0.0.0 \
    GATEWAY_HOME=/data \
    SHIV_ROOT=/home/gateway/.shiv \
    PYTHONUNBUFFERED=1
RUN gateway --help >/dev/null
VOLUME ["/data"]
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
STOPSIGNAL SIGTERM
CMD ["gateway", "run"]
