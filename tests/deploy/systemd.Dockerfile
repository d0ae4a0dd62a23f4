# The image of tests/deploy/test_systemd_e2e.sh: Debian 12 booting systemd, with Tessera
# built from this tree and put in place by `meson install` (binaries in /usr/bin, the units
# in /usr/lib/systemd/system, the example job file in /etc/tessera), as an operator would
# on a host. Built from the repository root on the base image of tests/deploy/docker_env.sh.
ARG DEBIAN=debian:bookworm-slim
FROM ${DEBIAN}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      systemd systemd-sysv \
      meson ninja-build pkg-config gcc libc6-dev protobuf-c-compiler libprotobuf-c-dev \
      libuv1-dev libopenblas-dev libconfig-dev libsodium-dev libssl-dev zlib1g-dev libcjson-dev \
      libmicrohttpd-dev libsystemd-dev dataset-fashion-mnist \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN meson setup /build --prefix=/usr -Dbuildtype=release -Dtests=disabled -Dcuda=disabled \
      -Dsystemd=enabled \
    && meson compile -C /build \
    && meson install -C /build
# systemd stops on SIGRTMIN+3, not on docker's SIGTERM.
STOPSIGNAL SIGRTMIN+3
CMD ["/sbin/init"]
