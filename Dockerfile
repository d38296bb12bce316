# bert-heads service image: the service only (no torch, no training code), non-root.
#   docker build -t bert-heads:local .                      # CPU (default target: runtime)
#   docker build --build-arg ORT_EXTRA=gpu --target gpu -t bert-heads:local-gpu .
#       (CUDA 13 / cuDNN 9 from the onnxruntime-gpu[cuda,cudnn] wheels, loaded by
#        onnxruntime.preload_dlls() at start-up: no CUDA base image needed)
# Models are not baked in: mount a model repository at /models (see docker-compose.yml).
ARG BASE_IMAGE=python:3.11-slim

# --- build: a virtualenv with the service and exactly one ONNX Runtime -----------------------
FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/service.txt ./requirements/service.txt
COPY heads ./heads
COPY service ./service
# Exactly one ONNX Runtime: cpu (onnxruntime) or gpu (onnxruntime-gpu). A build arg rather than
# a separate stage, so that the classic builder (no BuildKit) never builds the CUDA one for CPU.
ARG ORT_EXTRA=cpu
# requirements/service.txt pins every runtime dependency (audited in CI: make audit); as
# constraints, so onnxruntime-gpu, which it does not name, still installs for the gpu target.
RUN pip install --upgrade pip && pip install -c requirements/service.txt ".[${ORT_EXTRA}]" && pip check

# --- runtime images ---------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS base-runtime
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin bert
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    BERT_HEADS_HOST=0.0.0.0 \
    BERT_HEADS_PORT=8080 \
    BERT_HEADS_MODEL_DIR=/models
EXPOSE 8080
USER 10001:10001
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/ready', timeout=2)"]
ENTRYPOINT ["python", "-m", "service"]

FROM base-runtime AS gpu
COPY --from=build /opt/venv /opt/venv
# Fail the build, not the first start, when the build stage installed the CPU wheel.
RUN python -c "import onnxruntime as o, sys; sys.exit(0 if 'CUDAExecutionProvider' in o.get_available_providers() else 'the gpu target needs --build-arg ORT_EXTRA=gpu')"
ENV BERT_HEADS_DEVICE=cuda

FROM base-runtime AS runtime
COPY --from=build /opt/venv /opt/venv
