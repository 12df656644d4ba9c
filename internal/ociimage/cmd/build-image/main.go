// Command build-image assembles edgepipe's container image from the static
// binaries of `make build` (see package ociimage) and writes it as an image
// archive for `podman load` or `docker load`. `make image` runs it:
//
//	build-image -bin bin -o bin/edgepipe-image.tar -tag ghcr.io/edgepipe/edgepipe:0.1.0 \
//	    -version v0.1.0 -revision $(git rev-parse HEAD) -created 2026-01-02T03:04:05Z
//
// It needs no container engine and no network: the CA certificates and the
// time zone data come from Debian's ca-certificates and tzdata packages.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/edgepipe/edgepipe/internal/ociimage"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "build-image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("build-image", flag.ContinueOnError)
	var cfg ociimage.Config
	fs.StringVar(&cfg.BinDir, "bin", "bin", "directory of the static binaries ("+fmt.Sprint(ociimage.Commands)+")")
	fs.StringVar(&cfg.CACertsDir, "ca-certs", ociimage.DefaultCACertsDir, "directory of PEM CA certificates (*.crt) for the bundle")
	fs.StringVar(&cfg.ZoneInfoDir, "zoneinfo", ociimage.DefaultZoneInfoDir, "time zone database")
	fs.StringVar(&cfg.DocDir, "doc", ociimage.DefaultDocDir, "directory of the packages' documentation (ca-certificates/copyright, tzdata/copyright)")
	fs.StringVar(&cfg.Version, "version", "", "the version label (the binaries' version stamp)")
	fs.StringVar(&cfg.Revision, "revision", "", "the revision label (the git commit)")
	created := fs.String("created", "", "creation time of the image and its files: RFC 3339 or Unix seconds (default: the Unix epoch)")
	out := fs.String("o", "bin/edgepipe-image.tar", "image archive to write")
	ref := fs.String("tag", "", "the image's reference, REPOSITORY:TAG (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *ref == "" {
		return errors.New("-tag is required")
	}
	var err error
	if cfg.Created, err = parseTime(*created); err != nil {
		return err
	}
	img, err := ociimage.Build(cfg)
	if err != nil {
		return err
	}
	if err := ociimage.WriteArchive(*out, *ref, img); err != nil {
		return err
	}
	return report(*ref, *out, img)
}

// report prints what was built: reference, platform, ID, sizes.
func report(ref, out string, img v1.Image) error {
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	id, err := img.ConfigName()
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	sizes, err := ociimage.ImageSizes(img)
	if err != nil {
		return err
	}
	const mib = 1 << 20
	_, err = fmt.Printf("%s (%s/%s) written to %s: %.1f MiB compressed (pulled), %.1f MiB unpacked; image ID %s, manifest %s\n",
		ref, cf.OS, cf.Architecture, out, float64(sizes.Compressed)/mib, float64(sizes.Uncompressed)/mib, id, digest)
	return err
}

// parseTime reads RFC 3339 or Unix seconds (SOURCE_DATE_EPOCH's format).
func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if secs, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.Unix(secs, 0), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("-created %q: want RFC 3339 (2006-01-02T15:04:05Z) or Unix seconds", s)
	}
	return t, nil
}
