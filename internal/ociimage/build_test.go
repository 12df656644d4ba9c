package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/elf"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

// fakeELF returns the header of a Linux executable for machine, and with
// interp a PT_INTERP program header as a dynamically linked one has.
func fakeELF(t *testing.T, machine elf.Machine, interp bool) []byte {
	t.Helper()
	h := elf.Header64{
		Type: uint16(elf.ET_EXEC), Machine: uint16(machine), Version: uint32(elf.EV_CURRENT),
		Ehsize: 64, Phentsize: 56, Shentsize: 64,
	}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS], h.Ident[elf.EI_DATA], h.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	var progs []elf.Prog64
	if interp {
		h.Phoff, h.Phnum = 64, 1
		progs = append(progs, elf.Prog64{Type: uint32(elf.PT_INTERP), Off: 120, Filesz: 28, Memsz: 28})
	}
	var b bytes.Buffer
	if err := binary.Write(&b, binary.LittleEndian, h); err != nil {
		t.Fatal(err)
	}
	if err := binary.Write(&b, binary.LittleEndian, progs); err != nil {
		t.Fatal(err)
	}
	b.WriteString("/lib64/ld-linux-x86-64.so.2\x00")
	return b.Bytes()
}

// inputs is a fake machine's worth of inputs: binaries, CA certificates,
// zone data and copyright files, in a temporary directory.
type inputs struct {
	cfg   Config
	certs []byte // the expected bundle
}

func newInputs(t *testing.T) *inputs {
	t.Helper()
	dir := t.TempDir()
	in := &inputs{cfg: Config{
		BinDir: filepath.Join(dir, "bin"), CACertsDir: filepath.Join(dir, "mozilla"),
		ZoneInfoDir: filepath.Join(dir, "zoneinfo"), DocDir: filepath.Join(dir, "doc"),
		Version: "v1.2.3", Revision: "0123abcd", Created: time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC),
	}}
	for _, c := range Commands {
		write(t, filepath.Join(in.cfg.BinDir, c), append(fakeELF(t, elf.EM_X86_64, false), c...), 0o700)
	}
	for _, n := range []string{"B_Root.crt", "A_Root.crt"} {
		write(t, filepath.Join(in.cfg.CACertsDir, n), selfSigned(t, n), 0o644)
	}
	in.certs = append(readAll(t, filepath.Join(in.cfg.CACertsDir, "A_Root.crt")), readAll(t, filepath.Join(in.cfg.CACertsDir, "B_Root.crt"))...)
	write(t, filepath.Join(in.cfg.CACertsDir, "README"), []byte("not a certificate"), 0o644)
	write(t, filepath.Join(in.cfg.ZoneInfoDir, "UTC"), []byte("TZif2 UTC"), 0o644)
	write(t, filepath.Join(in.cfg.ZoneInfoDir, "Europe", "London"), []byte("TZif2 London"), 0o644)
	if err := os.Symlink("Europe/London", filepath.Join(in.cfg.ZoneInfoDir, "GB")); err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{"ca-certificates", "tzdata"} {
		write(t, filepath.Join(in.cfg.DocDir, pkg, "copyright"), []byte(pkg+" copyright"), 0o644)
	}
	return in
}

func write(t *testing.T, path string, data []byte, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
}

func readAll(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// selfSigned returns a PEM certificate named cn.
func selfSigned(t *testing.T, cn string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// layerEntry is a tar entry of a layer and, for a regular file, its content.
type layerEntry struct {
	hdr  *tar.Header
	data []byte
}

// layerEntries returns the entries of each layer of img, by path, checking
// that every directory comes before what it holds.
func layerEntries(t *testing.T, img v1.Image) []map[string]layerEntry {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]layerEntry
	for i, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		entries := map[string]layerEntry{}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			p := "/" + strings.TrimSuffix(h.Name, "/")
			if parent := filepath.Dir(p); parent != "/" && i == 0 {
				if _, ok := entries[parent]; !ok {
					t.Errorf("layer %d: %s comes before its directory", i, p)
				}
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			entries[p] = layerEntry{h, data}
		}
		rc.Close()
		out = append(out, entries)
	}
	return out
}

func TestBuild(t *testing.T) {
	in := newInputs(t)
	img, err := Build(in.cfg)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if cf.OS != "linux" || cf.Architecture != "amd64" || !cf.Created.Equal(created) {
		t.Errorf("platform %s/%s created %s, want linux/amd64 %s", cf.OS, cf.Architecture, cf.Created, created)
	}
	if want := ImageConfig("v1.2.3", "0123abcd"); !reflect.DeepEqual(cf.Config, want) {
		t.Errorf("config %+v, want %+v", cf.Config, want)
	}
	if cf.Config.Labels[LabelVersion] != "v1.2.3" || cf.Config.Labels[LabelRevision] != "0123abcd" || cf.Config.Labels[LabelSource] == "" {
		t.Errorf("labels %v", cf.Config.Labels)
	}
	if len(cf.History) != 2 || len(cf.RootFS.DiffIDs) != 2 {
		t.Fatalf("history %d, layers %d; want 2 and 2", len(cf.History), len(cf.RootFS.DiffIDs))
	}
	layers := layerEntries(t, img)
	base, bins := layers[0], layers[1]
	for _, c := range Commands {
		e, ok := bins["/usr/local/bin/"+c]
		if !ok {
			t.Fatalf("no %s in the binaries' layer", c)
		}
		if e.hdr.Mode != 0o755 || e.hdr.Uid != 0 || !bytes.Equal(e.data, readAll(t, filepath.Join(in.cfg.BinDir, c))) {
			t.Errorf("%s: mode %o uid %d, content equal %v", c, e.hdr.Mode, e.hdr.Uid, bytes.Equal(e.data, readAll(t, filepath.Join(in.cfg.BinDir, c))))
		}
	}
	for _, tc := range []struct {
		path     string
		typ      byte
		mode     int64
		uid, gid int
		data     string // for files: the content, or a part of it; for links: the target
	}{
		{"/etc/passwd", tar.TypeReg, 0o644, 0, 0, "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"},
		{"/etc/group", tar.TypeReg, 0o644, 0, 0, "nonroot:x:65532:\n"},
		{"/etc/nsswitch.conf", tar.TypeReg, 0o644, 0, 0, "hosts:          files dns\n"},
		{CACertsFile, tar.TypeReg, 0o644, 0, 0, string(in.certs)},
		{"/usr/share/zoneinfo/Europe/London", tar.TypeReg, 0o644, 0, 0, "TZif2 London"},
		{"/usr/share/zoneinfo/GB", tar.TypeSymlink, 0o777, 0, 0, "Europe/London"},
		{"/usr/share/doc/tzdata/copyright", tar.TypeReg, 0o644, 0, 0, "tzdata copyright"},
		{"/tmp", tar.TypeDir, 0o1777, 0, 0, ""},
		{"/root", tar.TypeDir, 0o700, 0, 0, ""},
		{"/home", tar.TypeDir, 0o755, 0, 0, ""},
		{HomeDir, tar.TypeDir, 0o700, UID, GID, ""},
		{"/var/lib/edgepipe", tar.TypeDir, 0o755, 0, 0, ""},
		{SpoolDir, tar.TypeDir, 0o700, UID, GID, ""},
		{StateDir, tar.TypeDir, 0o700, UID, GID, ""},
	} {
		e, ok := base[tc.path]
		if !ok {
			t.Errorf("no %s in the base layer", tc.path)
			continue
		}
		h := e.hdr
		if h.Typeflag != tc.typ || h.Mode != tc.mode || h.Uid != tc.uid || h.Gid != tc.gid {
			t.Errorf("%s: type %c mode %o owner %d:%d, want %c %o %d:%d", tc.path, h.Typeflag, h.Mode, h.Uid, h.Gid, tc.typ, tc.mode, tc.uid, tc.gid)
		}
		if got := string(e.data) + h.Linkname; !strings.Contains(got, tc.data) {
			t.Errorf("%s holds %q, want %q in it", tc.path, got, tc.data)
		}
	}
	if got := string(base[CACertsFile].data); got != string(in.certs) {
		t.Errorf("CA bundle is not the certificates in name order:\n%s", got)
	}
	for _, l := range layers {
		for p, e := range l {
			if !e.hdr.ModTime.Equal(created) {
				t.Errorf("%s: time %s, want %s", p, e.hdr.ModTime, created)
			}
		}
	}
}

// TestBuildReproducible checks that the same inputs give the same image,
// and that what changes the image changes only what it must: a new
// version only the configuration, a new binary only its layer.
func TestBuildReproducible(t *testing.T) {
	in := newInputs(t)
	build := func(cfg Config) (digest v1.Hash, layers []v1.Hash) {
		t.Helper()
		img, err := Build(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if digest, err = img.Digest(); err != nil {
			t.Fatal(err)
		}
		ls, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			d, err := l.Digest()
			if err != nil {
				t.Fatal(err)
			}
			layers = append(layers, d)
		}
		return digest, layers
	}
	d1, l1 := build(in.cfg)
	d2, l2 := build(in.cfg)
	if d1 != d2 || !reflect.DeepEqual(l1, l2) {
		t.Fatalf("two builds of the same inputs: %s %v and %s %v", d1, l1, d2, l2)
	}
	other := in.cfg
	other.Version = "v1.2.4"
	d3, l3 := build(other)
	if d3 == d1 || !reflect.DeepEqual(l3, l1) {
		t.Errorf("another version: digest %s (was %s), layers %v (were %v); want a new digest, the same layers", d3, d1, l3, l1)
	}
	write(t, filepath.Join(in.cfg.BinDir, "exporter"), append(fakeELF(t, elf.EM_X86_64, false), "new"...), 0o755)
	_, l4 := build(in.cfg)
	if l4[0] != l1[0] || l4[1] == l1[1] {
		t.Errorf("a new binary: layers %v (were %v); want the same base layer, a new binaries' layer", l4, l1)
	}
}

func TestBuildRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, cfg *Config)
		want  []string
	}{
		{"no binary directory", func(_ *testing.T, cfg *Config) { cfg.BinDir = "" }, []string{"directory of the binaries"}},
		{"missing binary", func(t *testing.T, cfg *Config) { rm(t, filepath.Join(cfg.BinDir, "platform-sim")) }, []string{"platform-sim", "make build"}},
		{"dynamic binary", func(t *testing.T, cfg *Config) {
			write(t, filepath.Join(cfg.BinDir, "exporter"), fakeELF(t, elf.EM_X86_64, true), 0o755)
		}, []string{"exporter is dynamically linked", "CGO_ENABLED=0"}},
		{"a real dynamic executable", func(t *testing.T, cfg *Config) {
			write(t, filepath.Join(cfg.BinDir, "exporter"), readAll(t, testenv.Binary(t, "true")), 0o755)
		}, []string{"exporter is dynamically linked"}},
		{"not an executable", func(t *testing.T, cfg *Config) {
			write(t, filepath.Join(cfg.BinDir, "rtld-receiver"), []byte("#!/bin/sh\n"), 0o755)
		}, []string{"rtld-receiver is not a Linux executable"}},
		{"mixed architectures", func(t *testing.T, cfg *Config) {
			write(t, filepath.Join(cfg.BinDir, "platform-sim"), fakeELF(t, elf.EM_AARCH64, false), 0o755)
		}, []string{"different architectures", "arm64", "amd64"}},
		{"no CA certificates", func(t *testing.T, cfg *Config) { cfg.CACertsDir = t.TempDir() }, []string{"no CA certificates", "ca-certificates"}},
		{"not a certificate", func(t *testing.T, cfg *Config) {
			write(t, filepath.Join(cfg.CACertsDir, "C.crt"), []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), 0o644)
		}, []string{"C.crt", "want CERTIFICATE"}},
		{"not PEM", func(t *testing.T, cfg *Config) {
			write(t, filepath.Join(cfg.CACertsDir, "C.crt"), []byte("garbage"), 0o644)
		}, []string{"C.crt", "not PEM"}},
		{"no time zone data", func(t *testing.T, cfg *Config) { cfg.ZoneInfoDir = filepath.Join(t.TempDir(), "none") }, []string{"tzdata"}},
		{"time zone data without UTC", func(t *testing.T, cfg *Config) { rm(t, filepath.Join(cfg.ZoneInfoDir, "UTC")) }, []string{"tzdata", "UTC"}},
		{"no copyright file", func(t *testing.T, cfg *Config) { rm(t, filepath.Join(cfg.DocDir, "tzdata", "copyright")) }, []string{"tzdata package's copyright"}},
		{"version with a line break", func(_ *testing.T, cfg *Config) { cfg.Version = "v1\nx" }, []string{"version"}},
		{"created before 1970", func(_ *testing.T, cfg *Config) { cfg.Created = time.Unix(-1, 0) }, []string{"before 1970"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := newInputs(t)
			tc.setup(t, &in.cfg)
			_, err := Build(in.cfg)
			testenv.CheckErr(t, err, tc.want)
		})
	}
}

func rm(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{BinDir: "bin", Created: time.Date(2026, 5, 6, 7, 8, 9, 999, time.FixedZone("x", 3600))}.withDefaults()
	want := Config{BinDir: "bin", CACertsDir: DefaultCACertsDir, ZoneInfoDir: DefaultZoneInfoDir, DocDir: DefaultDocDir,
		Created: time.Date(2026, 5, 6, 6, 8, 9, 0, time.UTC)}
	if c != want {
		t.Errorf("withDefaults: %+v, want %+v", c, want)
	}
	if got := (Config{BinDir: "bin"}).withDefaults().Created; !got.Equal(time.Unix(0, 0)) {
		t.Errorf("default creation time %s, want the Unix epoch", got)
	}
}

// TestWriteArchive checks the archive reads back as the same image under
// its tag, and that a bad reference leaves no file.
func TestWriteArchive(t *testing.T) {
	in := newInputs(t)
	img, err := Build(in.cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "image.tar")
	const ref = "ghcr.io/edgepipe/edgepipe:1.2.3"
	if err := WriteArchive(path, ref, img); err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	back, err := tarball.ImageFromPath(path, &tag)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.ConfigName()
	if got, err := back.ConfigName(); err != nil || got != want {
		t.Errorf("archive's image ID %s (%v), want %s", got, err, want)
	}
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(path) })
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || !reflect.DeepEqual(m[0].RepoTags, []string{ref}) {
		t.Errorf("archive's manifest %+v, want one image tagged %s", m, ref)
	}
	sizes, err := ImageSizes(img)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if sizes.Compressed <= 0 || sizes.Compressed > fi.Size() || sizes.Uncompressed <= sizes.Compressed/2 {
		t.Errorf("sizes %+v with an archive of %d bytes", sizes, fi.Size())
	}

	bad := filepath.Join(t.TempDir(), "bad.tar")
	testenv.CheckErr(t, WriteArchive(bad, "UPPER/case:tag", img), []string{"image reference"})
	if entries, _ := os.ReadDir(filepath.Dir(bad)); len(entries) != 0 {
		t.Errorf("a failed write left %v", entries)
	}
}
