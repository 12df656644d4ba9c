package spool

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

var segName = regexp.MustCompile(`^(\d{20})\.seg$`)

// recover scans every segment, cuts a torn tail off the newest one,
// quarantines damage anywhere else, and opens a segment for appending.
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
		s.segments = append(s.segments, &segment{first: first, path: filepath.Join(s.opts.Dir, de.Name())})
	}
	slices.SortFunc(s.segments, func(a, b *segment) int { return cmp.Compare(a.first, b.first) })
	for i, seg := range s.segments {
		// The next segment's name bounds this one's indexes: it tells how
		// many entries damage at the end of this one took.
		var nextFirst uint64
		last := i == len(s.segments)-1
		if !last {
			nextFirst = s.segments[i+1].first
		}
		if err := s.scan(seg, last, nextFirst); err != nil {
			return err
		}
	}
	// Drop segments without entries or damage, except the last.
	kept := s.segments[:0]
	for i, seg := range s.segments {
		if seg.next == seg.first && len(s.damaged[seg.first]) == 0 && i != len(s.segments)-1 {
			_ = os.Remove(seg.path)
			continue
		}
		kept = append(kept, seg)
	}
	s.segments = kept
	var first uint64
	if n := len(s.segments); n > 0 {
		first = s.segments[n-1].next
	}
	// Appends go to a segment of the current format: the last one if it is
	// one, else a new one (a legacy or an empty segment is replaced).
	if n := len(s.segments); n > 0 {
		last := s.segments[n-1]
		switch {
		case last.version == formatVersion && last.size >= segHeaderSize:
			f, err := os.OpenFile(last.path, os.O_WRONLY, 0)
			if err != nil {
				return fmt.Errorf("opening spool segment: %w", err)
			}
			if _, err := f.Seek(last.size, io.SeekStart); err != nil {
				f.Close()
				return fmt.Errorf("seeking spool segment: %w", err)
			}
			s.active = f
		case last.next == last.first && len(s.damaged[last.first]) == 0:
			_ = os.Remove(last.path)
			s.segments = s.segments[:n-1]
			first = last.first
		}
	}
	if s.active == nil {
		seg, f, err := s.createSegment(first)
		if err != nil {
			return err
		}
		s.segments = append(s.segments, seg)
		s.active = f
	}
	for _, seg := range s.segments {
		s.total += seg.size
	}
	return s.syncDir()
}

// createSegment creates the (empty) segment file for index first; the
// writer puts the header in front of its first entry. An empty file needs
// no data block, so a segment can be started on a full disk.
func (s *Spool) createSegment(first uint64) (*segment, *os.File, error) {
	seg := &segment{first: first, next: first, version: formatVersion, path: segPath(s.opts.Dir, first)}
	f, err := os.OpenFile(seg.path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		return nil, nil, fmt.Errorf("creating spool segment: %w", err)
	}
	return seg, f, nil
}

// scan reads seg's entries. Damage followed by an intact entry, or in any
// segment but the last, is corruption and is quarantined; damage running
// to the end of the last segment is a torn write and is cut off.
func (s *Spool) scan(seg *segment, last bool, nextFirst uint64) error {
	f, err := os.OpenFile(seg.path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("opening spool segment: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat spool segment: %w", err)
	}
	size := st.Size()
	sf := segmentFile{r: f, version: formatVersion, start: segHeaderSize}
	var hdr [segHeaderSize]byte
	n, _ := f.ReadAt(hdr[:], 0)
	headerOK := false
	if first, version, ok := segmentHeader(hdr[:n]); ok {
		if version != formatVersion {
			return fmt.Errorf("spool segment %s has format version %d; this build reads versions 1 and %d: use the release that wrote it to drain the spool",
				filepath.Base(seg.path), version, formatVersion)
		}
		if first != seg.first {
			s.log.Warn("spool: segment header names another first index than the file name; the name wins",
				"segment", filepath.Base(seg.path), "header_first", first)
		}
		headerOK = true
	} else if size > 0 {
		legacy := segmentFile{r: f, version: 1}
		if _, err := legacy.readFrame(0, size, seg.first, readOpts{}); err == nil {
			sf = legacy
		}
	}
	seg.version = sf.version
	next := seg.first
	off := sf.start
	if sf.version == formatVersion && !headerOK {
		off = 0 // a damaged header: look for the first entry
		if size == 0 {
			seg.size, seg.next = 0, seg.first
			return nil
		}
	}
	var scratch []byte
	for off < size {
		fr, err := sf.readFrame(off, size, next, readOpts{scratch: &scratch})
		if err == nil && fr.index >= next {
			off, next = fr.end, fr.index+1
			continue
		}
		if err != nil && !errors.Is(err, errShort) && !errors.Is(err, errDamaged) {
			return fmt.Errorf("reading spool segment %s: %w", filepath.Base(seg.path), err)
		}
		at, fr, found := sf.resync(off+1, size, next, &scratch)
		if !found && last {
			if err := s.cutTornTail(f, seg, off, size); err != nil {
				return err
			}
			size = off
			break
		}
		to, lost := size, uint64(0)
		switch {
		case found:
			to, lost = at, fr.index-next
		case nextFirst > next:
			lost = nextFirst - next
		}
		s.quarantine(f, seg, off, to, lost, "recovery")
		if found {
			off, next = fr.end, fr.index+1
		} else {
			off = size
		}
	}
	seg.size, seg.next = size, next
	return nil
}

// cutTornTail truncates the newest segment at off: the bytes after it are
// an append that never completed, so it was never acknowledged.
func (s *Spool) cutTornTail(f *os.File, seg *segment, off, size int64) error {
	s.log.Warn("spool: cutting a torn write off the newest segment (it was never acknowledged)",
		"segment", filepath.Base(seg.path), "offset", off, "discarded_bytes", size-off)
	if err := f.Truncate(off); err != nil {
		return fmt.Errorf("truncating spool segment: %w", err)
	}
	if err := s.sync(f); err != nil {
		return err
	}
	return nil
}

// quarantineName is the file that keeps seg's damaged bytes from offset.
func quarantineName(seg *segment, from int64) string {
	return fmt.Sprintf("%s.%d.corrupt", seg.path, from)
}

// quarantine records the damaged span [from, to) of seg, which held lost
// entries: it copies the bytes into a .corrupt file beside the segment,
// logs it at error level and counts it, once per span (a span quarantined
// before a restart is known by its file). Readers skip known spans.
func (s *Spool) quarantine(r io.ReaderAt, seg *segment, from, to int64, lost uint64, by string) {
	s.mu.Lock()
	for _, sp := range s.damaged[seg.first] {
		if sp.from == from {
			s.mu.Unlock()
			return
		}
	}
	// A new slice: readers hold the old one without the lock.
	spans := append(slices.Clone(s.damaged[seg.first]), span{from, to})
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.from, b.from) })
	s.damaged[seg.first] = spans
	s.mu.Unlock()

	name := quarantineName(seg, from)
	if _, err := os.Stat(name); err == nil {
		s.log.Info("spool: skipping damaged bytes quarantined before", "segment", filepath.Base(seg.path),
			"from_offset", from, "to_offset", to, "quarantine", filepath.Base(name))
		return
	}
	s.mu.Lock()
	s.corruptBytes += to - from
	s.corruptEntries += int64(lost)
	s.mu.Unlock()
	err := s.copyOut(r, name, from, to)
	s.log.Error("spool: corrupt bytes in a segment: quarantined them and resumed at the next intact entry",
		"segment", filepath.Base(seg.path), "from_offset", from, "to_offset", to, "bytes", to-from,
		"entries_lost", lost, "quarantine", filepath.Base(name), "quarantine_error", err, "found_by", by)
}

func (s *Spool) copyOut(r io.ReaderAt, name string, from, to int64) error {
	f, err := os.OpenFile(name+".tmp", os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, io.NewSectionReader(r, from, to-from))
	if err == nil {
		err = s.sync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(name+".tmp", name)
	}
	if err != nil {
		_ = os.Remove(name + ".tmp")
		return err
	}
	return s.syncDir()
}
