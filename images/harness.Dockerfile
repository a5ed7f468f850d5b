# The harness image: Node 24 and every pinned npm harness (steps/harnesses/*.py: VERSION), under
# /opt/openforge/harnesses/<name>-<version> and node-<version>. It runs nothing itself: the rollout
# pod's init container copies the harness it needs into the shared emptyDir (workflows/iteration.py).
#   docker build -f images/harness.Dockerfile -t ghcr.io/openforge/harness:0.1.0 .
FROM node:24.22.3-bookworm-slim AS install
# bookworm's python3 is 3.11, which `steps.harnesses` needs; npm installs run on the pinned Node it installs.
RUN apt-get update && apt-get install -y --no-install-recommends python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
ENV OPENFORGE_CACHE=/opt/openforge
WORKDIR /opt/openforge/app
COPY steps ./steps
RUN python3 -m steps.harnesses install --all

# Small final image: the installs plus the sh/cp/mkdir the init container runs.
FROM debian:bookworm-slim
COPY --from=install /opt/openforge/harnesses /opt/openforge/harnesses
