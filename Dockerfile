# Rivora's image: one image, every binary (rivorad, rivoractl,
# rivora-controller, rivora-doctor, rivora), built the way `make` builds
# them on any machine: scripts/deps.sh for the Debian packages the build
# needs (clang, llvm, libelf-dev, zlib1g-dev, pkg-config, bpftool, ...),
# then cargo build --release. The chart runs each component by its
# command (helm/templates/: rivorad, rivora-controller, rivora-doctor).
#
#   docker build -t REGISTRY/rivora:0.1.0 .      (or podman, buildah, kaniko)
#   docker push REGISTRY/rivora:0.1.0
#   rivora install --set image.repository=REGISTRY/rivora
#
# The tag is the workspace's version (Cargo.toml), which is also the
# chart's appVersion and so its default image tag.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM docker.io/library/rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
WORKDIR /src
# The build's own dependencies first (a layer that changes only with the
# script), then the sources.
COPY scripts/deps.sh scripts/deps.sh
RUN scripts/deps.sh
COPY . .
RUN cargo build --release --bins --locked

FROM docker.io/library/debian:${DEBIAN_RELEASE}-slim
# rivorad links libbpf statically and libelf and zlib dynamically; the
# others need only libc.
RUN apt-get update \
	&& apt-get install -y --no-install-recommends libelf1 zlib1g ca-certificates \
	&& rm -rf /var/lib/apt/lists/*
COPY --from=build \
	/src/target/release/rivorad \
	/src/target/release/rivoractl \
	/src/target/release/rivora-controller \
	/src/target/release/rivora-doctor \
	/src/target/release/rivora \
	/usr/local/bin/
# Each pod says what to run (the chart's command:); rivoractl by default,
# for `kubectl exec ... -- rivoractl status`.
CMD ["rivoractl", "--help"]
