// Package statedir keeps the exporter's state across restarts
// (--state.dir): one file per dataset, replaced atomically after every poll
// (written to a temporary file, fsynced, renamed over the old one, and the
// directory fsynced), so after a crash either the old or the new file is
// found, never a mix.
//
// A file starts with a format line ("edgepipe-exporter-state 1"), then one
// line of JSON: the dataset, the Identity of the exporter that wrote it, the
// payload's length and CRC-32C; the payload follows. Open checks every file
// before anything is used: a file that is damaged (checksum, length,
// header), of a format this program does not read, or written for another
// exporter (foreign: another granularity, another dataset than its name
// says, or an organization and environment selection with nothing in common
// with this one) is refused with an error naming it, and nothing from the
// directory is used.
//
// One process at a time: Open takes an exclusive lock on <dir>/.lock and
// Close releases it.
package statedir

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Format is the version of the file format this package writes and reads.
const Format = 1

// magic starts the first line of every state file.
const magic = "edgepipe-exporter-state"

// Suffix is the file name suffix of state files: <dataset>.state.
const Suffix = ".state"

const tmpSuffix = ".tmp"

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// nameRE is what a dataset name must look like to become a file name.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)

// Identity says which exporter a state belongs to.
type Identity struct {
	// Granularity of the buckets (FIVE_MINUTES, HOUR, DAY): a state of
	// another granularity is foreign.
	Granularity string `json:"granularity"`
	// Organizations and Environments are the exporter's selection
	// (--organization-id, --environment-id). A state whose selection has
	// nothing in common with this one is foreign; one that shares an
	// organization or environment is used (environments it does not know
	// start with a baseline, those no longer served are dropped).
	Organizations []string `json:"organizations,omitempty"`
	Environments  []string `json:"environments,omitempty"`
	// Shard is informational ("index/count"): after a re-shard the
	// environments a replica did not serve before start with a baseline.
	Shard string `json:"shard,omitempty"`
}

// normalized returns id with sorted, de-duplicated lists.
func (id Identity) normalized() Identity {
	norm := func(l []string) []string {
		l = slices.Clone(l)
		slices.Sort(l)
		return slices.Compact(l)
	}
	id.Organizations, id.Environments = norm(id.Organizations), norm(id.Environments)
	return id
}

// foreign returns why a state written by file cannot be used by id, or "".
func (id Identity) foreign(file Identity) string {
	if file.Granularity != id.Granularity {
		return fmt.Sprintf("it was written for granularity %s, this exporter polls %s", file.Granularity, id.Granularity)
	}
	if len(file.Organizations)+len(file.Environments) == 0 || len(id.Organizations)+len(id.Environments) == 0 {
		return ""
	}
	for _, o := range file.Organizations {
		if slices.Contains(id.Organizations, o) {
			return ""
		}
	}
	for _, e := range file.Environments {
		if slices.Contains(id.Environments, e) {
			return ""
		}
	}
	return fmt.Sprintf("it was written for organizations %v and environments %v, which have nothing in common with this exporter's %v and %v",
		file.Organizations, file.Environments, id.Organizations, id.Environments)
}

// header is the JSON line of a state file.
type header struct {
	Dataset      string    `json:"dataset"`
	Identity     Identity  `json:"identity"`
	SavedAt      time.Time `json:"saved_at"`
	PayloadBytes int       `json:"payload_bytes"`
	PayloadCRC   uint32    `json:"payload_crc32c"`
}

// ErrRefused is wrapped by Open's errors about a state file it will not
// use (damaged, unknown format, foreign).
var ErrRefused = errors.New("state file refused")

// ErrLocked is wrapped by Open's error when another process holds the
// directory.
var ErrLocked = errors.New("in use by another process")

// Dir is an open state directory. Its methods are safe for concurrent use
// by the poll loops (each saves its own dataset).
type Dir struct {
	path   string
	id     Identity
	unlock func() error
	states map[string][]byte
	fresh  bool
	now    func() time.Time
}

// Open creates path if needed, locks it, removes temporary files a crash
// left behind and reads and checks every state file. It fails, using
// nothing, when a file is refused (errors wrap ErrRefused and name the
// file) or another process holds the directory (ErrLocked).
func Open(path string, id Identity) (*Dir, error) {
	if path == "" {
		return nil, errors.New("state directory: empty path")
	}
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("state directory %s: %w", path, err)
	}
	unlock, err := lock(filepath.Join(path, ".lock"))
	if err != nil {
		return nil, fmt.Errorf("state directory %s: %w", path, err)
	}
	d := &Dir{path: path, id: id.normalized(), unlock: unlock, states: map[string][]byte{}, now: time.Now}
	if err := d.load(); err != nil {
		return nil, errors.Join(err, unlock())
	}
	d.fresh = len(d.states) == 0
	return d, nil
}

// load reads every state file and removes leftover temporary files.
func (d *Dir) load() error {
	entries, err := os.ReadDir(d.path)
	if err != nil {
		return fmt.Errorf("state directory %s: %w", d.path, err)
	}
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasSuffix(name, tmpSuffix):
			// An interrupted save: the previous file is intact.
			if err := os.Remove(filepath.Join(d.path, name)); err != nil {
				return fmt.Errorf("state directory %s: remove an interrupted save: %w", d.path, err)
			}
		case strings.HasSuffix(name, Suffix) && e.Type().IsRegular():
			dataset := strings.TrimSuffix(name, Suffix)
			payload, err := d.read(dataset)
			if err != nil {
				return err
			}
			d.states[dataset] = payload
		}
	}
	return nil
}

// read reads and checks the state file of dataset.
func (d *Dir) read(dataset string) ([]byte, error) {
	path := filepath.Join(d.path, dataset+Suffix)
	refuse := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s: %s; nothing in the state directory was used. Move the file away to let this exporter start (the dataset then starts with a baseline: its first poll is remembered, not counted)",
			ErrRefused, path, fmt.Sprintf(format, a...))
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	r := bufio.NewReader(bytes.NewReader(b))
	first, err := r.ReadString('\n')
	if err != nil {
		return nil, refuse("no format line")
	}
	fields := strings.Fields(first)
	if len(fields) != 2 || fields[0] != magic {
		return nil, refuse("not an edgepipe exporter state file")
	}
	if v, err := strconv.Atoi(fields[1]); err != nil || v != Format {
		return nil, refuse("format %q; this exporter reads format %d", fields[1], Format)
	}
	line, err := r.ReadBytes('\n')
	if err != nil {
		return nil, refuse("no header line")
	}
	var h header
	if err := json.Unmarshal(line, &h); err != nil {
		return nil, refuse("damaged header: %v", err)
	}
	payload, err := io.ReadAll(r)
	if err != nil {
		return nil, refuse("read: %v", err)
	}
	switch {
	case len(payload) != h.PayloadBytes:
		return nil, refuse("damaged: %d bytes of payload, the header says %d", len(payload), h.PayloadBytes)
	case crc32.Checksum(payload, crcTable) != h.PayloadCRC:
		return nil, refuse("damaged: checksum mismatch")
	case h.Dataset != dataset:
		return nil, refuse("it holds the state of dataset %q", h.Dataset)
	}
	if why := d.id.foreign(h.Identity); why != "" {
		return nil, refuse("%s", why)
	}
	return payload, nil
}

// Fresh reports whether the directory held no state file when opened: a
// first start, whose first polls are counted in full.
func (d *Dir) Fresh() bool { return d.fresh }

// TakeStates returns the payloads read at Open, by dataset, and lets go of
// them (the caller restores them once).
func (d *Dir) TakeStates() map[string][]byte {
	s := d.states
	d.states = nil
	return s
}

// Save replaces the state of dataset atomically and durably.
func (d *Dir) Save(dataset string, payload []byte) error {
	if !nameRE.MatchString(dataset) {
		return fmt.Errorf("state of %q: not usable as a file name", dataset)
	}
	h, err := json.Marshal(header{Dataset: dataset, Identity: d.id, SavedAt: d.now().UTC(),
		PayloadBytes: len(payload), PayloadCRC: crc32.Checksum(payload, crcTable)})
	if err != nil {
		return fmt.Errorf("state of %s: %w", dataset, err)
	}
	final := filepath.Join(d.path, dataset+Suffix)
	f, err := os.CreateTemp(d.path, dataset+".*"+tmpSuffix)
	if err != nil {
		return fmt.Errorf("state of %s: %w", dataset, err)
	}
	tmp := f.Name()
	werr := func() error {
		// A bufio.Writer keeps its first error and Flush returns it.
		w := bufio.NewWriterSize(f, 1<<16)
		fmt.Fprintf(w, "%s %d\n", magic, Format)
		_, _ = w.Write(h)
		_ = w.WriteByte('\n')
		_, _ = w.Write(payload)
		if err := w.Flush(); err != nil {
			return err
		}
		return f.Sync()
	}()
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, final)
	}
	if werr != nil {
		os.Remove(tmp)
		return fmt.Errorf("state of %s: write %s: %w", dataset, final, werr)
	}
	if err := syncDir(d.path); err != nil {
		return fmt.Errorf("state of %s: %w", dataset, err)
	}
	return nil
}

// Path returns the directory's path.
func (d *Dir) Path() string { return d.path }

// Close releases the directory's lock.
func (d *Dir) Close() error { return d.unlock() }

// syncDir fsyncs a directory so a rename in it is durable.
func syncDir(path string) error {
	dir, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", path, err)
	}
	defer dir.Close()
	if err := dir.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", path, err)
	}
	return nil
}
