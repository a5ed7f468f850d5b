# The train image: veRL 0.9.1 on CUDA torch 2.13.0 + this package; runs `python -m steps.update`.
# Built and pushed with the others (docs/images.md): make images REGISTRY=ghcr.io/openforge TAG=0.1.0, i.e.
#   docker build -f images/train.Dockerfile -t ghcr.io/openforge/train:0.1.0 .
# Pin the base by digest when publishing.
FROM nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
RUN apt-get update && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev git \
    && rm -rf /var/lib/apt/lists/* && python3.12 -m venv /opt/venv
# torch first and pinned by a constraint, so veRL's requirements cannot swap it (and no veRL extra: they pin another torch).
RUN echo "torch==2.13.0" > /tmp/constraints.txt \
    && pip install "torch==2.13.0" \
    && pip install -c /tmp/constraints.txt "verl==0.9.1" "transformers==5.10.4" "pyarrow==26.0.1"
WORKDIR /opt/openforge/app
COPY pyproject.toml README.md ./
COPY steps ./steps
COPY workflows ./workflows
COPY configs ./configs
RUN pip install -c /tmp/constraints.txt . && python -c "import verl, torch; print(verl.__version__, torch.__version__)"
