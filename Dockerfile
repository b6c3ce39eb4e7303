# fleetmedic: one image for the worker, the executor, the connectors and the demo.
#   docker build -t fleetmedic:0.1.0 .
#   docker run --rm fleetmedic:0.1.0 demo            # the demo needs nothing else
# The NVML exporter needs the NVIDIA container runtime (runtimeClassName: nvidia) or the driver's
# libnvidia-ml.so mounted; nvidia-ml-py is installed here (the `nvml` extra).
# Without a registry (no python:3.11-slim to pull), scripts/build_image.sh --offline-base builds this
# same file with buildah on a base made from Debian packages (BASE and BUILD_PACKAGES below).
ARG BASE=python:3.11-slim
FROM ${BASE} AS build
# a C compiler for the C loops (fleetmedic/models/_columns.c, _baselines.c, connectors/remote_write/_remote_write.c,
# connectors/prometheus/_gpu_record.c, sim/whatif/_shuffle.c); only this stage
# has it (a Debian base adds python3-dev: python:3.11-slim carries Python's headers already)
ARG BUILD_PACKAGES="gcc libc6-dev"
WORKDIR /src
RUN apt-get update && apt-get install -y --no-install-recommends ${BUILD_PACKAGES} && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml setup.py README.md ./
COPY fleetmedic ./fleetmedic
RUN python -m pip install --no-cache-dir --upgrade pip \
 && python -m pip wheel --no-cache-dir --wheel-dir /wheels '.[nvml]'

FROM ${BASE}
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin fleetmedic
COPY --from=build /wheels /wheels
RUN python -m pip install --no-cache-dir --no-index --find-links /wheels 'fleetmedic[nvml]' && rm -rf /wheels \
 && python -c "import fleetmedic.models._columns, fleetmedic.models._baselines"
COPY deploy/config/fleetmedic.yaml /etc/fleetmedic/fleetmedic.yaml
USER 10001
ENV PYTHONUNBUFFERED=1
EXPOSE 9108
ENTRYPOINT ["fleetmedic"]
CMD ["--help"]
