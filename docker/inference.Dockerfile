# syntax=docker/dockerfile:1.7
# ttsfleet inference server: `ttsfleet serve`. Build from the repository root:
#   docker build -f docker/inference.Dockerfile \
#     -t ghcr.io/ttsfleet/ttsfleet-inference:0.1.0-cuda13.0-torch2.11.0 .
# CUDA base image + a pinned CUDA build of torch: torch 2.11.0 on PyPI (linux x86_64) is the
# CUDA 13.0 build with kernels for sm_90 (H200) and sm_120 (RTX 5090), so FP8 works on both.
# It needs an NVIDIA driver >= 580 on the nodes. Python comes from uv (a standalone CPython
# build), so the image needs no apt packages at all.

FROM ghcr.io/astral-sh/uv:0.13.9 AS uv

FROM nvidia/cuda:13.0.2-base-ubuntu24.04 AS build
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_PYTHON_PREFERENCE=only-managed \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1
RUN uv python install 3.11.14 \
    && uv venv --python 3.11.14 /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY ttsfleet/ ttsfleet/
COPY operator/ operator/
COPY inference/ inference/
COPY kernels/ kernels/
COPY fill_jobs/ fill_jobs/
COPY slurm/ slurm/
COPY devtools/ devtools/
# Fail the build unless torch is the pinned CUDA build with FP8 dtypes and both GPU archs.
RUN uv pip install --python /opt/venv/bin/python "torch==2.11.0" ".[inference]" \
    && /opt/venv/bin/python -c "import torch; \
assert torch.__version__.startswith('2.11.0'), torch.__version__; \
assert (torch.version.cuda or '').startswith('13.'), torch.version.cuda; \
flags = torch._C._cuda_getArchFlags(); \
assert 'sm_90' in flags and 'sm_120' in flags, flags; \
assert hasattr(torch, 'float8_e4m3fn') and hasattr(torch, '_scaled_mm')" \
    && /opt/venv/bin/ttsfleet serve --help > /dev/null

FROM nvidia/cuda:13.0.2-base-ubuntu24.04
LABEL org.opencontainers.image.title="ttsfleet-inference" \
      org.opencontainers.image.description="ttsfleet FP8 TTS inference server (CUDA 13.0, torch 2.11.0)" \
      org.opencontainers.image.licenses="Apache-2.0"
# Triton (the FP8 GEMM / fused MLP kernels) compiles its small C launchers with `cc` on first
# use: a C compiler and libc headers have to be in the image. libc6-dev is pinned to the base
# image's own libc6; bump GCC_VERSION if Ubuntu's archive moves on.
ARG GCC_VERSION=4:13.2.0-7ubuntu1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN apt-get update \
    && apt-get install -y --no-install-recommends "gcc=${GCC_VERSION}" \
       "libc6-dev=$(dpkg-query --showformat='${Version}' --show libc6)" \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 ttsfleet \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin ttsfleet
COPY --from=build /opt/python /opt/python
COPY --from=build /opt/venv /opt/venv
# Read-only root filesystem: every cache torch/triton write goes to /tmp (an emptyDir in the pod).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    TRITON_CACHE_DIR=/tmp/triton \
    TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor \
    TTSFLEET_PORT=8000
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["ttsfleet", "serve"]
