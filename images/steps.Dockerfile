# The steps image: slim Python + this package. Runs `plan`, `trajectories`, the exit handler
# (`steps.manifest record`, `steps.report`), the serve step in front of an existing endpoint (`steps.serve
# --upstream`: the proxy alone), and is the source the rollout pod's init container copies OpenForge from
# (/usr/local: Python with the package and its dependencies; /opt/openforge/app: the repository, tasks included).
# Built and pushed with the others (docs/images.md): make images REGISTRY=ghcr.io/openforge TAG=0.1.0, i.e.
#   docker build -f images/steps.Dockerfile -t ghcr.io/openforge/steps:0.1.0 .
# Pin the base by digest when publishing (docker buildx imagetools inspect python:3.11.14-slim-bookworm).
FROM python:3.11.14-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/openforge/app
COPY pyproject.toml README.md ./
COPY steps ./steps
COPY workflows ./workflows
COPY configs ./configs
# Not editable: the package lands in /usr/local's site-packages, which the rollout init container copies.
# pyarrow: the trajectories step's tables (Parquet). openai: the `direct` harness's client; anthropic and
# playwright: the `computer-use` harness's (Playwright drives the task image's /usr/bin/chromium and downloads no
# browser). Both harnesses run on this Python (copied into the rollout pod) as the agent. The tracking extra: the
# driver pod (`--detach`) logs to the run's `trackers` (W&B, MLflow, TensorBoard; docs/tracking.md).
RUN pip install ".[tracking]" "pyarrow==26.0.1" "openai==3.57.0" "anthropic==2.15.0" "playwright==1.65.2" \
    && python -c "import steps.plan, steps.manifest, steps.rollout, steps.sandbox.pod, steps.serve, openai, anthropic" \
    && python -c "import playwright.sync_api" && python -c "import wandb, mlflow, tensorboard"
