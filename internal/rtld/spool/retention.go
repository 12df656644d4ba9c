package spool

import (
	"errors"
	"os"
	"path/filepath"
	"time"
)

// freeSpaceToResume is how much free space a probe must find before a
// spool that met a full disk accepts entries again.
const freeSpaceToResume = 1 << 20

// probeInterval spaces out free-space probes while the disk is full.
const probeInterval = time.Second

// deleteDelivered removes the segments every reader has passed (all but
// the active one). It runs after every cursor commit, so space is freed
// before anything else is written.
func (s *Spool) deleteDelivered() {
	s.mu.Lock()
	if len(s.readers) == 0 {
		s.mu.Unlock()
		return
	}
	var gone []*segment
	kept := s.segments[:0]
	for i, seg := range s.segments {
		if i != len(s.segments)-1 && s.passedByAll(seg) {
			gone = append(gone, seg)
			s.total -= seg.size
			delete(s.damaged, seg.first)
			continue
		}
		kept = append(kept, seg)
	}
	s.segments = kept
	s.reclaimActive()
	if len(gone) > 0 {
		s.rejecting = false
		if s.noSpace {
			// Space was freed: let the next Append try.
			s.noSpace = false
			s.log.Info("spool: delivered segments deleted; accepting batches again", "dir", s.opts.Dir)
		}
	}
	s.mu.Unlock()
	for _, seg := range gone {
		if err := os.Remove(seg.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("spool: cannot delete delivered segment", "segment", filepath.Base(seg.path), "err", err)
		}
	}
}

// passedByAll reports whether every reader committed a position at or
// after seg's end. Callers hold s.mu.
func (s *Spool) passedByAll(seg *segment) bool {
	for _, r := range s.readers {
		p := r.committed
		if p.Segment < seg.first || (p.Segment == seg.first && p.Offset < seg.size) {
			return false
		}
	}
	return true
}

// probeSpace clears noSpace when the file system has room again (at most
// once per probeInterval). Callers hold s.mu.
func (s *Spool) probeSpace() {
	now := time.Now()
	if now.Sub(s.lastProbe) < probeInterval {
		return
	}
	s.lastProbe = now
	if s.reclaimActive() {
		return
	}
	free, err := freeBytes(s.opts.Dir)
	if err != nil || free >= freeSpaceToResume {
		s.noSpace = false
		s.log.Info("spool: the disk has space again; accepting batches", "dir", s.opts.Dir, "free_bytes", free)
	}
}

// reclaimActive handles a full disk whose space the active segment holds
// although every reader has passed it: it asks the writer to replace the
// segment (see writeBatch) and lets the next Append through. Callers hold
// s.mu.
func (s *Spool) reclaimActive() bool {
	last := s.segments[len(s.segments)-1]
	if !s.noSpace || len(s.readers) == 0 || last.size <= last.start() || !s.passedByAll(last) {
		return false
	}
	s.noSpace, s.reclaim = false, true
	s.log.Info("spool: every reader passed the segment being written; replacing it to free space", "segment", filepath.Base(last.path))
	return true
}
