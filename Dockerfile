# kvharbor container images. Two targets:
#   docker build --target cpu -t kvharbor:cpu .    (debian:bookworm-slim, host memory, CPU codec)
#   docker build --target cuda -t kvharbor:cuda .  (NVIDIA CUDA 13 runtime, GPU codec)
# The build runs the same scripts as the README and CI (scripts/install_deps.sh,
# scripts/build.sh), so CI exercises the same steps.

# ---- CPU build ----
FROM debian:bookworm AS build-cpu
WORKDIR /src
COPY scripts/install_deps.sh scripts/
RUN bash scripts/install_deps.sh
COPY . .
RUN BUILD_DIR=/build bash scripts/build.sh -DKVHARBOR_CUDA=OFF -DKVHARBOR_BUILD_TESTS=OFF \
      -DKVHARBOR_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Release \
 && cmake --install /build --prefix /opt/kvharbor --strip

FROM debian:bookworm-slim AS cpu
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 libspdlog1.10 libxxhash0 \
      libzstd1 libopenblas0 libyaml-cpp0.7 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home /var/lib/kvharbor --create-home kvharbor
COPY --from=build-cpu /opt/kvharbor /opt/kvharbor
ENV PATH=/opt/kvharbor/bin:$PATH LD_LIBRARY_PATH=/opt/kvharbor/lib
USER kvharbor
EXPOSE 50051
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s \
  CMD ["kvharbor", "--addr=127.0.0.1:50051", "--timeout_ms=2000", "stats"]
ENTRYPOINT ["kvharbord", "--listen=0.0.0.0:50051"]

# ---- CUDA build ----
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04 AS build-cuda
WORKDIR /src
COPY scripts/install_deps.sh scripts/
RUN bash scripts/install_deps.sh
COPY . .
RUN BUILD_DIR=/build bash scripts/build.sh -DKVHARBOR_CUDA=ON -DKVHARBOR_BUILD_TESTS=OFF \
      -DKVHARBOR_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Release \
 && cmake --install /build --prefix /opt/kvharbor --strip \
 && bash /src/scripts/collect_runtime_libs.sh /opt/kvharbor

FROM nvidia/cuda:13.0.0-runtime-ubuntu24.04 AS cuda
RUN useradd --system --uid 10001 --home /var/lib/kvharbor --create-home kvharbor
COPY --from=build-cuda /opt/kvharbor /opt/kvharbor
ENV PATH=/opt/kvharbor/bin:$PATH LD_LIBRARY_PATH=/opt/kvharbor/lib
USER kvharbor
EXPOSE 50051
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s \
  CMD ["kvharbor", "--addr=127.0.0.1:50051", "--timeout_ms=2000", "stats"]
ENTRYPOINT ["kvharbord", "--listen=0.0.0.0:50051"]
