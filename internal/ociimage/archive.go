package ociimage

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// WriteArchive writes img, tagged ref (e.g. ghcr.io/edgepipe/edgepipe:0.1.0),
// to path as an image archive that `podman load` and `docker load` read.
// The file appears complete or not at all.
func WriteArchive(path, ref string, img v1.Image) (err error) {
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("image reference %q: %w", ref, err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := tarball.Write(tag, img, f); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	if err := f.Chmod(0o644); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// Sizes are an image's sizes in bytes: Compressed is what a registry
// stores and a node pulls (the manifest, the configuration and the
// compressed layers), Uncompressed what the layers take unpacked (what
// `podman images` shows).
type Sizes struct {
	Compressed, Uncompressed int64
}

// ImageSizes returns img's sizes.
func ImageSizes(img v1.Image) (Sizes, error) {
	var s Sizes
	m, err := img.RawManifest()
	if err != nil {
		return s, err
	}
	c, err := img.RawConfigFile()
	if err != nil {
		return s, err
	}
	s.Compressed = int64(len(m) + len(c))
	layers, err := img.Layers()
	if err != nil {
		return s, err
	}
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			return s, err
		}
		s.Compressed += n
		u, err := uncompressedSize(l)
		if err != nil {
			return s, err
		}
		s.Uncompressed += u
	}
	return s, nil
}

func uncompressedSize(l v1.Layer) (n int64, err error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, rc.Close()) }()
	return io.Copy(io.Discard, rc)
}
