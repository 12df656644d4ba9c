// Package ociimage assembles edgepipe's container image from the static
// binaries `make build` produced, without a container engine, a base image
// or a network: the binaries, Debian's CA certificates and time zone data,
// the users and directories of distroless's static "nonroot" image (which the
// Dockerfile builds on), and the Dockerfile's configuration (user 65532,
// working directory, entrypoint, ports, OCI labels). `make image` runs it
// through cmd/build-image and loads the result with podman; the Helm chart
// deploys it.
//
// The image has two layers, the base (users, directories, certificates,
// zone data) and the binaries, so a new release changes only the second.
// Every file's time is the image's creation time, owners and modes are
// fixed, and entries are sorted: the same inputs give the same digest.
package ociimage

// Where things are in the image. The Dockerfile produces the same layout on
// distroless (internal/deploytest compares the two).
const (
	// BinDir holds the programs; the entrypoint is the exporter there.
	BinDir = "/usr/local/bin"
	// HomeDir is the nonroot user's home and the working directory:
	// relative paths such as the receiver's default --spool.dir land here.
	HomeDir = "/home/nonroot"
	// SpoolDir and StateDir are the receiver's spool and the exporter's
	// --state.dir where the Helm chart mounts their volumes. They belong to
	// the nonroot user, so a volume that takes its owner from the image
	// (Docker's and podman's named volumes) is writable.
	SpoolDir = "/var/lib/edgepipe/spool"
	StateDir = "/var/lib/edgepipe/state"
	// CACertsFile is the CA bundle Go's crypto/x509 reads on Linux.
	CACertsFile = "/etc/ssl/certs/ca-certificates.crt"
	// ZoneInfoDir is where Go's time package looks for zone data.
	ZoneInfoDir = "/usr/share/zoneinfo"
	// UID and GID are the nonroot user's (distroless's "nonroot").
	UID = 65532
	GID = 65532
	// User is the image's USER: the nonroot user and group by number, so
	// Kubernetes' runAsNonRoot can verify it without /etc/passwd.
	User = "65532:65532"
)

// The image's configuration, the Dockerfile's too.
var (
	// Commands are the programs in BinDir (the Makefile's CMDS).
	Commands = []string{"exporter", "rtld-receiver", "platform-sim"}
	// Entrypoint runs the exporter; the receiver and the simulator are
	// started by overriding it (the Helm chart sets command).
	Entrypoint = []string{BinDir + "/exporter"}
	// Cmd is the default argument: a demo against the built-in simulator.
	Cmd = []string{"--simulate"}
	// Ports are the exporter's and the receiver's default listen ports.
	Ports = []string{"9780/tcp", "9781/tcp"}
	// Env is distroless's: a PATH, and the CA bundle for programs that do
	// not look in CACertsFile by themselves.
	Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"SSL_CERT_FILE=" + CACertsFile,
	}
)

// The OCI annotation keys the image carries as labels
// (https://github.com/opencontainers/image-spec/blob/main/annotations.md).
const (
	LabelTitle       = "org.opencontainers.image.title"
	LabelDescription = "org.opencontainers.image.description"
	LabelSource      = "org.opencontainers.image.source"
	LabelLicenses    = "org.opencontainers.image.licenses"
	LabelVersion     = "org.opencontainers.image.version"
	LabelRevision    = "org.opencontainers.image.revision"
)

// FixedLabels are the labels whose values do not depend on the build.
var FixedLabels = map[string]string{
	LabelTitle:       "edgepipe",
	LabelDescription: "CDN metrics and real-time access logs to Prometheus, OpenTelemetry, ClickHouse and Kafka",
	LabelSource:      "https://github.com/edgepipe/edgepipe",
	LabelLicenses:    "Apache-2.0",
}

// passwd and group are distroless's: root, nobody and nonroot, with no
// login shell.
const (
	passwd = `root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
`
	group = `root:x:0:
nobody:x:65534:
tty:x:5:
staff:x:50:
nonroot:x:65532:
`
	// nsswitch is the part of distroless's /etc/nsswitch.conf that Go's
	// resolver reads: /etc/hosts before DNS.
	nsswitch = `passwd:         files
group:          files
hosts:          files dns
networks:       files
`
)
