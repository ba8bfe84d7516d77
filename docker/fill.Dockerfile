# syntax=docker/dockerfile:1.7
# ttsfleet fill job: `ttsfleet fill run` (checkpointable, preemptible data cleaning). Build from
# the repository root:
#   docker build -f docker/fill.Dockerfile -t ghcr.io/ttsfleet/ttsfleet-fill:0.1.0 .
# The cleaning stages run on CPU, so torch is the (much smaller) pinned CPU wheel. ffmpeg is the
# decoder of last resort for formats libsndfile cannot read.

FROM python:3.11.14-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==2.11.0+cpu"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY ttsfleet/ ttsfleet/
COPY operator/ operator/
COPY inference/ inference/
COPY kernels/ kernels/
COPY fill_jobs/ fill_jobs/
COPY slurm/ slurm/
COPY devtools/ devtools/
RUN pip install --no-cache-dir "./[fill]" \
    && python -c "import torch; assert torch.__version__ == '2.11.0+cpu', torch.__version__" \
    && ttsfleet fill --help > /dev/null

FROM python:3.11.14-slim-bookworm
LABEL org.opencontainers.image.title="ttsfleet-fill" \
      org.opencontainers.image.description="ttsfleet fill job: preemptible TTS data cleaning" \
      org.opencontainers.image.licenses="Apache-2.0"
ARG FFMPEG_VERSION=7:5.1.9-0+deb12u1
RUN apt-get update \
    && apt-get install -y --no-install-recommends "ffmpeg=${FFMPEG_VERSION}" \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 ttsfleet \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin ttsfleet
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache
USER 10001:10001
# Arguments are the run options: --input MANIFEST --output DIR --checkpoint DIR [--shard I/N].
ENTRYPOINT ["ttsfleet", "fill", "run"]
CMD ["--help"]
