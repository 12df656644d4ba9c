package ociimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// entry is one file, directory or symbolic link of a layer.
type entry struct {
	path     string // absolute, cleaned
	mode     fs.FileMode
	uid, gid int
	link     string // a symbolic link's target
	data     []byte // a regular file's content, when read in memory
	src      string // a regular file's content, read from this file when written
	size     int64  // of src
}

// layerFiles collects a layer's entries by path. Directories on the way to
// an entry are added as root's, 0755, unless added otherwise.
type layerFiles map[string]*entry

func (l layerFiles) dir(p string, mode fs.FileMode, uid, gid int) {
	l.parents(p)
	l[p] = &entry{path: p, mode: fs.ModeDir | mode, uid: uid, gid: gid}
}

func (l layerFiles) file(p string, data []byte, mode fs.FileMode) {
	l.parents(p)
	l[p] = &entry{path: p, mode: mode, data: data}
}

// copyFile adds the file src as p, its content read when the layer is
// written.
func (l layerFiles) copyFile(p, src string, size int64, mode fs.FileMode) {
	l.parents(p)
	l[p] = &entry{path: p, mode: mode, src: src, size: size}
}

func (l layerFiles) symlink(p, target string) {
	l.parents(p)
	l[p] = &entry{path: p, mode: fs.ModeSymlink | 0o777, link: target}
}

func (l layerFiles) parents(p string) {
	for d := path.Dir(p); d != "/"; d = path.Dir(d) {
		if _, ok := l[d]; !ok {
			l[d] = &entry{path: d, mode: fs.ModeDir | 0o755}
		}
	}
}

// copyTree adds the tree under src (directories, regular files, symbolic
// links as they are) at dst, owned by root, files 0644, directories 0755.
func (l layerFiles) copyTree(dst, src string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := path.Join(dst, filepath.ToSlash(rel))
		switch {
		case d.IsDir():
			l.dir(target, 0o755, 0, 0)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			l.symlink(target, link)
		case d.Type().IsRegular():
			fi, err := d.Info()
			if err != nil {
				return err
			}
			l.copyFile(target, p, fi.Size(), 0o644)
		default:
			return fmt.Errorf("%s: not a file, directory or symbolic link", p)
		}
		return nil
	})
}

// tar returns the layer as an uncompressed tar archive: entries in path
// order (so a directory precedes its content), each with the time mtime.
func (l layerFiles) tar(mtime time.Time) ([]byte, error) {
	paths := make([]string, 0, len(l))
	for p := range l {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		if err := l[p].write(tw, mtime); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func (e *entry) write(tw *tar.Writer, mtime time.Time) error {
	h := &tar.Header{
		Name:    strings.TrimPrefix(e.path, "/"),
		Mode:    int64(e.mode.Perm()),
		Uid:     e.uid,
		Gid:     e.gid,
		ModTime: mtime,
		Format:  tar.FormatPAX,
	}
	if e.mode&fs.ModeSticky != 0 {
		h.Mode |= 0o1000
	}
	switch {
	case e.mode.IsDir():
		h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
	case e.mode&fs.ModeSymlink != 0:
		h.Typeflag, h.Linkname = tar.TypeSymlink, e.link
	case e.src != "":
		h.Typeflag, h.Size = tar.TypeReg, e.size
	default:
		h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
	}
	if err := tw.WriteHeader(h); err != nil {
		return fmt.Errorf("layer entry %s: %w", e.path, err)
	}
	if h.Typeflag != tar.TypeReg {
		return nil
	}
	if e.src == "" {
		_, err := tw.Write(e.data)
		return err
	}
	f, err := os.Open(e.src)
	if err != nil {
		return err
	}
	defer f.Close()
	// A file that changed size since it was listed fails here (tar checks
	// the header's size), not silently in the image.
	if _, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("layer entry %s from %s: %w", e.path, e.src, err)
	}
	return nil
}
