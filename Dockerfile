# syntax=docker/dockerfile:1
#
# edgepipe: exporter, rtld-receiver and platform-sim in one small image.
#
#   docker build --build-arg VERSION=$(make -s version) \
#                --build-arg REVISION=$(git rev-parse HEAD) -t edgepipe .
#   docker run --rm -p 9780:9780 edgepipe                       # exporter --simulate
#   docker run --rm -p 9781:9781 --entrypoint /usr/local/bin/rtld-receiver edgepipe --simulate
#
# `make image` builds the same image without Docker or a network (from the
# binaries of `make build`, Debian's CA certificates and tzdata, and
# distroless's users; internal/ociimage), which is what CI builds, runs and
# the Helm chart deploys; internal/deploytest checks the two agree: the
# binaries' paths, user, working directory, entrypoint, ports, labels, and
# the spool and state directories.
#
# The binaries are built exactly as `make build` builds them: static
# (CGO_ENABLED=0), -trimpath, -ldflags "-s -w -X …" with the same version
# variables; without --build-arg VERSION the stamp is v<the VERSION file>, as
# `make build`'s without a git tag (internal/deploytest checks the two stay
# in step). The image's version label is set only from the build argument.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION=
ARG REVISION=unknown
ARG BUILDDATE=unknown
ENV CGO_ENABLED=0 GOFLAGS=-buildvcs=false
# Dependencies first: this layer is cached until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    set -e; \
    VERSION=${VERSION:-v$(cat VERSION)}; \
    PVPKG=github.com/prometheus/common/version; \
    for cmd in exporter rtld-receiver platform-sim; do \
        GOOS=$TARGETOS GOARCH=$TARGETARCH CGO_ENABLED=0 go build -trimpath \
            -ldflags "-s -w \
                -X $PVPKG.Version=$VERSION -X $PVPKG.Revision=$REVISION -X $PVPKG.BuildDate=$BUILDDATE" \
            -o /out/$cmd ./cmd/$cmd; \
    done; \
    mkdir -p /out/data/spool /out/data/state; \
    chmod 0700 /out/data/spool /out/data/state

# distroless static: CA certificates, tzdata, /etc/passwd with the nonroot
# user (65532), no shell, no package manager.
FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=
ARG REVISION=unknown
LABEL org.opencontainers.image.title="edgepipe" \
      org.opencontainers.image.description="CDN metrics and real-time access logs to Prometheus, OpenTelemetry, ClickHouse and Kafka" \
      org.opencontainers.image.source="https://github.com/edgepipe/edgepipe" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /out/exporter /out/rtld-receiver /out/platform-sim /usr/local/bin/
# Where the Helm chart mounts the receiver's spool and the exporter's
# --state.dir: the nonroot user's, so that a named volume mounted there
# (which takes its owner from the image) is writable.
COPY --from=build --chown=65532:65532 /out/data/ /var/lib/edgepipe/
USER 65532:65532
# The nonroot user's home: relative paths such as the receiver's default
# --spool.dir=./data/spool land here (mount a volume for durability).
WORKDIR /home/nonroot
# exporter, rtld-receiver
EXPOSE 9780 9781
ENTRYPOINT ["/usr/local/bin/exporter"]
CMD ["--simulate"]
