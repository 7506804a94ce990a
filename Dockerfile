# syntax=docker/dockerfile:1
# Stage 1: build the wheel, compiling the Cython kernels.
FROM python:3.11-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY fairshare ./fairshare
COPY fairshare_cli ./fairshare_cli
COPY webhook ./webhook
COPY extender ./extender
COPY serving ./serving
COPY _native ./_native
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# Stage 2: the runtime: the wheel and its dependencies only, no compiler, non-root.
FROM python:3.11-slim
RUN useradd --system --uid 10001 --no-create-home fairshare
COPY --from=build /wheels /wheels
# The servers' modules import from the installed wheel (tests/packaging runs this same
# wheel without Docker), and the kernels are the compiled ones.
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && cd / && python -c "import fairshare_cli.main, webhook.app, extender.serve, extender.reclaimer" \
    && python -c "import _native; assert _native.IMPLEMENTATION == 'c', _native.IMPLEMENTATION"
USER 10001
ENTRYPOINT ["fairshare"]
CMD ["--help"]
