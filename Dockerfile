# syntax=docker/dockerfile:1
# One image for every nodefabric component: `nodefabric agent | operator | extender | crd apply | ...`.
# Build it with `make image` (docker build; BuildKit is needed for the bind mount below).

# The official Python image, pinned by the digest of its multi-arch index (linux/amd64 and linux/arm64:
# Grace Hopper / Blackwell nodes are arm64), so a rebuild gets the same base until this line changes.
# python:3.11-slim as of 2026-08 (3.11.16, Debian trixie); requires-python in pyproject.toml is >=3.11.
ARG PYTHON_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

# Build stage: the project's wheel and the wheels of all its dependencies, so the final stage installs
# offline and carries no compiler, pip cache or source tree.
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
COPY pyproject.toml README.md ./
COPY devicemanager ./devicemanager
COPY deviceplugin ./deviceplugin
COPY operator ./operator
RUN python -m pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG PYTHON_IMAGE
ARG VERSION=dev
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# libudev1: pyudev loads it to hear the kernel's uevents (the agent runs on periodic passes without it).
# No libnvidia-ml here, on purpose: NVML must match the node's kernel driver, so it comes from the node,
# through the NVIDIA runtime (agent.runtimeClassName, NVIDIA_VISIBLE_DEVICES) or a driver-root mount
# (agent.driverRoot -> NVIDIA_DRIVER_ROOT). Ascend's libdcmi likewise comes from the node.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libudev1 \
    && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links=/wheels nodefabric \
    && nodefabric --help >/dev/null
LABEL org.opencontainers.image.title="nodefabric" \
      org.opencontainers.image.description="Kubernetes device manager for GPU clusters" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/gpustack/nodefabric" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
# Non-root by default: the operator, the extender and the CRD job run as this user. The agent's pod
# overrides it to root (runAsUser: 0, every capability dropped) because kubelet's device-plugin directory
# is root-owned.
USER 65532:65532
ENTRYPOINT ["nodefabric"]
CMD ["--help"]
