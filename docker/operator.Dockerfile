# syntax=docker/dockerfile:1.7
# ttsfleet operator: `ttsfleet operator run` (kopf). Build from the repository root:
#   docker build -f docker/operator.Dockerfile -t ghcr.io/ttsfleet/ttsfleet-operator:0.1.0 .
# Small: python slim, only the `operator` extra (kopf, kubernetes), no compilers in the image.

FROM python:3.11.14-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY ttsfleet/ ttsfleet/
COPY operator/ operator/
COPY inference/ inference/
COPY kernels/ kernels/
COPY fill_jobs/ fill_jobs/
COPY slurm/ slurm/
COPY devtools/ devtools/
RUN pip install --no-cache-dir "./[operator]" \
    && ttsfleet operator --help > /dev/null

FROM python:3.11.14-slim-bookworm
LABEL org.opencontainers.image.title="ttsfleet-operator" \
      org.opencontainers.image.description="ttsfleet Kubernetes operator (kopf): TTSDeployment and FillJob" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 ttsfleet \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin ttsfleet
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 8080 8081
ENTRYPOINT ["ttsfleet", "operator", "run"]
CMD ["--metrics-port", "8080", "--health-port", "8081"]
