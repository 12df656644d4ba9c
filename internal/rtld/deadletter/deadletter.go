// Package deadletter is the receiver's dead-letter store: the records a
// sink rejected for good (too large for the topic, refused by the table),
// set aside under <spool.dir>/dead-letter/<sink>/ so that the sink can move
// on, until an operator fixes the sink and replays them
// (`rtld-receiver dead-letter list`, `… replay`).
//
// Each Add writes one file (or a few, for very many records), durably:
// written to a temporary name, fsynced, renamed, and the directory fsynced.
// A file is a JSON array of letters; a letter is self-describing: the
// record's bytes exactly as received, its batch identity (environment,
// profile, agent, datestamp, seq_num, record_index, or the batch hash of a
// batch without identity), the sink, the reason and error text, and the
// time. Files are never appended to, so a replay (another process) may read
// and remove them while the receiver adds new ones.
//
// The store is bounded (Options.MaxBytes, over every sink): records that do
// not fit are dropped for that sink, counted in
// edgepipe_rtld_dead_letter_dropped_records_total and logged; the sink still
// moves on (the other sink still has the records).
package deadletter

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/delivery"
)

// DirName is the store's directory inside the spool directory.
const DirName = "dead-letter"

// maxFileBytes bounds the records of one file; an Add of more writes
// several files.
const maxFileBytes = 16 << 20

// Letter is one dead-lettered record as stored.
type Letter struct {
	// Time is when the sink rejected the record.
	Time time.Time `json:"time"`
	// Sink, Reason and Error say who rejected it and why.
	Sink   string `json:"sink"`
	Reason string `json:"reason"`
	Error  string `json:"error"`
	// The batch the record came in (see accesslog.Batch).
	EnvironmentID string    `json:"environment_id"`
	Format        string    `json:"format"`
	AccountNumber string    `json:"account_number,omitempty"`
	Platform      string    `json:"platform,omitempty"`
	ProfileID     string    `json:"profile_id,omitempty"`
	AgentID       string    `json:"agent_id,omitempty"`
	Datestamp     string    `json:"datestamp,omitempty"`
	SeqNum        int64     `json:"seq_num"`
	BatchHash     string    `json:"batch_hash,omitempty"`
	ReceivedAt    time.Time `json:"received_at"`
	// RecordIndex is the record's position in its batch.
	RecordIndex int `json:"record_index"`
	// Replays counts replays that found the record rejected again.
	Replays int `json:"replays,omitempty"`
	// Record is the record's JSON exactly as received; RecordBase64 holds
	// it instead when it is not valid JSON in UTF-8 (never, for what ingest
	// accepted).
	Record       json.RawMessage `json:"record,omitempty"`
	RecordBase64 []byte          `json:"record_base64,omitempty"`
}

// newLetter describes a rejection.
func newLetter(sink string, r delivery.Rejection, now time.Time) Letter {
	b := r.Batch
	l := Letter{
		Time: now.UTC(), Sink: sink, Reason: r.Reason,
		EnvironmentID: b.EnvironmentID, Format: string(b.Format), AccountNumber: b.AccountNumber, Platform: b.Platform,
		ProfileID: b.ProfileID, AgentID: b.AgentID, Datestamp: b.Datestamp, SeqNum: b.SeqNum, BatchHash: b.BatchHash,
		ReceivedAt: time.Unix(0, b.ReceivedUnixNano).UTC(), RecordIndex: b.RecordIndex(0),
	}
	if r.Err != nil {
		l.Error = r.Err.Error()
	}
	if rec := b.Records[0]; json.Valid(rec) && utf8.Valid(rec) {
		l.Record = rec
	} else {
		l.RecordBase64 = rec
	}
	return l
}

// Batch rebuilds the letter's record as a one-record batch with its
// original identity, ready to be delivered again.
func (l *Letter) Batch() *accesslog.Batch {
	rec := l.Record
	if len(rec) == 0 {
		rec = l.RecordBase64
	}
	return &accesslog.Batch{
		EnvironmentID: l.EnvironmentID, ReceivedUnixNano: l.ReceivedAt.UnixNano(), Format: accesslog.Format(l.Format),
		AccountNumber: l.AccountNumber, AgentID: l.AgentID, Datestamp: l.Datestamp, Platform: l.Platform,
		ProfileID: l.ProfileID, SeqNum: l.SeqNum, BatchHash: l.BatchHash,
		Records: []json.RawMessage{rec}, RecordIndexes: []int{l.RecordIndex},
	}
}

// RecordBytes returns the size of the letter's record.
func (l *Letter) RecordBytes() int { return len(l.Record) + len(l.RecordBase64) }

// encodeLetter encodes one letter as a JSON object with the record's bytes
// spliced in unchanged (json.Marshal would compact them).
func encodeLetter(l Letter) ([]byte, error) {
	rec := l.Record
	l.Record = nil
	head, err := json.Marshal(&l)
	if err != nil {
		return nil, fmt.Errorf("encoding a dead letter: %w", err)
	}
	if len(rec) == 0 {
		return head, nil
	}
	out := make([]byte, 0, len(head)+len(rec)+12)
	out = append(out, head[:len(head)-1]...) // without the closing brace
	out = append(out, `,"record":`...)
	out = append(out, rec...)
	return append(out, '}'), nil
}

// fileBytes is the size of a file holding letters encoded as enc: a JSON
// array with one letter per line.
func fileBytes(enc [][]byte) int64 {
	n := int64(len("[\n") + len("\n]\n"))
	for i, e := range enc {
		if i > 0 {
			n += int64(len(",\n"))
		}
		n += int64(len(e))
	}
	return n
}

func joinLetters(enc [][]byte) []byte {
	out := make([]byte, 0, fileBytes(enc))
	out = append(out, "[\n"...)
	for i, e := range enc {
		if i > 0 {
			out = append(out, ",\n"...)
		}
		out = append(out, e...)
	}
	return append(out, "\n]\n"...)
}

// File is one file of the store.
type File struct {
	// Sink is the sink whose records it holds.
	Sink string
	// Path is the file's path.
	Path string
	// Records is how many letters it holds; Bytes its size.
	Records int
	Bytes   int64
}

// ReadLetters reads the letters of a file.
func ReadLetters(path string) ([]Letter, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading dead letters: %w", err)
	}
	var out []Letter
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("reading dead letters from %s: %w", path, err)
	}
	return out, nil
}

// DefaultMaxBytes is the default of Options.MaxBytes.
const DefaultMaxBytes = 1 << 30

// Options configure a Store.
type Options struct {
	// Dir is the store's directory (<spool.dir>/dead-letter).
	Dir string
	// MaxBytes bounds the files of all sinks together (default
	// DefaultMaxBytes).
	MaxBytes int64
	// Logger receives notes about a full store.
	Logger *slog.Logger
	// Sinks are the sinks whose size the store reports, 0 while they have
	// no dead letters (the receiver's configured sinks), so that
	// dashboards and alerts have the series from the start.
	Sinks []string
}

// Store is the dead-letter store. It is safe for concurrent use, and other
// processes may list and replay it while it is in use.
type Store struct {
	opts Options
	log  *slog.Logger

	mu   sync.Mutex
	used int64 // bytes of every sink's files, as last counted
	seq  int

	stored, dropped *prometheus.CounterVec
	bytesDesc       *prometheus.Desc
	recordsDesc     *prometheus.Desc
	maxDesc         *prometheus.Desc
}

// withDefaults returns o with every unset field set to its default.
func (o Options) withDefaults() Options {
	if o.MaxBytes == 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// validate reports every setting of o (with defaults applied) that cannot
// work.
func (o Options) validate() error {
	var errs []error
	if o.Dir == "" {
		errs = append(errs, errors.New("no directory"))
	}
	if o.MaxBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxBytes %d: must be positive", o.MaxBytes))
	}
	return errors.Join(errs...)
}

// Open opens (creating) the store's directory, removes temporary files left
// by a crash, and counts what it holds.
func Open(opts Options) (*Store, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("dead-letter store: invalid options: %w", err)
	}
	if err := os.MkdirAll(opts.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("creating the dead-letter directory: %w", err)
	}
	s := &Store{
		opts: opts, log: opts.Logger,
		stored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_rtld_dead_letter_records_total",
			Help: "Records a sink rejected for good, set aside in the dead-letter store (<spool.dir>/dead-letter/<sink>/), by sink and reason.",
		}, []string{"sink", "reason"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_rtld_dead_letter_dropped_records_total",
			Help: "Records a sink rejected for good that did not fit in the full dead-letter store (--dead-letter.max-bytes) and were dropped for that sink, by sink and reason.",
		}, []string{"sink", "reason"}),
		bytesDesc:   prometheus.NewDesc("edgepipe_rtld_dead_letter_bytes", "Bytes in the dead-letter store, by sink.", []string{"sink"}, nil),
		recordsDesc: prometheus.NewDesc("edgepipe_rtld_dead_letter_stored_records", "Records in the dead-letter store, by sink.", []string{"sink"}, nil),
		maxDesc:     prometheus.NewDesc("edgepipe_rtld_dead_letter_max_bytes", "Size bound of the dead-letter store (--dead-letter.max-bytes).", nil, nil),
	}
	if _, err := s.scan("", true); err != nil {
		return nil, err
	}
	s.recount()
	return s, nil
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.opts.Dir }

// fileName is <unix nanoseconds>-<sequence>-<records>.json; names sort by
// time.
func fileName(now time.Time, seq, records int) string {
	return fmt.Sprintf("%019d-%06d-%d.json", now.UnixNano(), seq%1_000_000, records)
}

// parseFileName returns the record count a file name carries.
func parseFileName(name string) (int, bool) {
	stem, ok := strings.CutSuffix(name, ".json")
	if !ok || strings.HasPrefix(name, ".") {
		return 0, false
	}
	parts := strings.Split(stem, "-")
	if len(parts) != 3 {
		return 0, false
	}
	n, err := strconv.Atoi(parts[2])
	return n, err == nil && n >= 0
}

// Files lists the files of sink (every sink when sink is empty), oldest
// first.
func (s *Store) Files(sink string) ([]File, error) { return s.scan(sink, false) }

// scan lists files; with clean it also removes temporary files.
func (s *Store) scan(sink string, clean bool) ([]File, error) {
	sinks := []string{sink}
	if sink == "" {
		entries, err := os.ReadDir(s.opts.Dir)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, nil
			}
			return nil, fmt.Errorf("reading the dead-letter directory: %w", err)
		}
		sinks = sinks[:0]
		for _, e := range entries {
			if e.IsDir() {
				sinks = append(sinks, e.Name())
			}
		}
	}
	var out []File
	for _, name := range sinks {
		dir := filepath.Join(s.opts.Dir, name)
		entries, err := os.ReadDir(dir)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("reading the dead letters of %s: %w", name, err)
		}
		for _, e := range entries {
			if clean && strings.HasPrefix(e.Name(), ".tmp-") {
				_ = os.Remove(filepath.Join(dir, e.Name()))
				continue
			}
			n, ok := parseFileName(e.Name())
			if !ok || e.IsDir() {
				continue
			}
			info, err := e.Info()
			if err != nil {
				continue // removed meanwhile (a replay)
			}
			out = append(out, File{Sink: name, Path: filepath.Join(dir, e.Name()), Records: n, Bytes: info.Size()})
		}
	}
	slices.SortFunc(out, func(a, b File) int { return strings.Compare(filepath.Base(a.Path), filepath.Base(b.Path)) })
	return out, nil
}

// Add stores the rejected records of sink durably and counts them. Records
// that do not fit under MaxBytes are dropped, counted and logged, and Add
// still returns nil, so the sink moves on; an error means nothing more
// could be written (the caller retries).
func (s *Store) Add(sink string, rejected []delivery.Rejection) error {
	if len(rejected) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	letters := make([]Letter, len(rejected))
	enc := make([][]byte, len(rejected))
	for i, r := range rejected {
		letters[i] = newLetter(sink, r, now)
		var err error
		if enc[i], err = encodeLetter(letters[i]); err != nil {
			return err
		}
	}
	dir := filepath.Join(s.opts.Dir, sink)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("creating the dead-letter directory of %s: %w", sink, err)
	}
	kept, err := s.writeFiles(dir, now, enc)
	if err != nil {
		return err
	}
	s.count(sink, letters, kept)
	return nil
}

// writeFiles writes the first of the encoded letters enc that the store
// has room for into new files of dir, and returns how many it wrote. When
// it fails, it removes the files it wrote: the caller retries them all.
func (s *Store) writeFiles(dir string, now time.Time, enc [][]byte) (kept int, err error) {
	var written []string
	rescanned := false
	for kept < len(enc) {
		end := s.fill(enc, kept, &rescanned)
		if end == kept {
			break // the store is full
		}
		data := joinLetters(enc[kept:end])
		s.seq++
		name := fileName(now, s.seq, end-kept)
		if err := writeFile(dir, name, data); err != nil {
			// All or nothing: the caller retries the whole Add.
			for _, p := range written {
				_ = os.Remove(p)
			}
			s.recount()
			return 0, err
		}
		written = append(written, filepath.Join(dir, name))
		s.used += int64(len(data))
		kept = end
	}
	if len(written) > 0 {
		if err := syncDir(dir); err != nil {
			return 0, err
		}
	}
	return kept, nil
}

// fill returns the end of the letters of the next file, enc[kept:end]: as
// many as fit in a file and in the store. When the store looks full, it
// counts the files on disk once per Add (rescanned), since a replay
// (another process) may have freed space.
func (s *Store) fill(enc [][]byte, kept int, rescanned *bool) int {
	end, size := kept, fileBytes(nil)
	for end < len(enc) {
		next := size + int64(len(enc[end]))
		if end > kept {
			next += int64(len(",\n"))
		}
		if end > kept && next > maxFileBytes {
			break
		}
		if s.used+next > s.opts.MaxBytes {
			if !*rescanned {
				*rescanned = true
				s.recount()
				continue
			}
			break
		}
		size = next
		end++
	}
	return end
}

// count counts the letters of sink stored (the first kept) and dropped,
// and logs the drop.
func (s *Store) count(sink string, letters []Letter, kept int) {
	for _, l := range letters[:kept] {
		s.stored.WithLabelValues(sink, l.Reason).Inc()
	}
	if kept == len(letters) {
		return
	}
	for _, l := range letters[kept:] {
		s.dropped.WithLabelValues(sink, l.Reason).Inc()
	}
	s.log.Error("rtld: dead-letter store is full; rejected records dropped for this sink (the other sink still has them)",
		"sink", sink, "dropped", len(letters)-kept, "kept", kept, "used_bytes", s.used, "max_bytes", s.opts.MaxBytes,
		"fix", "replay or remove dead letters (rtld-receiver dead-letter list/replay), or raise --dead-letter.max-bytes")
}

// recount sets used from the files on disk.
func (s *Store) recount() {
	files, err := s.scan("", false)
	if err != nil {
		return
	}
	s.used = 0
	for _, f := range files {
		s.used += f.Bytes
	}
}

// writeFile writes data to dir/name durably: a temporary file, fsync,
// rename. The caller fsyncs dir.
func writeFile(dir, name string, data []byte) error {
	tmp := filepath.Join(dir, ".tmp-"+name)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
	if err != nil {
		return fmt.Errorf("writing dead letters: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("writing dead letters: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("syncing dead letters: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing dead letters: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing dead letters: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("syncing the dead-letter directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing the dead-letter directory: %w", err)
	}
	return nil
}

// Collectors returns the store's metrics: the two counters, each its own
// collector so that a registry knows their type before they count
// anything, and the store's size.
func (s *Store) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.stored, s.dropped, sizeCollector{s}}
}

// sizeCollector reports the store's bound and its size per sink as found on
// disk at scrape time (a replay in another process shrinks it).
type sizeCollector struct{ s *Store }

func (c sizeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.s.bytesDesc
	ch <- c.s.recordsDesc
	ch <- c.s.maxDesc
}

func (c sizeCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	ch <- prometheus.MustNewConstMetric(s.maxDesc, prometheus.GaugeValue, float64(s.opts.MaxBytes))
	files, err := s.scan("", false)
	if err != nil {
		s.log.Warn("rtld: cannot read the dead-letter store for metrics", "err", err)
		return
	}
	bytesBy, recordsBy := map[string]int64{}, map[string]int{}
	for _, sink := range s.opts.Sinks {
		bytesBy[sink] = 0
	}
	for _, f := range files {
		bytesBy[f.Sink] += f.Bytes
		recordsBy[f.Sink] += f.Records
	}
	for sink, n := range bytesBy {
		ch <- prometheus.MustNewConstMetric(s.bytesDesc, prometheus.GaugeValue, float64(n), sink)
		ch <- prometheus.MustNewConstMetric(s.recordsDesc, prometheus.GaugeValue, float64(recordsBy[sink]), sink)
	}
}
