package spool

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"
)

// writeBufferBytes is the writer's buffer: entries are written to the file
// in pieces of about this size; bigger pieces go straight through.
const writeBufferBytes = 4 << 20

type appendReq struct {
	p    Payload
	size int64 // bytes on disk
	time int64
	done chan error
}

// Append writes data as one entry and returns once it is on disk (fsynced,
// together with any concurrent Appends). It returns ErrFull without writing
// when the spool is at its size bound, and ErrNoSpace when the disk is full.
func (s *Spool) Append(ctx context.Context, data []byte) error {
	return s.AppendPayload(ctx, bytesPayload(data))
}

// AppendPayload is Append for content the spool streams into the segment
// file (p.WriteTo runs on the spool's writer goroutine while AppendPayload
// waits, so p must not change until it returns).
func (s *Spool) AppendPayload(ctx context.Context, p Payload) error {
	n := int64(p.Size())
	if n > maxEntrySize || (s.opts.MaxEntryBytes > 0 && n > s.opts.MaxEntryBytes) {
		return ErrTooLarge
	}
	size := n + entryOverhead
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	if s.noSpace {
		s.probeSpace()
		if s.noSpace {
			s.mu.Unlock()
			return ErrNoSpace
		}
	}
	if s.opts.MaxBytes > 0 && s.total+s.reserved+size > s.opts.MaxBytes {
		s.rejecting = true
		s.mu.Unlock()
		return ErrFull
	}
	s.reserved += size
	s.mu.Unlock()
	req := appendReq{p: p, size: size, time: time.Now().UnixNano(), done: make(chan error, 1)}
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

// writer owns the active segment: it gathers queued Appends, writes them,
// fsyncs once and answers them all.
func (s *Spool) writer() {
	defer s.wg.Done()
	w := newSegmentWriter(writeBufferBytes)
	var batch []appendReq
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
		err := s.writeBatch(batch, w)
		for i := range batch {
			batch[i].done <- err
			batch[i].p = nil
		}
	}
}

func (s *Spool) drainClosed() {
	for {
		select {
		case r := <-s.reqs:
			s.unreserve(r.size)
			r.done <- ErrClosed
		default:
			return
		}
	}
}

// writeBatch appends the requests, rolling segments as needed, and syncs.
func (s *Spool) writeBatch(batch []appendReq, w *segmentWriter) error {
	var reserved int64
	for _, r := range batch {
		reserved += r.size
	}
	defer s.unreserve(reserved)

	s.mu.Lock()
	last := s.segments[len(s.segments)-1]
	size, next := last.size, last.next
	reclaim := s.reclaim && last.size > last.start() && s.passedByAll(last)
	s.reclaim = false
	s.mu.Unlock()
	w.f = s.active

	newDir := false
	if reclaim {
		// Every reader passed the whole active segment and the disk is
		// full: start the next segment (an empty file needs no space), so
		// the old one is deleted before anything is written.
		seg, f, err := s.createSegment(next)
		if err != nil {
			return s.writeFailed(err, w)
		}
		_ = s.active.Close()
		s.active, w.f = f, f
		s.mu.Lock()
		s.segments = append(s.segments, seg)
		s.mu.Unlock()
		s.deleteDelivered()
		last, size, newDir = seg, 0, true
	}
	// size and next include what was written since the last publication.
	for _, r := range batch {
		if size == 0 {
			// A new segment: its header goes in front of the first entry.
			if _, err := w.raw(encodeSegmentHeader(last.first, time.Now().UnixNano())); err != nil {
				return s.writeFailed(err, w)
			}
			size = segHeaderSize
		} else if size > last.start() && size+r.size > s.opts.SegmentBytes {
			// Roll: finish the active segment, publish it, start the next.
			if err := w.flush(); err != nil {
				return s.writeFailed(err, w)
			}
			if err := s.sync(s.active); err != nil {
				return s.writeFailed(err, w)
			}
			seg, f, err := s.createSegment(next)
			if err != nil {
				return s.writeFailed(err, w)
			}
			_ = s.active.Close()
			s.active, w.f = f, f
			newDir = true
			s.mu.Lock()
			s.total += size - last.size
			last.size, last.next = size, next
			s.segments = append(s.segments, seg)
			s.mu.Unlock()
			last = seg
			if _, err := w.raw(encodeSegmentHeader(last.first, time.Now().UnixNano())); err != nil {
				return s.writeFailed(err, w)
			}
			size = segHeaderSize
		}
		n, err := w.writeEntry(next, r.time, r.p)
		if err != nil {
			return s.writeFailed(err, w)
		}
		size += n
		next++
	}
	if err := w.flush(); err != nil {
		return s.writeFailed(err, w)
	}
	if err := s.sync(s.active); err != nil {
		return s.writeFailed(err, w)
	}
	if newDir {
		if err := s.syncDir(); err != nil {
			return s.writeFailed(err, w)
		}
	}
	s.mu.Lock()
	s.total += size - last.size
	last.size, last.next = size, next
	close(s.notify)
	s.notify = make(chan struct{})
	s.mu.Unlock()
	return nil
}

// writeFailed cuts the active segment back to its last published size, so
// a failed write leaves no partial entry behind, and returns err (as
// ErrNoSpace when the disk is full).
func (s *Spool) writeFailed(err error, w *segmentWriter) error {
	w.reset()
	full := isNoSpace(err)
	s.mu.Lock()
	last := s.segments[len(s.segments)-1]
	committed := last.size
	if len(s.segments) > 1 || committed > last.start() {
		// Readers may have been woken for a rolled segment already.
		close(s.notify)
		s.notify = make(chan struct{})
	}
	entering := full && !s.noSpace
	if full {
		s.noSpace, s.lastProbe = true, time.Now()
	}
	s.mu.Unlock()
	if terr := s.active.Truncate(committed); terr == nil {
		_, _ = s.active.Seek(committed, io.SeekStart)
	} else {
		s.log.Error("spool: cannot cut a failed write", "segment", filepath.Base(last.path), "err", terr)
	}
	if full {
		if entering {
			s.log.Error("spool: the disk is full: ingest refuses batches (503) until space returns; delivery goes on and frees space",
				"dir", s.opts.Dir, "err", err)
		}
		return fmt.Errorf("%w: %w", ErrNoSpace, err)
	}
	s.log.Error("spool: write failed", "err", err)
	return err
}
