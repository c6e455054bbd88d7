# Tessera's image for those who build with Docker (BuildKit):
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=0.1.0 -t REGISTRY/tessera:0.1.0 --push .
#
# The same content as `make images` (hack/images, the reference build:
# reproducible, no daemon): tessera and the limiter library, cross-built
# with Debian's compilers, over the glibc libraries they load from Debian
# 12's libc6, an /etc/passwd with nonroot (65532), no shell. The digest is
# not `make images`' (other tar metadata).

# The build runs on the builder's platform and cross-compiles.
FROM --platform=$BUILDPLATFORM golang:1.26-bookworm AS build
ARG TARGETARCH
ARG VERSION=0.1.0
ARG K8S_VERSION=v1.36.3
RUN apt-get update && apt-get install -y --no-install-recommends \
      gcc-aarch64-linux-gnu libc6-dev-arm64-cross gcc-x86-64-linux-gnu libc6-dev-amd64-cross make && \
    rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN case "$TARGETARCH" in amd64) cc=x86_64-linux-gnu-gcc ;; arm64) cc=aarch64-linux-gnu-gcc ;; \
      *) echo "unsupported TARGETARCH $TARGETARCH" >&2; exit 1 ;; esac && \
    minor=$(echo "$K8S_VERSION" | cut -d. -f2) && \
    CGO_ENABLED=1 GOOS=linux GOARCH=$TARGETARCH CC=$cc CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" \
      go build -trimpath -buildvcs=false -tags netgo,osusergo -ldflags "-s -w \
        -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 \
        -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean \
        -X github.com/tessera-gpu/tessera/internal/version.Version=v$VERSION" \
      -o /out/usr/local/bin/tessera ./cmd/tessera && \
    CGO_ENABLED=1 GOOS=linux GOARCH=$TARGETARCH CC=$cc go build -trimpath -buildvcs=false -ldflags "-s -w" \
      -o /out/usr/local/lib/tessera/tessera-hook ./cmd/tessera-hook && \
    make -C limiter B=/tmp/limiter CC=$cc EXTRA_CFLAGS=-ffile-prefix-map=/src=. && \
    install -D -m 644 /tmp/limiter/libtessera-limiter.so /out/usr/local/lib/tessera/libtessera-limiter.so && \
    mkdir -p /out/etc /out/tmp /out/home/nonroot && chmod 1777 /out/tmp && chown 65532:65532 /out/home/nonroot && \
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >/out/etc/passwd && \
    printf 'root:x:0:\nnonroot:x:65532:\n' >/out/etc/group

# glibc of the target architecture, from Debian 12's libc6.
FROM debian:bookworm-slim AS libc
RUN set -e; case "$(dpkg --print-architecture)" in amd64) t=x86_64-linux-gnu ;; arm64) t=aarch64-linux-gnu ;; esac; \
    mkdir -p /out/lib/$t /out/usr/share/doc/libc6 /out/var/lib/dpkg/status.d; \
    for l in ld-linux-x86-64.so.2 ld-linux-aarch64.so.1 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1; do \
      [ ! -e /lib/$t/$l ] || cp -a /lib/$t/$l /out/lib/$t/; done; \
    if [ -e /lib64/ld-linux-x86-64.so.2 ]; then mkdir -p /out/lib64 && cp -a /lib64/ld-linux-x86-64.so.2 /out/lib64/; fi; \
    if [ -e /lib/ld-linux-aarch64.so.1 ]; then cp -a /lib/ld-linux-aarch64.so.1 /out/lib/; fi; \
    cp /usr/share/doc/libc6/copyright /out/usr/share/doc/libc6/; \
    dpkg-query -s libc6 >/out/var/lib/dpkg/status.d/libc6

FROM scratch
ARG VERSION=0.1.0
COPY --from=libc /out/ /
COPY --from=build /out/ /
ENV PATH=/usr/local/bin:/usr/bin:/bin
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tessera"]
LABEL org.opencontainers.image.title="tessera" \
      org.opencontainers.image.description="Tessera, GPU sharing for Kubernetes: scheduler, admission webhook, node agent and the GPU limiter library" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.source="https://github.com/tessera-gpu/tessera" \
      org.opencontainers.image.url="https://github.com/tessera-gpu/tessera" \
      org.opencontainers.image.licenses="Apache-2.0"
