# One image for every guestbackup process: the controller, the webhook, the
# server pod's helper (guestbackup-server), what restore Jobs run
# (guestbackup-restore) and kopia, all static, built from
# the module versions this repository pins.
#
#   docker build -t guestbackup:dev .
#
# The server pods run /usr/local/bin/kopia and /usr/local/bin/guestbackup-server
# from it (see pkg/kopiaserver/workload.go); the chart runs controller and
# webhook. The base image runs as a non-root user and sets no other UID
# requirement, so OpenShift's restricted SCC may assign its own.
ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-mod=readonly
# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
COPY hack/tools/kopia/go.mod hack/tools/kopia/go.sum hack/tools/kopia/
RUN go mod download && cd hack/tools/kopia && go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY internal/ internal/
COPY pkg/ pkg/
COPY hack/tools/kopia/ hack/tools/kopia/
RUN for cmd in controller webhook; do \
		go build -trimpath -ldflags=-s -o /out/$cmd ./cmd/$cmd || exit 1; \
	done && \
	go build -trimpath -ldflags=-s -o /out/guestbackup-server ./cmd/server && \
	go build -trimpath -ldflags=-s -o /out/guestbackup-restore ./cmd/restore && \
	cd hack/tools/kopia && go build -trimpath -ldflags=-s -o /out/kopia github.com/kopia/kopia && \
	GOARCH=arm64 go build -trimpath -ldflags=-s -o /out/kopia-linux-arm64 github.com/kopia/kopia

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/controller /out/webhook /out/guestbackup-server /out/guestbackup-restore /out/kopia /usr/local/bin/
# Server pods hand guests the kopia client of their own image: this one to
# arm64 guests, /usr/local/bin/kopia to amd64 ones (pkg/serverpod/clientserver).
COPY --from=build /out/kopia-linux-arm64 /usr/local/share/guestbackup/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/controller"]
