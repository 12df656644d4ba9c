package spool

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// The entry codec: the only code that knows the bytes of a segment file.
// The writer encodes with segmentWriter, and recovery and readers decode
// with segmentFile, so they cannot disagree.
//
// Format version 2 (little endian):
//
//	segment header, 32 bytes: magic "\xfeEPSPOOL", uint32 format version,
//	  uint64 index of the segment's first entry, int64 creation time (unix
//	  ns), uint32 CRC-32C of the 28 bytes before it.
//	entry: header, 28 bytes: sync marker "\xfe\xe5\x9a\x1d", uint32 payload
//	  length, uint64 entry index, int64 append time (unix ns), uint32
//	  CRC-32C of the 24 bytes before it;
//	  the payload;
//	  uint32 CRC-32C of the payload, continuing from the header's CRC.
//
// The sync marker and the header's own checksum let a reader find the next
// entry after damaged bytes: it looks for the marker and accepts a place
// only when the header and the payload both check out. The explicit index
// says how many entries the damage took.
//
// Format version 1 (spools written before the format had a version) has no
// segment header and entries [uint32 length][uint32 CRC-32C of time and
// payload][int64 time][payload]; it is still read, never written.
const (
	segMagic       = "\xfeEPSPOOL"
	formatVersion  = 2
	segHeaderSize  = 32
	entryMarker    = "\xfe\xe5\x9a\x1d"
	entryHeaderLen = 28
	entryTrailer   = 4
	// entryOverhead is what the codec adds to a payload.
	entryOverhead = entryHeaderLen + entryTrailer

	v1HeaderSize = 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errors of readFrame.
var (
	// errShort: the entry does not end within the readable bytes.
	errShort = errors.New("entry cut short")
	// errDamaged: the bytes are not a valid entry.
	errDamaged = errors.New("entry fails its checksum")
)

// isDamage reports whether err says the bytes read are not a whole, valid
// entry (errShort or errDamaged).
func isDamage(err error) bool {
	return errors.Is(err, errShort) || errors.Is(err, errDamaged)
}

// frame is one decoded entry.
type frame struct {
	index uint64
	time  int64
	end   int64 // offset just after the entry
	data  []byte
}

func encodeSegmentHeader(first uint64, now int64) []byte {
	b := make([]byte, segHeaderSize)
	copy(b, segMagic)
	binary.LittleEndian.PutUint32(b[8:12], formatVersion)
	binary.LittleEndian.PutUint64(b[12:20], first)
	binary.LittleEndian.PutUint64(b[20:28], uint64(now))
	binary.LittleEndian.PutUint32(b[28:32], crc32.Checksum(b[:28], castagnoli))
	return b
}

// segmentHeader reports whether b starts with a valid segment header and
// the first index it names.
func segmentHeader(b []byte) (first uint64, version uint32, ok bool) {
	if len(b) < segHeaderSize || string(b[:8]) != segMagic ||
		crc32.Checksum(b[:28], castagnoli) != binary.LittleEndian.Uint32(b[28:32]) {
		return 0, 0, false
	}
	return binary.LittleEndian.Uint64(b[12:20]), binary.LittleEndian.Uint32(b[8:12]), true
}

// encodeEntryHeader fills h (entryHeaderLen bytes) and returns its CRC,
// which the payload's CRC continues.
func encodeEntryHeader(h []byte, index uint64, t int64, n int) uint32 {
	copy(h, entryMarker)
	binary.LittleEndian.PutUint32(h[4:8], uint32(n))
	binary.LittleEndian.PutUint64(h[8:16], index)
	binary.LittleEndian.PutUint64(h[16:24], uint64(t))
	crc := crc32.Checksum(h[:24], castagnoli)
	binary.LittleEndian.PutUint32(h[24:28], crc)
	return crc
}

// entryHeader decodes a version 2 entry header.
func entryHeader(h []byte) (index uint64, t int64, n int64, crc uint32, ok bool) {
	if string(h[:4]) != entryMarker {
		return 0, 0, 0, 0, false
	}
	crc = binary.LittleEndian.Uint32(h[24:28])
	if crc32.Checksum(h[:24], castagnoli) != crc {
		return 0, 0, 0, 0, false
	}
	return binary.LittleEndian.Uint64(h[8:16]), int64(binary.LittleEndian.Uint64(h[16:24])),
		int64(binary.LittleEndian.Uint32(h[4:8])), crc, true
}

// segmentWriter writes entries into a segment file through a buffer,
// checksumming payloads as they stream through: a payload is never copied
// whole into memory by the spool.
type segmentWriter struct {
	f   *os.File
	buf []byte
	crc uint32
}

func newSegmentWriter(size int) *segmentWriter {
	return &segmentWriter{buf: make([]byte, 0, size)}
}

// Write checksums p and buffers or writes it (io.Writer for payloads).
func (w *segmentWriter) Write(p []byte) (int, error) {
	w.crc = crc32.Update(w.crc, castagnoli, p)
	return w.raw(p)
}

// raw writes p without checksumming it.
func (w *segmentWriter) raw(p []byte) (int, error) {
	if len(w.buf)+len(p) > cap(w.buf) {
		if err := w.flush(); err != nil {
			return 0, err
		}
		if len(p) >= cap(w.buf) {
			n, err := w.f.Write(p)
			if err != nil {
				return n, fmt.Errorf("writing spool segment: %w", err)
			}
			return n, nil
		}
	}
	w.buf = append(w.buf, p...)
	return len(p), nil
}

func (w *segmentWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.f.Write(w.buf)
	w.buf = w.buf[:0]
	if err != nil {
		return fmt.Errorf("writing spool segment: %w", err)
	}
	return nil
}

// reset drops buffered bytes (after a failed write).
func (w *segmentWriter) reset() { w.buf = w.buf[:0] }

// writeEntry writes one entry and returns its size on disk.
func (w *segmentWriter) writeEntry(index uint64, t int64, p Payload) (int64, error) {
	n := p.Size()
	var h [entryHeaderLen]byte
	w.crc = encodeEntryHeader(h[:], index, t, n)
	if _, err := w.raw(h[:]); err != nil {
		return 0, err
	}
	written, err := p.WriteTo(w)
	if err != nil {
		return 0, fmt.Errorf("writing spool entry %d: %w", index, err)
	}
	if written != int64(n) {
		return 0, fmt.Errorf("spool entry %d: payload wrote %d bytes, announced %d", index, written, n)
	}
	var tr [entryTrailer]byte
	binary.LittleEndian.PutUint32(tr[:], w.crc)
	if _, err := w.raw(tr[:]); err != nil {
		return 0, err
	}
	return int64(n) + entryOverhead, nil
}

// segmentFile decodes the entries of one segment file.
type segmentFile struct {
	r       io.ReaderAt
	version int   // 1 or formatVersion
	start   int64 // offset of the first entry
}

// readOpts say where readFrame puts a payload.
type readOpts struct {
	// alloc puts the payload in a new buffer (handed out to a caller);
	// otherwise in *scratch, reused.
	alloc   bool
	scratch *[]byte
	// keep > 0 keeps only the payload's first keep bytes; the rest is
	// still read and checked, in pieces (in *pieces when set, reused).
	keep   int64
	pieces *[]byte
}

// readFrame decodes the entry at off, which must end by limit. next is
// the index a version 1 entry at off has (version 1 stores none).
func (sf *segmentFile) readFrame(off, limit int64, next uint64, o readOpts) (frame, error) {
	fr, h, n, dataAt, crc, err := sf.readHeader(off, limit, next)
	if err != nil {
		return frame{}, err
	}
	keep := n
	if o.keep > 0 {
		keep = min(n, o.keep)
	}
	trailer := int64(0)
	if sf.version != 1 {
		trailer = entryTrailer
	}
	// The kept part, with the trailer when the whole payload is kept.
	var buf []byte
	if keep == n {
		buf = payloadBuf(n+trailer, o)
	} else {
		buf = payloadBuf(keep, o)
	}
	if _, err := sf.r.ReadAt(buf, dataAt); err != nil {
		return frame{}, fmt.Errorf("reading spool entry at %d: %w", off, err)
	}
	crc = crc32.Update(crc, castagnoli, buf[:keep])
	if keep < n {
		// The rest, in pieces, only for the checksum.
		if crc, err = sf.checkRest(crc, dataAt+keep, n-keep, o.pieces); err != nil {
			return frame{}, fmt.Errorf("reading spool entry at %d: %w", off, err)
		}
		if trailer > 0 {
			if _, err := sf.r.ReadAt(h[:trailer], dataAt+n); err != nil {
				return frame{}, fmt.Errorf("reading spool entry at %d: %w", off, err)
			}
		}
	} else if trailer > 0 {
		copy(h[:trailer], buf[n:])
	}
	want := binary.LittleEndian.Uint32(h[4:8]) // version 1: in the header
	if trailer > 0 {
		want = binary.LittleEndian.Uint32(h[:trailer])
	}
	if crc != want {
		return frame{}, errDamaged
	}
	fr.data = buf[:keep:keep]
	return fr, nil
}

// readHeader reads the header of the entry at off, which must end by
// limit: the frame so far (index, time, end), the header bytes, the
// payload's length and offset, and the checksum of the header part it
// covers.
func (sf *segmentFile) readHeader(off, limit int64, next uint64) (fr frame, h [entryHeaderLen]byte, n, dataAt int64, crc uint32, err error) {
	fr.index = next
	if sf.version == 1 {
		if limit-off < v1HeaderSize {
			return fr, h, 0, 0, 0, errShort
		}
		if _, err := sf.r.ReadAt(h[:v1HeaderSize], off); err != nil {
			return fr, h, 0, 0, 0, fmt.Errorf("reading spool entry at %d: %w", off, err)
		}
		n = int64(binary.LittleEndian.Uint32(h[0:4]))
		fr.end, dataAt = off+v1HeaderSize+n, off+v1HeaderSize
		fr.time = int64(binary.LittleEndian.Uint64(h[8:16]))
		crc = crc32.Checksum(h[8:16], castagnoli)
	} else {
		if limit-off < entryOverhead {
			return fr, h, 0, 0, 0, errShort
		}
		if _, err := sf.r.ReadAt(h[:], off); err != nil {
			return fr, h, 0, 0, 0, fmt.Errorf("reading spool entry at %d: %w", off, err)
		}
		var ok bool
		if fr.index, fr.time, n, crc, ok = entryHeader(h[:]); !ok {
			return fr, h, 0, 0, 0, errDamaged
		}
		fr.end, dataAt = off+entryHeaderLen+n+entryTrailer, off+entryHeaderLen
	}
	if fr.end > limit {
		return fr, h, 0, 0, 0, errShort
	}
	return fr, h, n, dataAt, crc, nil
}

// checkRest continues crc over the n bytes at at, read in pieces of at
// most 1 MiB (in *pieces when set, reused).
func (sf *segmentFile) checkRest(crc uint32, at, n int64, pieces *[]byte) (uint32, error) {
	var piece []byte
	if pieces != nil {
		if len(*pieces) < 1<<20 {
			*pieces = make([]byte, 1<<20)
		}
		piece = *pieces
	} else {
		piece = make([]byte, min(n, 1<<20))
	}
	for n > 0 {
		p := piece[:min(n, int64(len(piece)))]
		if _, err := sf.r.ReadAt(p, at); err != nil {
			return 0, err
		}
		crc = crc32.Update(crc, castagnoli, p)
		at, n = at+int64(len(p)), n-int64(len(p))
	}
	return crc, nil
}

func payloadBuf(n int64, o readOpts) []byte {
	if o.alloc || o.scratch == nil {
		return make([]byte, n)
	}
	if int64(cap(*o.scratch)) < n {
		*o.scratch = make([]byte, n)
	}
	return (*o.scratch)[:n]
}

// resync returns the offset of the first intact entry after from (and
// before limit) whose index is at least next, and that entry. Version 1
// segments have no sync marker: it reports none.
func (sf *segmentFile) resync(from, limit int64, next uint64, scratch *[]byte) (int64, frame, bool) {
	if sf.version == 1 {
		return 0, frame{}, false
	}
	const chunk = 1 << 20
	buf := make([]byte, chunk+len(entryMarker)-1)
	for base := from; base < limit; base += chunk {
		n := min(int64(len(buf)), limit-base)
		if _, err := sf.r.ReadAt(buf[:n], base); err != nil && !errors.Is(err, io.EOF) {
			return 0, frame{}, false
		}
		for i := 0; ; {
			j := bytes.Index(buf[i:n], []byte(entryMarker))
			if j < 0 {
				break
			}
			off := base + int64(i+j)
			if fr, err := sf.readFrame(off, limit, 0, readOpts{scratch: scratch}); err == nil && fr.index >= next {
				return off, fr, true
			}
			i += j + 1
		}
	}
	return 0, frame{}, false
}

// payloadLen returns the payload length the entry header at off
// announces, when the header is intact.
func (sf *segmentFile) payloadLen(off int64) (int64, bool) {
	var h [entryHeaderLen]byte
	if sf.version == 1 {
		if _, err := sf.r.ReadAt(h[:v1HeaderSize], off); err != nil {
			return 0, false
		}
		return int64(binary.LittleEndian.Uint32(h[0:4])), true
	}
	if _, err := sf.r.ReadAt(h[:], off); err != nil {
		return 0, false
	}
	_, _, n, _, ok := entryHeader(h[:])
	return n, ok
}

// timeAt returns the append time of the entry at off.
func (sf *segmentFile) timeAt(off int64) (int64, error) {
	var h [entryHeaderLen]byte
	if sf.version == 1 {
		if _, err := sf.r.ReadAt(h[:v1HeaderSize], off); err != nil {
			return 0, err
		}
		return int64(binary.LittleEndian.Uint64(h[8:16])), nil
	}
	if _, err := sf.r.ReadAt(h[:], off); err != nil {
		return 0, err
	}
	_, t, _, _, ok := entryHeader(h[:])
	if !ok {
		return 0, errDamaged
	}
	return t, nil
}

// Payload is an entry's content, streamed into the segment file so the
// caller need not assemble it in memory first.
type Payload interface {
	// Size is the exact number of bytes WriteTo writes.
	Size() int
	// WriteTo writes the content to w.
	WriteTo(w io.Writer) (int64, error)
}

// bytesPayload is a Payload already in memory.
type bytesPayload []byte

func (b bytesPayload) Size() int { return len(b) }

func (b bytesPayload) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(b)
	return int64(n), err
}
