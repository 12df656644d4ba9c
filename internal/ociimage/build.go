package ociimage

import (
	"bytes"
	"compress/gzip"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Where Debian's packages put what the image takes from them.
const (
	// DefaultCACertsDir holds the Mozilla CA certificates of Debian's
	// ca-certificates package, one PEM file each. The image's bundle is
	// made of these alone, never of the build machine's
	// /etc/ssl/certs/ca-certificates.crt, which may hold local additions.
	DefaultCACertsDir = "/usr/share/ca-certificates/mozilla"
	// DefaultZoneInfoDir is Debian's tzdata package.
	DefaultZoneInfoDir = "/usr/share/zoneinfo"
	// DefaultDocDir holds the packages' copyright files, copied along with
	// their data (as distroless does).
	DefaultDocDir = "/usr/share/doc"
)

// Config says where the inputs of the image are and how to stamp it.
type Config struct {
	// BinDir holds the static executables named in Commands (required).
	BinDir string
	// CACertsDir, ZoneInfoDir, DocDir: see the Default… constants.
	CACertsDir  string
	ZoneInfoDir string
	DocDir      string
	// Version and Revision become the version and revision labels (the
	// binaries' version stamp and the git commit); empty leaves them out.
	Version  string
	Revision string
	// Created is the image's creation time and every file's time; the zero
	// time means the Unix epoch. Give the commit's time
	// (SOURCE_DATE_EPOCH) for an image that the same commit reproduces.
	Created time.Time
}

func (c Config) withDefaults() Config {
	if c.CACertsDir == "" {
		c.CACertsDir = DefaultCACertsDir
	}
	if c.ZoneInfoDir == "" {
		c.ZoneInfoDir = DefaultZoneInfoDir
	}
	if c.DocDir == "" {
		c.DocDir = DefaultDocDir
	}
	if c.Created.IsZero() {
		c.Created = time.Unix(0, 0)
	}
	c.Created = c.Created.UTC().Truncate(time.Second)
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.BinDir == "" {
		errs = append(errs, errors.New("the directory of the binaries is required"))
	}
	if c.Created.Before(time.Unix(0, 0)) {
		errs = append(errs, fmt.Errorf("creation time %s is before 1970", c.Created))
	}
	for _, v := range []struct{ name, value string }{{"version", c.Version}, {"revision", c.Revision}} {
		if strings.ContainsAny(v.value, "\n\x00") {
			errs = append(errs, fmt.Errorf("%s %q has a line break or NUL", v.name, v.value))
		}
	}
	return errors.Join(errs...)
}

// Build assembles the image. It refuses binaries that are missing, not
// static or of different architectures, and a CA directory without
// certificates; the image's architecture is the binaries'.
func Build(cfg Config) (v1.Image, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	bins, arch, err := binaries(cfg.BinDir)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	base, err := baseFiles(cfg)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	created := v1.Time{Time: cfg.Created}
	var adds []mutate.Addendum
	for _, l := range []struct {
		files layerFiles
		what  string
	}{
		{base, "users 65532 (nonroot), nobody, root; CA certificates (Debian ca-certificates); time zones (Debian tzdata); /tmp, " + HomeDir + ", " + SpoolDir + ", " + StateDir},
		{bins, "edgepipe " + strings.Join(Commands, ", ") + " in " + BinDir},
	} {
		layer, err := newLayer(l.files, cfg.Created)
		if err != nil {
			return nil, fmt.Errorf("image: %w", err)
		}
		adds = append(adds, mutate.Addendum{Layer: layer, MediaType: types.OCILayer,
			History: v1.History{Created: created, CreatedBy: "edgepipe ociimage: " + l.what}})
	}
	img, err := mutate.Append(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), adds...)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = arch, "linux", created
	cf.Config = ImageConfig(cfg.Version, cfg.Revision)
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	return img, nil
}

// ImageConfig returns the image's run configuration (the Dockerfile's
// USER, WORKDIR, ENTRYPOINT, CMD, EXPOSE, ENV and LABEL) for a version
// and revision.
func ImageConfig(version, revision string) v1.Config {
	labels := maps.Clone(FixedLabels)
	if version != "" {
		labels[LabelVersion] = version
	}
	if revision != "" {
		labels[LabelRevision] = revision
	}
	ports := map[string]struct{}{}
	for _, p := range Ports {
		ports[p] = struct{}{}
	}
	return v1.Config{
		User:         User,
		WorkingDir:   HomeDir,
		Entrypoint:   append([]string(nil), Entrypoint...),
		Cmd:          append([]string(nil), Cmd...),
		ExposedPorts: ports,
		Env:          append([]string(nil), Env...),
		Labels:       labels,
	}
}

// binaries returns the layer of the programs and their architecture.
func binaries(dir string) (layerFiles, string, error) {
	files := layerFiles{}
	arch := ""
	for _, c := range Commands {
		src := filepath.Join(dir, c)
		fi, err := os.Stat(src)
		if err != nil {
			return nil, "", fmt.Errorf("binary %s: %w (run `make build`)", c, err)
		}
		if !fi.Mode().IsRegular() {
			return nil, "", fmt.Errorf("binary %s is not a regular file", src)
		}
		a, err := staticArch(src)
		if err != nil {
			return nil, "", err
		}
		if arch != "" && a != arch {
			return nil, "", fmt.Errorf("binaries of different architectures: %s is %s, the others %s", src, a, arch)
		}
		arch = a
		files.copyFile(path.Join(BinDir, c), src, fi.Size(), 0o755)
	}
	return files, arch, nil
}

// baseFiles returns the base layer: distroless static nonroot's users and
// directories, the CA bundle, the zone data, the packages' copyright files,
// and the spool and state directories.
func baseFiles(cfg Config) (layerFiles, error) {
	files := layerFiles{}
	files.file("/etc/passwd", []byte(passwd), 0o644)
	files.file("/etc/group", []byte(group), 0o644)
	files.file("/etc/nsswitch.conf", []byte(nsswitch), 0o644)
	files.dir("/tmp", fs.ModeSticky|0o777, 0, 0)
	files.dir("/root", 0o700, 0, 0)
	files.dir(HomeDir, 0o700, UID, GID)
	files.dir(SpoolDir, 0o700, UID, GID)
	files.dir(StateDir, 0o700, UID, GID)
	bundle, err := caBundle(cfg.CACertsDir)
	if err != nil {
		return nil, err
	}
	files.file(CACertsFile, bundle, 0o644)
	if err := files.copyTree(ZoneInfoDir, cfg.ZoneInfoDir); err != nil {
		return nil, fmt.Errorf("time zone data (Debian's tzdata): %w", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.ZoneInfoDir, "UTC")); err != nil {
		return nil, fmt.Errorf("time zone data (Debian's tzdata): %w", err)
	}
	for _, pkg := range []string{"ca-certificates", "tzdata"} {
		src := filepath.Join(cfg.DocDir, pkg, "copyright")
		fi, err := os.Stat(src)
		if err != nil {
			return nil, fmt.Errorf("the %s package's copyright file: %w", pkg, err)
		}
		files.copyFile(path.Join("/usr/share/doc", pkg, "copyright"), src, fi.Size(), 0o644)
	}
	return files, nil
}

// caBundle concatenates the PEM certificates of dir (*.crt, in name order,
// as update-ca-certificates does), each checked to be a certificate.
func caBundle(dir string) ([]byte, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.crt"))
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var bundle bytes.Buffer
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("CA certificates: %w", err)
		}
		if err := checkCertificates(b); err != nil {
			return nil, fmt.Errorf("CA certificate %s: %w", name, err)
		}
		bundle.Write(b)
		if !bytes.HasSuffix(b, []byte("\n")) {
			bundle.WriteByte('\n')
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no CA certificates (*.crt) in %s: install Debian's ca-certificates package (`make deps`)", dir)
	}
	return bundle.Bytes(), nil
}

// checkCertificates reports an error unless b holds PEM certificates and
// nothing else.
func checkCertificates(b []byte) error {
	n := 0
	for rest := b; ; n++ {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			if len(bytes.TrimSpace(rest)) > 0 {
				return errors.New("not PEM, or text after the certificates")
			}
			break
		}
		if block.Type != "CERTIFICATE" {
			return fmt.Errorf("PEM block %q, want CERTIFICATE", block.Type)
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return err
		}
	}
	if n == 0 {
		return errors.New("no certificate")
	}
	return nil
}

// newLayer makes a gzip-compressed OCI layer of files, compressed once.
func newLayer(files layerFiles, mtime time.Time) (v1.Layer, error) {
	raw, err := files.tar(mtime)
	if err != nil {
		return nil, err
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(raw); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	compressed := gz.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(compressed)), nil
	}, tarball.WithMediaType(types.OCILayer))
}
