# The harness image: Node 24 and every pinned npm harness (steps/harnesses/*.py: VERSION), under
# /opt/openforge/harnesses/<name>-<version> and node-<version>, and browser-use's virtualenv,
# browser-use-<version>. It runs nothing itself: the rollout pod's init container copies the harness it needs
# into the shared emptyDir (workflows/iteration.py). Chromium is the task image's (images/gui-task/Dockerfile).
# Built and pushed with the others (docs/images.md): make images REGISTRY=ghcr.io/openforge TAG=0.1.0, i.e.
#   docker build -f images/harness.Dockerfile -t ghcr.io/openforge/harness:0.1.0 .
FROM node:24.22.3-bookworm-slim AS install
# bookworm's python3 is 3.11, which `steps.harnesses` needs; npm installs run on the pinned Node it installs.
RUN apt-get update && apt-get install -y --no-install-recommends python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
ENV OPENFORGE_CACHE=/opt/openforge
WORKDIR /opt/openforge/app
COPY steps ./steps
# The shell harnesses (`direct` among them is built in: nothing to install).
RUN python3 -m steps.harnesses install $(python3 -c "from steps.harnesses import HARNESSES; print(*HARNESSES)")

# browser-use is a PyPI package in its own virtualenv, whose base is the Python that runs OpenForge in the
# rollout pod: the steps image's /usr/local, which the pod has at /openforge/python. So the virtualenv is built
# here on that very Python (this base must stay images/steps.Dockerfile's), copied to that path, and at the
# path the pod gets it (/openforge/harnesses), so that every path it holds is right there.
FROM python:3.11.14-slim-bookworm AS gui
ENV OPENFORGE_CACHE=/openforge LD_LIBRARY_PATH=/openforge/python/lib PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN mkdir -p /openforge/python && cp -a /usr/local/. /openforge/python/
WORKDIR /opt/openforge/app
COPY steps ./steps
RUN /openforge/python/bin/python3 -c "from steps.harnesses import GUI_HARNESSES, default_prefix; \
[print(name, harness.install(default_prefix(name, harness.VERSION))) for name, harness in GUI_HARNESSES.items() \
 if getattr(harness, 'PIP_PACKAGE', None)]"

# Small final image: the installs plus the sh/cp/mkdir the init container runs.
FROM debian:bookworm-slim
COPY --from=install /opt/openforge/harnesses /opt/openforge/harnesses
COPY --from=gui /openforge/harnesses /opt/openforge/harnesses
