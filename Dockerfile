# Cistern images, one multi-stage build:
#   docker build --target node       -t cistern/node:dev .                 # csi-driver + storagepool-sidecar
#   docker build --target controller -t cistern/workload-controller:dev .  # workload-controller
# `make images` builds both.
ARG GO_VERSION=1.26

# The binaries are static but the csi-driver, which reads NFSv4 datasets through libnfs (cgo,
# -tags libnfs): it links bookworm's libc and libnfs, which the node stage installs.
FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnfs-dev \
 && rm -rf /var/lib/apt/lists/*
ENV GOFLAGS=-mod=readonly CGO_ENABLED=0
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/root/go/pkg/mod go mod download
COPY cmd/ cmd/
COPY pkg/ pkg/
ARG VERSION=dev
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/ ./cmd/storagepool-sidecar ./cmd/workload-controller \
 && CGO_ENABLED=1 go build -tags libnfs -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/ ./cmd/csi-driver

# The node plugin formats, checks and grows filesystems and attaches loop devices: it needs
# e2fsprogs, xfsprogs and util-linux (losetup, mount, blkid); libnfs13 for NFSv4 datasets. It
# runs privileged, as root.
FROM debian:bookworm-slim AS node
RUN apt-get update \
 && apt-get install -y --no-install-recommends e2fsprogs xfsprogs util-linux mount ca-certificates libnfs13 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/csi-driver /out/storagepool-sidecar /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/csi-driver"]

# The controller needs nothing but its binary and runs as a non-root user.
FROM gcr.io/distroless/static-debian12:nonroot AS controller
COPY --from=build /out/workload-controller /usr/local/bin/workload-controller
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/workload-controller"]
