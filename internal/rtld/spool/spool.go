// Package spool is the receiver's on-disk buffer: an append-only log of
// entries in segment files, made durable (file and directory fsync) before
// Append returns, with one persisted read position (cursor) per sink.
//
// Concurrent Appends share fsyncs (group commit). A segment is deleted once
// every reader has committed a position past it. At Open, a torn or corrupt
// tail (a crash in the middle of a write, which was never acknowledged) is
// detected by each entry's length and CRC-32C and cut off.
//
// On-disk layout: <dir>/<first-index, 20 digits>.seg files of entries
// [uint32 length][uint32 crc32c(time+payload)][int64 unix-nano time][payload],
// little endian, and <dir>/cursor-<reader>.json with the reader's position.
//
// Why not github.com/tidwall/wal: its entries have no checksum, a torn tail
// makes Open fail instead of being cut, it has one index rather than
// several readers deciding retention, and it does not fsync the directory
// when it starts a segment.
package spool

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Errors returned by Append.
var (
	// ErrFull means the spool holds MaxBytes; the caller should ask its
	// client to retry later. Nothing was written.
	ErrFull = errors.New("spool is full")
	// ErrClosed means the spool was closed.
	ErrClosed = errors.New("spool is closed")
	// ErrTooLarge means one entry exceeds the limit of a segment entry.
	ErrTooLarge = errors.New("entry too large for the spool")
)

const (
	headerSize = 16
	// maxEntrySize bounds one entry (the length field is 32 bits, and a
	// bigger entry would point at a corrupt header at recovery).
	maxEntrySize = 1 << 30
	// DefaultSegmentBytes is the size at which a new segment file starts.
	DefaultSegmentBytes = 64 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Options configure Open.
type Options struct {
	// Dir holds the segment and cursor files; it is created if missing.
	Dir string
	// MaxBytes bounds the total size of the segment files; Append returns
	// ErrFull beyond it. Zero means no bound.
	MaxBytes int64
	// SegmentBytes is the size at which a new segment starts (default
	// DefaultSegmentBytes).
	SegmentBytes int64
	// Readers names the sinks that read the spool. Each gets a cursor; a
	// segment is deleted only when all of them have passed it.
	Readers []string
	// Logger receives recovery and deletion notes (default slog.Default()).
	Logger *slog.Logger
	// NoSync skips fsync, for benchmarks that measure everything else. Never
	// use it in production.
	NoSync bool
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
	first uint64 // index of the first entry
	count uint64 // entries
	size  int64  // bytes (committed)
	path  string
}

type appendReq struct {
	data []byte
	time int64
	done chan error
}

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

	active *os.File // the last segment, open for appending (writer goroutine only)

	reqs chan appendReq
	stop chan struct{}
	wg   sync.WaitGroup
	// sending orders Appends' queueing before Close: Close takes it
	// exclusively, so no request is queued after the writer's last drain.
	sending    sync.RWMutex
	sendClosed bool
}

var segName = regexp.MustCompile(`^(\d{20})\.seg$`)

func segPath(dir string, first uint64) string {
	return filepath.Join(dir, fmt.Sprintf("%020d.seg", first))
}

// Open opens or creates the spool in opts.Dir, recovers it and starts its
// writer. Close it to stop the writer.
func Open(opts Options) (*Spool, error) {
	if opts.SegmentBytes <= 0 {
		opts.SegmentBytes = DefaultSegmentBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if err := os.MkdirAll(opts.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("creating spool directory: %w", err)
	}
	s := &Spool{
		opts:    opts,
		log:     opts.Logger,
		notify:  make(chan struct{}),
		readers: map[string]*Reader{},
		reqs:    make(chan appendReq, 1024),
		stop:    make(chan struct{}),
	}
	if err := s.recover(); err != nil {
		return nil, err
	}
	for _, name := range opts.Readers {
		r, err := s.loadReader(name)
		if err != nil {
			s.closeFiles()
			return nil, err
		}
		s.readers[name] = r
	}
	s.deleteDelivered()
	s.wg.Add(1)
	go s.writer()
	return s, nil
}

// recover scans every segment, cuts torn or corrupt tails and opens the last
// segment for appending.
func (s *Spool) recover() error {
	names, err := os.ReadDir(s.opts.Dir)
	if err != nil {
		return fmt.Errorf("reading spool directory: %w", err)
	}
	for _, de := range names {
		if strings.HasSuffix(de.Name(), ".tmp") {
			_ = os.Remove(filepath.Join(s.opts.Dir, de.Name()))
			continue
		}
		m := segName.FindStringSubmatch(de.Name())
		if m == nil {
			continue
		}
		first, _ := strconv.ParseUint(m[1], 10, 64)
		seg := &segment{first: first, path: filepath.Join(s.opts.Dir, de.Name())}
		if err := s.scan(seg); err != nil {
			return err
		}
		s.segments = append(s.segments, seg)
	}
	slices.SortFunc(s.segments, func(a, b *segment) int {
		switch {
		case a.first < b.first:
			return -1
		case a.first > b.first:
			return 1
		}
		return 0
	})
	// Drop empty segments except the last, and check the indexes grow.
	kept := s.segments[:0]
	for i, seg := range s.segments {
		if seg.count == 0 && i != len(s.segments)-1 {
			_ = os.Remove(seg.path)
			continue
		}
		kept = append(kept, seg)
	}
	s.segments = kept
	if len(s.segments) == 0 {
		seg := &segment{first: 0, path: segPath(s.opts.Dir, 0)}
		s.segments = append(s.segments, seg)
	}
	for _, seg := range s.segments {
		s.total += seg.size
	}
	last := s.segments[len(s.segments)-1]
	f, err := os.OpenFile(last.path, os.O_CREATE|os.O_WRONLY, 0o640)
	if err != nil {
		return fmt.Errorf("opening spool segment: %w", err)
	}
	if _, err := f.Seek(last.size, io.SeekStart); err != nil {
		f.Close()
		return fmt.Errorf("seeking spool segment: %w", err)
	}
	s.active = f
	return s.syncDir()
}

// scan counts seg's valid entries and truncates the file after the last one.
func (s *Spool) scan(seg *segment) error {
	f, err := os.OpenFile(seg.path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("opening spool segment: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat spool segment: %w", err)
	}
	var off int64
	var hdr [headerSize]byte
	var buf []byte
	for {
		if st.Size()-off < headerSize {
			break
		}
		if _, err := f.ReadAt(hdr[:], off); err != nil {
			return fmt.Errorf("reading spool segment %s: %w", seg.path, err)
		}
		n := int64(binary.LittleEndian.Uint32(hdr[0:4]))
		if n > maxEntrySize || off+headerSize+n > st.Size() {
			break
		}
		if int64(cap(buf)) < n+8 {
			buf = make([]byte, n+8)
		}
		buf = buf[:n+8]
		copy(buf, hdr[8:16])
		if _, err := f.ReadAt(buf[8:], off+headerSize); err != nil {
			return fmt.Errorf("reading spool segment %s: %w", seg.path, err)
		}
		if crc32.Checksum(buf, castagnoli) != binary.LittleEndian.Uint32(hdr[4:8]) {
			break
		}
		off += headerSize + n
		seg.count++
	}
	if off != st.Size() {
		s.log.Warn("spool: discarding torn or corrupt tail (never acknowledged)",
			"segment", filepath.Base(seg.path), "valid_bytes", off, "discarded_bytes", st.Size()-off, "entries", seg.count)
		if err := f.Truncate(off); err != nil {
			return fmt.Errorf("truncating spool segment: %w", err)
		}
		if !s.opts.NoSync {
			if err := f.Sync(); err != nil {
				return fmt.Errorf("syncing spool segment: %w", err)
			}
		}
	}
	seg.size = off
	return nil
}

func (s *Spool) syncDir() error {
	if s.opts.NoSync {
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

// end returns the committed end of the log. Callers hold s.mu.
func (s *Spool) end() Position {
	last := s.segments[len(s.segments)-1]
	return Position{Segment: last.first, Offset: last.size, Index: last.first + last.count}
}

// Append writes data as one entry and returns once it is on disk (fsynced,
// together with any concurrent Appends). It returns ErrFull without writing
// when the spool is at its size bound.
func (s *Spool) Append(ctx context.Context, data []byte) error {
	if len(data) > maxEntrySize-8 {
		return ErrTooLarge
	}
	size := int64(len(data)) + headerSize
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	if s.opts.MaxBytes > 0 && s.total+s.reserved+size > s.opts.MaxBytes && s.total+s.reserved > 0 {
		s.rejecting = true
		s.mu.Unlock()
		return ErrFull
	}
	s.reserved += size
	s.mu.Unlock()
	req := appendReq{data: data, time: time.Now().UnixNano(), done: make(chan error, 1)}
	s.sending.RLock()
	if s.sendClosed {
		s.sending.RUnlock()
		s.unreserve(size)
		return ErrClosed
	}
	select {
	case s.reqs <- req:
		s.sending.RUnlock()
	case <-ctx.Done():
		s.sending.RUnlock()
		s.unreserve(size)
		return fmt.Errorf("spool append: %w", ctx.Err())
	}
	// Once queued, the write happens whatever the context says: wait for
	// it so the caller knows whether the entry is durable.
	return <-req.done
}

func (s *Spool) unreserve(n int64) {
	s.mu.Lock()
	s.reserved -= n
	s.mu.Unlock()
}

// Full reports whether the spool is at its size bound: it holds MaxBytes,
// or an Append was refused for space and no segment was deleted since.
func (s *Spool) Full() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.MaxBytes > 0 && (s.rejecting || s.total+s.reserved >= s.opts.MaxBytes)
}

// writer owns the active segment: it gathers queued Appends, writes them,
// fsyncs once and answers them all.
func (s *Spool) writer() {
	defer s.wg.Done()
	var batch []appendReq
	var buf []byte
	for {
		batch = batch[:0]
		select {
		case r := <-s.reqs:
			batch = append(batch, r)
		case <-s.stop:
			s.drainClosed()
			return
		}
	gather:
		for len(batch) < 4096 {
			select {
			case r := <-s.reqs:
				batch = append(batch, r)
			default:
				break gather
			}
		}
		err := s.writeBatch(batch, &buf)
		for _, r := range batch {
			r.done <- err
		}
	}
}

func (s *Spool) drainClosed() {
	for {
		select {
		case r := <-s.reqs:
			s.unreserve(int64(len(r.data)) + headerSize)
			r.done <- ErrClosed
		default:
			return
		}
	}
}

// writeBatch appends the requests, rolling segments as needed, and syncs.
func (s *Spool) writeBatch(batch []appendReq, buf *[]byte) error {
	var reserved int64
	for _, r := range batch {
		reserved += int64(len(r.data)) + headerSize
	}
	defer s.unreserve(reserved)

	s.mu.Lock()
	last := s.segments[len(s.segments)-1]
	size, count := last.size, last.count
	s.mu.Unlock()

	newDir := false
	b := (*buf)[:0]
	flush := func() error {
		if len(b) == 0 {
			return nil
		}
		_, err := s.active.Write(b)
		b = b[:0]
		if err != nil {
			return fmt.Errorf("writing spool segment: %w", err)
		}
		return nil
	}
	// size and count include the bytes buffered in b.
	for _, r := range batch {
		n := int64(len(r.data)) + headerSize
		if size > 0 && size+n > s.opts.SegmentBytes {
			// Roll: finish the active segment, publish it, start the next.
			if err := flush(); err != nil {
				return s.writeFailed(err)
			}
			if err := s.sync(s.active); err != nil {
				return s.writeFailed(err)
			}
			next := &segment{first: last.first + count, path: segPath(s.opts.Dir, last.first+count)}
			f, err := os.OpenFile(next.path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
			if err != nil {
				return s.writeFailed(fmt.Errorf("creating spool segment: %w", err))
			}
			_ = s.active.Close()
			s.active = f
			newDir = true
			s.mu.Lock()
			s.total += size - last.size
			last.size, last.count = size, count
			s.segments = append(s.segments, next)
			s.mu.Unlock()
			last, size, count = next, 0, 0
		}
		var hdr [headerSize]byte
		binary.LittleEndian.PutUint32(hdr[0:4], uint32(len(r.data)))
		binary.LittleEndian.PutUint64(hdr[8:16], uint64(r.time))
		crc := crc32.Update(0, castagnoli, hdr[8:16])
		crc = crc32.Update(crc, castagnoli, r.data)
		binary.LittleEndian.PutUint32(hdr[4:8], crc)
		b = append(b, hdr[:]...)
		b = append(b, r.data...)
		size += n
		count++
		if len(b) >= 4<<20 {
			if err := flush(); err != nil {
				return s.writeFailed(err)
			}
		}
	}
	if err := flush(); err != nil {
		return s.writeFailed(err)
	}
	if cap(b) <= 8<<20 {
		*buf = b
	}
	if err := s.sync(s.active); err != nil {
		return s.writeFailed(err)
	}
	if newDir {
		if err := s.syncDir(); err != nil {
			return s.writeFailed(err)
		}
	}
	s.mu.Lock()
	s.total += size - last.size
	last.size, last.count = size, count
	close(s.notify)
	s.notify = make(chan struct{})
	s.mu.Unlock()
	return nil
}

func (s *Spool) sync(f *os.File) error {
	if s.opts.NoSync {
		return nil
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing spool segment: %w", err)
	}
	return nil
}

// writeFailed cuts the active segment back to its last published size, so
// a failed write leaves no partial entry behind, and returns err.
func (s *Spool) writeFailed(err error) error {
	s.mu.Lock()
	last := s.segments[len(s.segments)-1]
	committed := last.size
	if len(s.segments) > 1 || committed > 0 {
		// Readers may have been woken for a rolled segment already.
		close(s.notify)
		s.notify = make(chan struct{})
	}
	s.mu.Unlock()
	if terr := s.active.Truncate(committed); terr == nil {
		_, _ = s.active.Seek(committed, io.SeekStart)
	} else {
		s.log.Error("spool: cannot cut a failed write", "segment", filepath.Base(last.path), "err", terr)
	}
	s.log.Error("spool: write failed", "err", err)
	return err
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
		r.closeFile()
	}
	return errors.Join(errs...)
}

// Stats describes the spool's backlog.
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
}

// Lag is how far one reader is behind the end of the log.
type Lag struct {
	Entries uint64
	Bytes   int64
}

// Stats returns the current backlog.
func (s *Spool) Stats() Stats {
	s.mu.Lock()
	end := s.end()
	st := Stats{Bytes: s.total, Readers: map[string]Lag{}}
	var minPos *Position
	for name, r := range s.readers {
		p := r.committed
		st.Readers[name] = Lag{Entries: end.Index - p.Index, Bytes: s.bytesAfter(p)}
		if minPos == nil || p.Index < minPos.Index {
			pp := p
			minPos = &pp
		}
	}
	var path string
	if minPos != nil && minPos.Index < end.Index {
		st.Entries = end.Index - minPos.Index
		if seg := s.segmentAt(*minPos); seg != nil && minPos.Offset < seg.size {
			path = seg.path
		} else if seg != nil {
			// At the end of a full segment: the next one starts the backlog.
			for _, sg := range s.segments {
				if sg.first > seg.first {
					*minPos = Position{Segment: sg.first}
					path = sg.path
					break
				}
			}
		}
	}
	s.mu.Unlock()
	if path != "" {
		if t, err := entryTime(path, minPos.Offset); err == nil {
			st.OldestTime = t
		}
	}
	return st
}

// bytesAfter counts the log bytes after p. Callers hold s.mu.
func (s *Spool) bytesAfter(p Position) int64 {
	var n int64
	for _, seg := range s.segments {
		switch {
		case seg.first > p.Segment:
			n += seg.size
		case seg.first == p.Segment:
			n += seg.size - p.Offset
		}
	}
	return n
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

func entryTime(path string, off int64) (time.Time, error) {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}, err
	}
	defer f.Close()
	var hdr [headerSize]byte
	if _, err := f.ReadAt(hdr[:], off); err != nil {
		return time.Time{}, err
	}
	return time.Unix(0, int64(binary.LittleEndian.Uint64(hdr[8:16]))), nil
}

// deleteDelivered removes segments every reader has passed.
func (s *Spool) deleteDelivered() {
	s.mu.Lock()
	if len(s.readers) == 0 {
		s.mu.Unlock()
		return
	}
	var minSeg uint64 = ^uint64(0)
	for _, r := range s.readers {
		if r.committed.Segment < minSeg {
			minSeg = r.committed.Segment
		}
	}
	var gone []*segment
	kept := s.segments[:0]
	for i, seg := range s.segments {
		if seg.first < minSeg && i != len(s.segments)-1 {
			gone = append(gone, seg)
			s.total -= seg.size
			continue
		}
		kept = append(kept, seg)
	}
	s.segments = kept
	if len(gone) > 0 {
		s.rejecting = false
	}
	s.mu.Unlock()
	for _, seg := range gone {
		if err := os.Remove(seg.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("spool: cannot delete delivered segment", "segment", filepath.Base(seg.path), "err", err)
		}
	}
}

// Reader reads the spool for one sink from its persisted cursor.
type Reader struct {
	s         *Spool
	name      string
	committed Position // persisted; guarded by s.mu
	read      Position // next entry to hand out; reader goroutine only
	file      *os.File
	fileSeg   uint64
}

// Reader returns the reader named in Options.Readers.
func (s *Spool) Reader(name string) (*Reader, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.readers[name]
	if !ok {
		return nil, fmt.Errorf("spool has no reader %q", name)
	}
	return r, nil
}

func (s *Spool) cursorPath(name string) string {
	return filepath.Join(s.opts.Dir, "cursor-"+name+".json")
}

// loadReader reads a cursor and clamps it to the recovered log.
func (s *Spool) loadReader(name string) (*Reader, error) {
	r := &Reader{s: s, name: name}
	first := s.segments[0]
	pos := Position{Segment: first.first, Index: first.first}
	data, err := os.ReadFile(s.cursorPath(name))
	switch {
	case errors.Is(err, os.ErrNotExist):
		// A new reader starts at the oldest spooled entry.
	case err != nil:
		return nil, fmt.Errorf("reading cursor %s: %w", name, err)
	default:
		var p Position
		if err := json.Unmarshal(data, &p); err != nil {
			s.log.Warn("spool: unreadable cursor, starting at the oldest entry", "reader", name, "err", err)
			break
		}
		end := s.end()
		switch seg := s.segmentAt(p); {
		case p.Index >= end.Index || p.Segment > end.Segment:
			pos = end
		case seg == nil:
			// Its segment is gone: everything before the oldest segment was
			// delivered by this reader (deletion waits for every reader).
		case p.Offset > seg.size:
			pos = Position{Segment: seg.first, Offset: seg.size, Index: seg.first + seg.count}
		default:
			pos = p
		}
	}
	r.committed, r.read = pos, pos
	return r, nil
}

// Next returns up to maxEntries entries (and at least one) totalling about
// maxBytes after the last one handed out, waiting until one is available or
// ctx ends. The reader's persisted position moves only with Commit, so after
// a crash delivery resumes at the last committed entry.
func (r *Reader) Next(ctx context.Context, maxEntries int, maxBytes int64) ([]Entry, error) {
	var out []Entry
	var total int64
	for {
		r.s.mu.Lock()
		if r.s.closed {
			r.s.mu.Unlock()
			return nil, ErrClosed
		}
		end := r.s.end()
		wait := r.s.notify
		if r.read.Index < end.Index && len(out) < maxEntries && total < maxBytes {
			// Move past a finished segment.
			seg := r.s.segmentAt(r.read)
			if seg == nil || r.read.Offset >= seg.size {
				for _, sg := range r.s.segments {
					if sg.first > r.read.Segment {
						r.read = Position{Segment: sg.first, Offset: 0, Index: sg.first}
						seg = sg
						break
					}
				}
			}
			limit := seg.size
			path := seg.path
			r.s.mu.Unlock()
			entries, err := r.readSegment(path, limit, maxEntries-len(out), maxBytes-total)
			out = append(out, entries...)
			for _, e := range entries {
				total += int64(len(e.Data))
			}
			if err != nil {
				return out, err
			}
			continue
		}
		r.s.mu.Unlock()
		if len(out) > 0 {
			return out, nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-r.s.stop:
			return nil, ErrClosed
		}
	}
}

func (r *Reader) readSegment(path string, limit int64, maxEntries int, maxBytes int64) ([]Entry, error) {
	if r.file == nil || r.fileSeg != r.read.Segment {
		r.closeFile()
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("opening spool segment: %w", err)
		}
		r.file, r.fileSeg = f, r.read.Segment
	}
	var out []Entry
	var total int64
	var hdr [headerSize]byte
	for r.read.Offset < limit && len(out) < maxEntries && (total < maxBytes || len(out) == 0) {
		if _, err := r.file.ReadAt(hdr[:], r.read.Offset); err != nil {
			return out, fmt.Errorf("reading spool entry %d: %w", r.read.Index, err)
		}
		n := int64(binary.LittleEndian.Uint32(hdr[0:4]))
		buf := make([]byte, n+8)
		copy(buf, hdr[8:16])
		if _, err := r.file.ReadAt(buf[8:], r.read.Offset+headerSize); err != nil {
			return out, fmt.Errorf("reading spool entry %d: %w", r.read.Index, err)
		}
		if crc32.Checksum(buf, castagnoli) != binary.LittleEndian.Uint32(hdr[4:8]) {
			return out, fmt.Errorf("spool entry %d in %s fails its checksum", r.read.Index, filepath.Base(path))
		}
		r.read.Offset += headerSize + n
		r.read.Index++
		out = append(out, Entry{
			Index: r.read.Index - 1,
			Time:  time.Unix(0, int64(binary.LittleEndian.Uint64(hdr[8:16]))),
			Data:  buf[8:],
			Next:  r.read,
		})
		total += n
	}
	return out, nil
}

func (r *Reader) closeFile() {
	if r.file != nil {
		_ = r.file.Close()
		r.file = nil
	}
}

// Commit persists p (an Entry's Next) as the reader's position and deletes
// segments every reader has passed.
func (r *Reader) Commit(p Position) error {
	data, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encoding cursor: %w", err)
	}
	path := r.s.cursorPath(r.name)
	tmp := path + ".tmp"
	if err := writeFileSync(tmp, data, !r.s.opts.NoSync); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replacing cursor %s: %w", r.name, err)
	}
	if err := r.s.syncDir(); err != nil {
		return err
	}
	r.s.mu.Lock()
	r.committed = p
	r.s.mu.Unlock()
	r.s.deleteDelivered()
	return nil
}

// Committed returns the reader's persisted position.
func (r *Reader) Committed() Position {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.committed
}

func writeFileSync(path string, data []byte, doSync bool) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("writing %s: %w", filepath.Base(path), err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", filepath.Base(path), err)
	}
	if doSync {
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("syncing %s: %w", filepath.Base(path), err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", filepath.Base(path), err)
	}
	return nil
}
