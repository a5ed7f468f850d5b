# The serve image: vLLM 0.33 (CUDA) + this package; runs `python -m steps.serve` (vLLM + recording proxy).
# Built and pushed with the others (docs/images.md): make images REGISTRY=ghcr.io/openforge TAG=0.1.0, i.e.
#   docker build -f images/serve.Dockerfile -t ghcr.io/openforge/serve:0.1.0 .
# Pin the base by digest when publishing.
FROM vllm/vllm-openai:v0.33.0

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
WORKDIR /opt/openforge/app
COPY pyproject.toml README.md ./
COPY steps ./steps
COPY workflows ./workflows
# The base image's vLLM stays as it is: install only this package and what it needs beyond vLLM.
RUN python3 -m pip install . "vllm==0.33.0" \
    && { command -v python >/dev/null || ln -s "$(command -v python3)" /usr/local/bin/python; } \
    && python -c "import vllm, steps.serve; assert vllm.__version__.startswith('0.33.'), vllm.__version__"
ENTRYPOINT []
