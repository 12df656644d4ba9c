// Package statefile keeps one small piece of state on disk (a spool
// cursor, the gap tracker's state) so that replacing it needs no new disk
// space: the file holds two fixed-size slots, and an update overwrites the
// older slot in place and syncs it. A write torn by a crash leaves the
// other slot intact, so Open always finds the last or the previous content.
//
// Only creating the file, or growing it when the content no longer fits a
// slot, needs free space (a temporary file renamed into place). On a full
// disk every update of content that fits still succeeds.
//
// Slot layout (little endian): "EPST", uint64 sequence, uint32 length,
// uint32 CRC-32C of sequence, length and content, then the content.
package statefile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
)

const (
	magic      = "EPST"
	headerSize = 20
	// align keeps each slot in whole sectors, so a torn write of one slot
	// cannot touch the other.
	align = 512
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// File is one state file, open for updates. It is not safe for concurrent
// use.
type File struct {
	f    *os.File
	path string
	slot int64  // slot size in bytes, header included
	seq  uint64 // sequence of the newest slot
	// damaged: Open found the file without any intact content.
	damaged bool
}

// Options configure Open.
type Options struct {
	// Capacity is the content size the slots are made for when the file is
	// created (at least 64 bytes). Larger content grows the file.
	Capacity int
}

// Open opens the state file at path, creating it (empty) if it does not
// exist, and returns it with its newest intact content (nil when none was
// ever written, or when both slots are damaged: Damaged tells them apart).
func Open(path string, opts Options) (*File, []byte, error) {
	if opts.Capacity < 64 {
		opts.Capacity = 64
	}
	s := &File{path: path}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if err := s.create(nil, slotSize(opts.Capacity)); err != nil {
			return nil, nil, err
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("opening state file %s: %w", filepath.Base(path), err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("stat state file %s: %w", filepath.Base(path), err)
	}
	s.f, s.slot = f, st.Size()/2
	if s.slot < headerSize {
		// Not a state file (or cut short): start afresh in place.
		f.Close()
		if err := s.create(nil, slotSize(opts.Capacity)); err != nil {
			return nil, nil, err
		}
		f, data, err := Open(path, opts)
		if f != nil {
			f.damaged = true
		}
		return f, data, err
	}
	var newest []byte
	found := false
	for i := int64(0); i < 2; i++ {
		seq, data, ok := s.readSlot(i)
		if ok && (!found || seq > s.seq) {
			s.seq, newest, found = seq, data, true
		}
	}
	if found && len(newest) == 0 {
		newest = nil
	}
	s.damaged = !found
	return s, newest, nil
}

// Damaged reports whether Open found the file but no intact content in it
// (both slots damaged, or not a state file), so that what it held is
// lost. A file Open created, or one not written to since, is not damaged:
// its content is empty.
func (s *File) Damaged() bool { return s.damaged }

func slotSize(capacity int) int64 {
	n := int64(headerSize + capacity)
	return (n + align - 1) / align * align
}

// readSlot returns slot i's sequence and content if it is intact.
func (s *File) readSlot(i int64) (uint64, []byte, bool) {
	buf := make([]byte, s.slot)
	if _, err := s.f.ReadAt(buf, i*s.slot); err != nil {
		return 0, nil, false
	}
	if string(buf[:4]) != magic {
		return 0, nil, false
	}
	seq := binary.LittleEndian.Uint64(buf[4:12])
	n := int64(binary.LittleEndian.Uint32(buf[12:16]))
	if n > s.slot-headerSize {
		return 0, nil, false
	}
	crc := crc32.Update(crc32.Checksum(buf[4:16], castagnoli), castagnoli, buf[headerSize:headerSize+n])
	if crc != binary.LittleEndian.Uint32(buf[16:20]) {
		return 0, nil, false
	}
	return seq, buf[headerSize : headerSize+n], true
}

func encodeSlot(buf []byte, seq uint64, data []byte) {
	copy(buf[:4], magic)
	binary.LittleEndian.PutUint64(buf[4:12], seq)
	binary.LittleEndian.PutUint32(buf[12:16], uint32(len(data)))
	copy(buf[headerSize:], data)
	crc := crc32.Update(crc32.Checksum(buf[4:16], castagnoli), castagnoli, data)
	binary.LittleEndian.PutUint32(buf[16:20], crc)
}

// create writes a new file of two slots of size slot, one holding data,
// through a temporary file renamed over path. Sequence n always lives in
// slot n%2, so an update never overwrites the newest slot.
func (s *File) create(data []byte, slot int64) error {
	buf := make([]byte, 2*slot)
	at := int64((s.seq + 1) % 2 * uint64(slot))
	encodeSlot(buf[at:at+slot], s.seq+1, data)
	tmp := s.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("creating state file %s: %w", filepath.Base(s.path), err)
	}
	_, err = f.Write(buf)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, s.path)
	}
	if err == nil {
		err = syncDir(filepath.Dir(s.path))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("creating state file %s: %w", filepath.Base(s.path), err)
	}
	s.seq++
	return nil
}

// Write replaces the content with data: in place when it fits a slot (no
// new disk space needed), else by rebuilding the file with bigger slots.
func (s *File) Write(data []byte) error {
	if int64(len(data)) > s.slot-headerSize {
		old := s.f
		if err := s.create(data, slotSize(2*len(data))); err != nil {
			return err
		}
		f, err := os.OpenFile(s.path, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("reopening state file %s: %w", filepath.Base(s.path), err)
		}
		old.Close()
		s.f, s.slot = f, slotSize(2*len(data))
		return nil
	}
	buf := make([]byte, headerSize+len(data))
	encodeSlot(buf, s.seq+1, data)
	// The slot not holding the newest content: seq alternates slots.
	target := int64((s.seq + 1) % 2)
	if _, err := s.f.WriteAt(buf, target*s.slot); err != nil {
		return fmt.Errorf("writing state file %s: %w", filepath.Base(s.path), err)
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("syncing state file %s: %w", filepath.Base(s.path), err)
	}
	s.seq++
	return nil
}

// Close closes the file.
func (s *File) Close() error { return s.f.Close() }

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
