# syntax=docker/dockerfile:1
# One image for every nodefabric component: `nodefabric agent | operator | extender | ...`.

# Build stage: the project's wheel and the wheels of all its dependencies, so the final stage installs
# offline and carries no compiler, pip cache or source tree.
FROM python:3.11-slim AS build
WORKDIR /src
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
COPY pyproject.toml README.md ./
COPY devicemanager ./devicemanager
COPY deviceplugin ./deviceplugin
COPY operator ./operator
RUN python -m pip wheel --wheel-dir /wheels .

FROM python:3.11-slim
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# libudev1: pyudev loads it to hear the kernel's uevents (the agent runs on periodic passes without it).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libudev1 \
    && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links=/wheels nodefabric \
    && nodefabric --help >/dev/null
LABEL org.opencontainers.image.title="nodefabric" \
      org.opencontainers.image.description="Kubernetes device manager for GPU clusters" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/gpustack/nodefabric"
# Non-root by default: the operator and the extender run as this user. The agent's pod overrides it to
# root (runAsUser: 0, every capability dropped) because kubelet's device-plugin directory is root-owned.
USER 65532:65532
ENTRYPOINT ["nodefabric"]
CMD ["--help"]
