# kvharbor container images. Two targets:
#   docker build --target cpu  -t kvharbor:cpu .   (debian:bookworm-slim; host memory, CPU codec)
#   docker build --target cuda -t kvharbor:cuda .  (NVIDIA CUDA 13 runtime; on a GPU, namespace pools
#                                                   in a device arena of 1/16 of its free memory, at
#                                                   most 8 GiB, unless store.device_pool_bytes says
#                                                   otherwise; without one, host memory: docs/operations.md)
#   docker run --rm -p 127.0.0.1:50051:50051 kvharbor:cpu [--pool_bytes=8GiB ...]
#
# The builders run the same scripts as the README and CI (scripts/install_deps.sh,
# scripts/build.sh) and then `cmake --install`; tests/deploy/dockerfile_steps_test.sh
# checks these steps outside Docker (no Docker engine runs on the CI machines).
# The final stages hold only the installed programs, their runtime libraries and a
# non-root user. Configuration: /etc/kvharbor/kvharbord.yaml (deploy/container/
# kvharbord.yaml; mount your own over it); state (disk tier): /var/lib/kvharbor.

ARG BUILD_IMAGE=debian:bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim
ARG CUDA_BUILD_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04

# ---- CPU builder ----
FROM ${BUILD_IMAGE} AS build-cpu
WORKDIR /src
# Dependencies first, so that a source change does not reinstall them.
COPY scripts/install_deps.sh scripts/
RUN bash scripts/install_deps.sh
COPY . .
RUN BUILD_DIR=/build bash scripts/build.sh -DCMAKE_BUILD_TYPE=Release -DKVHARBOR_CUDA=OFF \
      -DKVHARBOR_BUILD_TESTS=OFF -DKVHARBOR_BUILD_BENCH=OFF \
 && cmake --install /build --prefix /opt/kvharbor --strip \
 && bash deploy/container/stage_install.sh /opt/kvharbor

# ---- CPU runtime ----
FROM ${RUNTIME_IMAGE} AS cpu
# The shared libraries kvharbord, kvharbor and libkvharbor_c load (their
# dependencies come with them), and python3-grpcio for kvharbor-healthcheck.
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 libspdlog1.10 libzstd1 \
      libopenblas0 libyaml-cpp0.7 libcpp-httplib0.11 libxxhash0 python3 python3-grpcio \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/kvharbor \
      --create-home --shell /usr/sbin/nologin kvharbor
COPY --from=build-cpu /opt/kvharbor /opt/kvharbor
COPY --from=build-cpu /src/deploy/container/kvharbord.yaml /etc/kvharbor/kvharbord.yaml
ENV PATH=/opt/kvharbor/bin:$PATH \
    KVHARBOR_HEALTH_ADDR=127.0.0.1:50051
USER 10001:10001
WORKDIR /var/lib/kvharbor
# gRPC (KvHarbor, grpc.health.v1, reflection) and Prometheus metrics (/metrics).
EXPOSE 50051 9464
# grpc.health.v1 Check: SERVING while the daemon serves, NOT_SERVING from SIGTERM on.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["kvharbor-healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["kvharbord", "--config=/etc/kvharbor/kvharbord.yaml"]
CMD []

# ---- CUDA builder ----
FROM ${CUDA_BUILD_IMAGE} AS build-cuda
WORKDIR /src
COPY scripts/install_deps.sh scripts/
RUN bash scripts/install_deps.sh
COPY . .
# KVHARBOR_GPU_TIER (on with CUDA) builds the GPU tier plugin, installed as
# /opt/kvharbor/lib/libkvharbor_gpu_tier.so: kvharbord loads it only when the
# container sees a GPU.
RUN BUILD_DIR=/build bash scripts/build.sh -DCMAKE_BUILD_TYPE=Release -DKVHARBOR_CUDA=ON -DKVHARBOR_GPU_TIER=ON \
      -DKVHARBOR_BUILD_TESTS=OFF -DKVHARBOR_BUILD_BENCH=OFF \
 && cmake --install /build --prefix /opt/kvharbor --strip \
 && bash scripts/collect_runtime_libs.sh /opt/kvharbor \
 && bash deploy/container/stage_install.sh /opt/kvharbor

# ---- CUDA runtime ----
# The base image's package set differs from Debian's, so the non-CUDA libraries
# come from the builder (collect_runtime_libs.sh, same Ubuntu release) and the
# CUDA ones from the base image and the NVIDIA container toolkit.
FROM ${CUDA_RUNTIME_IMAGE} AS cuda
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      python3 python3-grpcio \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/kvharbor \
      --create-home --shell /usr/sbin/nologin kvharbor
COPY --from=build-cuda /opt/kvharbor /opt/kvharbor
COPY --from=build-cuda /src/deploy/container/kvharbord.yaml /etc/kvharbor/kvharbord.yaml
ENV PATH=/opt/kvharbor/bin:$PATH \
    LD_LIBRARY_PATH=/opt/kvharbor/lib \
    KVHARBOR_HEALTH_ADDR=127.0.0.1:50051
USER 10001:10001
WORKDIR /var/lib/kvharbor
EXPOSE 50051 9464
# The probe's python3-grpcio loads the base image's gRPC, not /opt/kvharbor/lib.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["env", "-u", "LD_LIBRARY_PATH", "kvharbor-healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["kvharbord", "--config=/etc/kvharbor/kvharbord.yaml"]
CMD []
