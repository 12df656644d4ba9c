package spool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/edgepipe/edgepipe/internal/rtld/statefile"
)

// Reader reads the spool for one sink from its persisted cursor.
type Reader struct {
	s         *Spool
	name      string
	cursor    *statefile.File
	committed Position // persisted; guarded by s.mu
	read      Position // next entry to hand out; reader goroutine only
	file      *os.File
	fileSeg   uint64
	pieces    []byte // reused to check the rest of entries read in prefixes
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
	return filepath.Join(s.opts.Dir, "cursor-"+name+".state")
}

// legacyCursorPath is where spools before format version 2 kept cursors.
func (s *Spool) legacyCursorPath(name string) string {
	return filepath.Join(s.opts.Dir, "cursor-"+name+".json")
}

// loadReader opens a reader's cursor (converting a legacy one) and clamps
// it to the recovered log.
func (s *Spool) loadReader(name string) (*Reader, error) {
	cursor, data, err := statefile.Open(s.cursorPath(name), statefile.Options{Capacity: 256})
	if err != nil {
		return nil, fmt.Errorf("opening cursor %s: %w", name, err)
	}
	r := &Reader{s: s, name: name, cursor: cursor}
	legacy := false
	if data == nil {
		b, err := os.ReadFile(s.legacyCursorPath(name))
		switch {
		case err == nil:
			data, legacy = b, true
		case !errors.Is(err, os.ErrNotExist):
			cursor.Close()
			return nil, fmt.Errorf("reading cursor %s: %w", name, err)
		}
	}
	first := s.segments[0]
	pos := Position{Segment: first.first, Offset: first.start(), Index: first.first}
	if data != nil {
		var p Position
		if err := json.Unmarshal(data, &p); err != nil {
			s.log.Warn("spool: unreadable cursor, starting at the oldest entry", "reader", name, "err", err)
		} else {
			pos = s.clamp(p, pos)
		}
	}
	r.committed, r.read = pos, pos
	if legacy {
		// Keep the position in the new cursor before the old one goes.
		if err := r.persist(pos); err != nil {
			cursor.Close()
			return nil, err
		}
		if err := os.Remove(s.legacyCursorPath(name)); err != nil {
			s.log.Warn("spool: cannot remove the converted legacy cursor", "reader", name, "err", err)
		}
		s.log.Info("spool: converted a cursor from the previous format", "reader", name, "segment", pos.Segment, "index", pos.Index)
	}
	return r, nil
}

// clamp fits a persisted position to the recovered log; oldest is the
// log's first position.
func (s *Spool) clamp(p, oldest Position) Position {
	end := s.end()
	seg := s.segmentAt(p)
	switch {
	case p.Index >= end.Index || p.Segment > end.Segment:
		return end
	case seg == nil:
		// Its segment is gone: everything before the oldest segment was
		// delivered by this reader (deletion waits for every reader).
		return oldest
	case p.Offset > seg.size:
		return Position{Segment: seg.first, Offset: seg.size, Index: seg.next}
	case p.Offset < seg.start():
		return Position{Segment: seg.first, Offset: seg.start(), Index: seg.first}
	}
	return p
}

// Next returns up to maxEntries entries (and at least one) totalling about
// maxBytes after the last one handed out, waiting until one is available or
// ctx ends. The reader's persisted position moves only with Commit, so after
// a crash delivery resumes at the last committed entry.
func (r *Reader) Next(ctx context.Context, maxEntries int, maxBytes int64) ([]Entry, error) {
	return r.next(ctx, maxEntries, maxBytes, 0)
}

// NextPrefixes is Next for a reader that needs only the start of each
// entry: Data holds at most the first prefix bytes of the payload (the
// whole payload is still read and checked, in pieces), so big entries are
// never held in memory whole.
func (r *Reader) NextPrefixes(ctx context.Context, maxEntries, prefix int) ([]Entry, error) {
	return r.next(ctx, maxEntries, int64(maxEntries)*int64(prefix), int64(prefix))
}

func (r *Reader) next(ctx context.Context, maxEntries int, maxBytes, keep int64) ([]Entry, error) {
	// Hold no segment open between calls: a deleted segment's space is
	// freed only when its last descriptor closes.
	defer r.closeFile()
	for {
		out, wait, err := r.fill(maxEntries, maxBytes, keep)
		if len(out) > 0 || err != nil {
			return out, err
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

// fill reads what is available after r.read, up to maxEntries and about
// maxBytes; with nothing available it returns the channel that signals the
// next append.
func (r *Reader) fill(maxEntries int, maxBytes, keep int64) ([]Entry, <-chan struct{}, error) {
	var out []Entry
	var total int64
	for {
		r.s.mu.Lock()
		if r.s.closed {
			r.s.mu.Unlock()
			return nil, nil, ErrClosed
		}
		wait := r.s.notify
		seg := r.s.segmentAt(r.read)
		if seg == nil || r.read.Offset >= seg.size {
			// Move past a finished (or deleted) segment.
			for _, sg := range r.s.segments {
				if sg.first > r.read.Segment {
					r.read = Position{Segment: sg.first, Offset: sg.start(), Index: sg.first}
					seg = sg
					break
				}
			}
		}
		if seg != nil && r.read.Offset < seg.size && len(out) < maxEntries && total < maxBytes {
			s := *seg
			damaged := r.s.damaged[seg.first]
			r.s.mu.Unlock()
			entries, err := r.readSegment(&s, damaged, maxEntries-len(out), maxBytes-total, keep, len(out) > 0)
			if err != nil || (len(entries) == 0 && len(out) > 0) {
				// An error, or the next entry would pass maxBytes.
				return append(out, entries...), nil, err
			}
			out = append(out, entries...)
			for _, e := range entries {
				total += int64(len(e.Data))
			}
			continue
		}
		r.s.mu.Unlock()
		return out, wait, nil
	}
}

// ReadFrom returns up to maxEntries entries totalling about maxBytes from
// position p (an Entry's Next, or Committed), or none when p is the end of
// the log. It neither waits nor moves the reader: a sink reads again with
// it what it let go of while the reader went on (the Kafka worker's
// partitions that fell behind). p must not be before Committed.
func (r *Reader) ReadFrom(p Position, maxEntries int, maxBytes int64) ([]Entry, error) {
	tmp := &Reader{s: r.s, name: r.name, read: p}
	defer tmp.closeFile()
	out, _, err := tmp.fill(maxEntries, maxBytes, 0)
	return out, err
}

// Rewind makes Next continue after the committed position, handing out
// again what it handed out since. Call it from the goroutine calling Next.
func (r *Reader) Rewind() { r.read = r.Committed() }

// readSegment reads entries of seg (a copy taken under s.mu) from r.read,
// up to maxEntries and maxBytes (one entry even beyond it unless some are
// already out), skipping the known damaged spans and quarantining damage
// it finds.
func (r *Reader) readSegment(seg *segment, damaged []span, maxEntries int, maxBytes, keep int64, haveSome bool) ([]Entry, error) {
	if err := r.openSegment(seg); err != nil {
		return nil, err
	}
	sf := segmentFile{r: r.file, version: seg.version, start: seg.start()}
	var out []Entry
	var total int64
	for r.read.Offset < seg.size && len(out) < maxEntries {
		if to, ok := skip(damaged, r.read.Offset); ok {
			r.read.Offset = to
			continue
		}
		// Stop before an entry that would pass maxBytes: a group of big
		// entries must not grow past it by a whole entry.
		if (haveSome || len(out) > 0) && nextPasses(&sf, r.read.Offset, keep, total, maxBytes) {
			break
		}
		fr, err := r.readFrameTwice(&sf, seg, readOpts{alloc: true, keep: keep, pieces: &r.pieces})
		if isDamage(err) {
			// Damage found twice: quarantine and skip it like recovery.
			r.skipDamage(sf, seg)
			continue
		}
		if err != nil {
			return out, fmt.Errorf("reading spool entry %d of %s: %w", r.read.Index, filepath.Base(seg.path), err)
		}
		r.read = Position{Segment: seg.first, Offset: fr.end, Index: fr.index + 1}
		out = append(out, Entry{Index: fr.index, Time: time.Unix(0, fr.time), Data: fr.data, Next: r.read})
		total += int64(len(fr.data))
	}
	return out, nil
}

// openSegment makes r.file the file of seg, unless it is already.
func (r *Reader) openSegment(seg *segment) error {
	if r.file != nil && r.fileSeg == seg.first {
		return nil
	}
	r.closeFile()
	f, err := os.Open(seg.path)
	if err != nil {
		return fmt.Errorf("opening spool segment: %w", err)
	}
	r.file, r.fileSeg = f, seg.first
	return nil
}

// nextPasses reports whether the entry at off, of which keep bytes are
// read (all when keep is 0), would take total past maxBytes. An entry whose
// length cannot be read does not: reading it finds the damage.
func nextPasses(sf *segmentFile, off, keep, total, maxBytes int64) bool {
	n, ok := sf.payloadLen(off)
	if !ok {
		return false
	}
	if keep > 0 {
		n = min(n, keep)
	}
	return total+n > maxBytes
}

// readFrameTwice reads the entry of seg at r.read, and once more when the
// first read finds damage: a transient read error looks the same.
func (r *Reader) readFrameTwice(sf *segmentFile, seg *segment, o readOpts) (frame, error) {
	fr, err := sf.readFrame(r.read.Offset, seg.size, r.read.Index, o)
	if isDamage(err) {
		fr, err = sf.readFrame(r.read.Offset, seg.size, r.read.Index, o)
	}
	return fr, err
}

// skip returns the end of the known damaged span starting at off.
func skip(damaged []span, off int64) (int64, bool) {
	for _, sp := range damaged {
		if sp.from == off {
			return sp.to, true
		}
	}
	return 0, false
}

// skipDamage quarantines the damage at r.read and moves past it to the
// next intact entry of seg, or to its end.
func (r *Reader) skipDamage(sf segmentFile, seg *segment) {
	from := r.read.Offset
	at, fr, found := sf.resync(from+1, seg.size, r.read.Index, nil)
	to, lost := seg.size, uint64(1)
	if found {
		to, lost = at, fr.index-r.read.Index
	}
	r.s.quarantine(r.file, seg, from, to, lost, "reader "+r.name)
	r.read.Offset = to
	if found {
		r.read.Index = fr.index
	}
}

func (r *Reader) closeFile() {
	if r.file != nil {
		_ = r.file.Close()
		r.file = nil
	}
}

func (r *Reader) close() error {
	r.closeFile()
	return r.cursor.Close()
}

// Commit persists p (an Entry's Next) as the reader's position and deletes
// segments every reader has passed. The cursor is rewritten in place, so a
// commit needs no free disk space.
func (r *Reader) Commit(p Position) error {
	if err := r.persist(p); err != nil {
		return err
	}
	r.s.mu.Lock()
	r.committed = p
	r.s.mu.Unlock()
	r.s.deleteDelivered()
	return nil
}

func (r *Reader) persist(p Position) error {
	data, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encoding cursor: %w", err)
	}
	if err := r.cursor.Write(data); err != nil {
		return fmt.Errorf("committing cursor %s: %w", r.name, err)
	}
	return nil
}

// Committed returns the reader's persisted position.
func (r *Reader) Committed() Position {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.committed
}
