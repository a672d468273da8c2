# syntax=docker/dockerfile:1
# infergate's container image: a static binary, CA certificates and a
# nonroot (65532) user on an empty base, no shell. `make image` builds the
# same tree without a Docker engine (deploy/tools/image). Multi-arch:
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg REVISION=$(git rev-parse HEAD) -t ghcr.io/infergate/infergate:$(cat VERSION) .
#
# VERSION must equal the VERSION file (deploy/tools/image/versions_test.go checks).
ARG GO_VERSION=1.26

# The compiler runs on the build machine's platform and cross-compiles, so an
# arm64 image needs no emulation.
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=0.1.0
ARG REVISION=unknown
# The build context has no .git, so the binary cannot read its commit from
# VCS data: the revision comes in through -X.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" \
      -o /rootfs/infergate ./cmd/infergate
RUN mkdir -p /rootfs/etc/ssl/certs /rootfs/home/nonroot /rootfs/tmp \
 && cp /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/ \
 && cp deploy/tools/image/rootfs/etc/passwd deploy/tools/image/rootfs/etc/group /rootfs/etc/ \
 && chmod 0644 /rootfs/etc/passwd /rootfs/etc/group /rootfs/etc/ssl/certs/ca-certificates.crt \
 && chmod 0755 /rootfs/infergate /rootfs/etc /rootfs/etc/ssl /rootfs/etc/ssl/certs /rootfs/home \
 && chown 65532:65532 /rootfs/home/nonroot && chmod 0700 /rootfs/home/nonroot \
 && chmod 1777 /rootfs/tmp

FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
COPY --from=build /rootfs/ /
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
ENTRYPOINT ["/infergate"]
LABEL org.opencontainers.image.title="infergate" \
      org.opencontainers.image.description="Two-tier, GPU-aware router for LLM inference" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/infergate/infergate" \
      org.opencontainers.image.licenses="Apache-2.0"
