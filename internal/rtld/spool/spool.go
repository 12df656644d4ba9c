// Package spool is the receiver's on-disk buffer: an append-only log of
// entries in segment files, made durable (file and directory fsync) before
// Append returns, with one persisted read position (cursor) per sink.
//
// Concurrent Appends share fsyncs (group commit). A segment is deleted once
// every reader has committed a position past it.
//
// At Open, recovery reads every segment. A torn tail (a crash in the middle
// of a write, which was never acknowledged) can only be at the end of the
// newest segment, and is cut off. Damage anywhere else is corruption: the
// damaged bytes are copied into a quarantine file beside the segment
// (<segment>.<offset>.corrupt), reading resumes at the next intact entry
// (entries carry a sync marker and a header checksum), everything else is
// delivered, and the damage is logged at error level and counted in
// Stats. Readers that meet damage later (bytes rotting on disk) do the
// same.
//
// On a full disk Append fails with ErrNoSpace and Full reports true until
// space returns; readers keep reading and committing, because a cursor is
// rewritten in place and needs no new space (package statefile).
//
// The files in the directory: <first-index, 20 digits>.seg segments (see
// codec.go for the format), cursor-<reader>.state cursors, and
// *.corrupt quarantined bytes. Spools written before the format had a
// version (segments without a header, cursor-<reader>.json cursors) are
// read after an upgrade and never written again.
//
// Why not github.com/tidwall/wal: its entries have no checksum, a torn tail
// makes Open fail instead of being cut, it has one index rather than
// several readers deciding retention, and it does not fsync the directory
// when it starts a segment.
package spool

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Errors returned by Append.
var (
	// ErrFull means the spool holds MaxBytes; the caller should ask its
	// client to retry later. Nothing was written.
	ErrFull = errors.New("spool is full")
	// ErrNoSpace means the disk is full; nothing was kept. Full reports
	// true until space returns.
	ErrNoSpace = errors.New("spool disk is full")
	// ErrClosed means the spool was closed.
	ErrClosed = errors.New("spool is closed")
	// ErrTooLarge means one entry exceeds the limit of a segment entry.
	ErrTooLarge = errors.New("entry too large for the spool")
)

const (
	// maxEntrySize bounds one payload (the length field is 32 bits).
	maxEntrySize = 1<<32 - 1 - entryOverhead
	// DefaultSegmentBytes is the size at which a new segment file starts
	// when neither Options.SegmentBytes nor Options.MaxBytes say otherwise.
	DefaultSegmentBytes = 64 << 20
	minSegmentBytes     = 1 << 20
)

// SegmentBytesFor returns the segment size Open chooses for a spool of
// maxBytes when Options.SegmentBytes is zero: a sixteenth of it in whole
// MiB, between 1 MiB and DefaultSegmentBytes, so a small spool still rolls
// and frees segments.
func SegmentBytesFor(maxBytes int64) int64 {
	if maxBytes <= 0 {
		return DefaultSegmentBytes
	}
	return min(max(maxBytes/16/minSegmentBytes*minSegmentBytes, minSegmentBytes), DefaultSegmentBytes)
}

// MinMaxBytes returns the smallest MaxBytes that cannot wedge: retention
// frees whole segments, so the bound must hold the segment being written
// and one more, each with room for the largest entry.
func MinMaxBytes(segmentBytes, maxEntryBytes int64) int64 {
	return 2 * (segmentBytes + maxEntryBytes + entryOverhead + segHeaderSize)
}

// Options configure Open.
type Options struct {
	// Dir holds the segment and cursor files; it is created if missing.
	Dir string
	// MaxBytes bounds the total size of the segment files; Append returns
	// ErrFull beyond it. Zero means no bound.
	MaxBytes int64
	// SegmentBytes is the size at which a new segment starts (zero:
	// SegmentBytesFor(MaxBytes)).
	SegmentBytes int64
	// MaxEntryBytes is the largest payload the caller appends; Open refuses
	// a MaxBytes below MinMaxBytes(SegmentBytes, MaxEntryBytes) and Append
	// refuses bigger payloads with ErrTooLarge. Zero: not checked.
	MaxEntryBytes int64
	// Readers names the sinks that read the spool. Each gets a cursor; a
	// segment is deleted only when all of them have passed it.
	Readers []string
	// Logger receives recovery, corruption and deletion notes (default
	// slog.Default()).
	Logger *slog.Logger

	// noSync skips fsync, for the package's own tests.
	noSync bool
}

// Position is a place in the spool: the segment (named by its first entry
// index), the byte offset in it, and the index of the entry that starts there.
type Position struct {
	Segment uint64 `json:"segment"`
	Offset  int64  `json:"offset"`
	Index   uint64 `json:"index"`
}

// Entry is one spooled payload.
type Entry struct {
	// Index is the entry's position in the log (monotonic, never reused).
	Index uint64
	// Time is when the entry was appended.
	Time time.Time
	// Data is the payload as given to Append.
	Data []byte
	// Next is the position just after this entry: commit it once the entry
	// is delivered.
	Next Position
}

type segment struct {
	first   uint64 // index of the first entry (the file's name)
	next    uint64 // index after the last entry
	size    int64  // bytes readable (committed)
	version int    // format version (1: legacy, read only)
	path    string
}

// start is the offset of the segment's first entry.
func (s *segment) start() int64 {
	if s.version == 1 {
		return 0
	}
	return segHeaderSize
}

// span is a damaged byte range of a segment, known and quarantined.
type span struct{ from, to int64 }

// Spool is the on-disk log. It is safe for concurrent use.
type Spool struct {
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	segments []*segment // ordered; the last one is active
	reserved int64      // bytes of Appends accepted but not yet written
	total    int64      // bytes of all segments
	notify   chan struct{}
	readers  map[string]*Reader
	closed   bool
	// rejecting is set when an Append was refused for space and cleared
	// when segments are deleted, so Full reports what Append would do.
	rejecting bool
	// noSpace is set when a write met a full disk, and cleared when
	// segments are deleted or a probe finds space again.
	noSpace   bool
	lastProbe time.Time
	// reclaim asks the writer to replace the active segment, which every
	// reader has passed, by a new one so it can be deleted (the disk is
	// full and the active segment holds the space).
	reclaim bool
	// damaged lists the known damaged spans per segment, so readers skip
	// them and each is quarantined and counted once.
	damaged        map[uint64][]span
	corruptBytes   int64
	corruptEntries int64

	active *os.File // the last segment, open for appending (writer goroutine only)

	reqs chan appendReq
	stop chan struct{}
	wg   sync.WaitGroup
	// sending orders Appends' queueing before Close: Close takes it
	// exclusively, so no request is queued after the writer's last drain.
	sending    sync.RWMutex
	sendClosed bool
}

// withDefaults returns o with every unset field set to its default.
func (o Options) withDefaults() Options {
	if o.SegmentBytes == 0 {
		o.SegmentBytes = SegmentBytesFor(o.MaxBytes)
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
	for _, f := range []struct {
		name string
		v    int64
	}{{"MaxBytes", o.MaxBytes}, {"SegmentBytes", o.SegmentBytes}, {"MaxEntryBytes", o.MaxEntryBytes}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("%s %d: must not be negative", f.name, f.v))
		}
	}
	if o.MaxBytes > 0 && o.MaxEntryBytes > 0 {
		if need := MinMaxBytes(o.SegmentBytes, o.MaxEntryBytes); o.MaxBytes < need {
			errs = append(errs, fmt.Errorf("size bound of %d bytes cannot work: it must hold two segments of %d bytes, each with room for an entry of %d bytes, at least %d bytes",
				o.MaxBytes, o.SegmentBytes, o.MaxEntryBytes, need))
		}
	}
	return errors.Join(errs...)
}

// Open opens or creates the spool in opts.Dir, recovers it and starts its
// writer. Close it to stop the writer.
func Open(opts Options) (*Spool, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("spool: invalid options: %w", err)
	}
	if err := os.MkdirAll(opts.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("creating spool directory: %w", err)
	}
	s := &Spool{
		opts:    opts,
		log:     opts.Logger,
		notify:  make(chan struct{}),
		readers: map[string]*Reader{},
		damaged: map[uint64][]span{},
		reqs:    make(chan appendReq, 1024),
		stop:    make(chan struct{}),
	}
	if err := s.recover(); err != nil {
		return nil, errors.Join(err, s.closeFiles())
	}
	for _, name := range opts.Readers {
		r, err := s.loadReader(name)
		if err != nil {
			return nil, errors.Join(err, s.closeFiles())
		}
		s.readers[name] = r
	}
	s.deleteDelivered()
	s.wg.Add(1)
	go s.writer()
	return s, nil
}

func segPath(dir string, first uint64) string {
	return filepath.Join(dir, fmt.Sprintf("%020d.seg", first))
}

func (s *Spool) syncDir() error {
	if s.opts.noSync {
		return nil
	}
	d, err := os.Open(s.opts.Dir)
	if err != nil {
		return fmt.Errorf("opening spool directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing spool directory: %w", err)
	}
	return nil
}

func (s *Spool) sync(f *os.File) error {
	if s.opts.noSync {
		return nil
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing spool segment: %w", err)
	}
	return nil
}

// end returns the committed end of the log. Callers hold s.mu.
func (s *Spool) end() Position {
	last := s.segments[len(s.segments)-1]
	return Position{Segment: last.first, Offset: last.size, Index: last.next}
}

// segmentAt returns the segment holding p. Callers hold s.mu.
func (s *Spool) segmentAt(p Position) *segment {
	for _, seg := range s.segments {
		if seg.first == p.Segment {
			return seg
		}
	}
	return nil
}

// Full reports whether Append would be refused for space: the spool holds
// MaxBytes (or an Append was refused for it and no segment was deleted
// since), or the disk was full at the last write and still is.
func (s *Spool) Full() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.noSpace {
		s.probeSpace()
	}
	return s.noSpace || (s.opts.MaxBytes > 0 && (s.rejecting || s.total+s.reserved >= s.opts.MaxBytes))
}

// Close stops the writer, fails queued Appends with ErrClosed and closes
// the files. Readers must not be used afterwards.
func (s *Spool) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.sending.Lock()
	s.sendClosed = true
	s.sending.Unlock()
	close(s.stop)
	s.wg.Wait()
	return s.closeFiles()
}

func (s *Spool) closeFiles() error {
	var errs []error
	if s.active != nil {
		errs = append(errs, s.active.Close())
	}
	for _, r := range s.readers {
		errs = append(errs, r.close())
	}
	return errors.Join(errs...)
}

// Stats describes the spool's backlog and the damage found in it.
type Stats struct {
	// Bytes is the size of all segment files.
	Bytes int64
	// Entries is the number of entries some reader has not yet committed.
	Entries uint64
	// OldestTime is the append time of the oldest entry some reader has not
	// committed; zero when every reader is caught up.
	OldestTime time.Time
	// Readers holds each reader's lag.
	Readers map[string]Lag
	// CorruptBytes and CorruptEntries count the damaged bytes quarantined
	// since Open, and the entries they held.
	CorruptBytes, CorruptEntries int64
	// NoSpace is set while the disk is full.
	NoSpace bool
}

// Lag is how far one reader is behind the end of the log.
type Lag struct {
	Entries uint64
	Bytes   int64
}

// Stats returns the current backlog.
func (s *Spool) Stats() Stats {
	s.mu.Lock()
	if s.noSpace {
		s.probeSpace()
	}
	end := s.end()
	st := Stats{Bytes: s.total, Readers: map[string]Lag{}, CorruptBytes: s.corruptBytes, CorruptEntries: s.corruptEntries, NoSpace: s.noSpace}
	var minPos *Position
	for name, r := range s.readers {
		p := r.committed
		st.Readers[name] = Lag{Entries: end.Index - min(p.Index, end.Index), Bytes: s.bytesAfter(p)}
		if minPos == nil || p.Index < minPos.Index {
			pp := p
			minPos = &pp
		}
	}
	var oldest *segment
	var off int64
	if minPos != nil && minPos.Index < end.Index {
		st.Entries = end.Index - minPos.Index
		oldest, off = s.entryAt(*minPos)
	}
	s.mu.Unlock()
	if oldest != nil {
		if t, err := entryTime(oldest, off); err == nil {
			st.OldestTime = time.Unix(0, t)
		}
	}
	return st
}

// entryAt returns where the first entry at or after p starts (nil when
// there is none). Callers hold s.mu.
func (s *Spool) entryAt(p Position) (*segment, int64) {
	for _, seg := range s.segments {
		switch {
		case seg.first == p.Segment && p.Offset < seg.size:
			return seg, p.Offset
		case seg.first > p.Segment && seg.size > seg.start():
			return seg, seg.start()
		}
	}
	return nil, 0
}

// bytesAfter counts the log bytes after p. Callers hold s.mu.
func (s *Spool) bytesAfter(p Position) int64 {
	var n int64
	for _, seg := range s.segments {
		switch {
		case seg.first > p.Segment:
			n += max(seg.size-seg.start(), 0)
		case seg.first == p.Segment:
			n += max(seg.size-max(p.Offset, seg.start()), 0)
		}
	}
	return n
}

func entryTime(seg *segment, off int64) (int64, error) {
	f, err := os.Open(seg.path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sf := segmentFile{r: f, version: seg.version, start: seg.start()}
	return sf.timeAt(off)
}

// OldestPending returns the append time of the oldest entry the named
// reader has not committed, and false when it has committed every entry
// (or has no such name): every entry appended before the returned time has
// been committed by that reader.
func (s *Spool) OldestPending(reader string) (time.Time, bool) {
	s.mu.Lock()
	r, ok := s.readers[reader]
	if !ok || r.committed.Index >= s.end().Index {
		s.mu.Unlock()
		return time.Time{}, false
	}
	seg, off := s.entryAt(r.committed)
	s.mu.Unlock()
	if seg == nil {
		return time.Time{}, false
	}
	t, err := entryTime(seg, off)
	if err != nil {
		// Unreadable (damaged, or deleted meanwhile): the caller must not
		// take the reader for caught up.
		return time.Unix(0, 0), true
	}
	return time.Unix(0, t), true
}
