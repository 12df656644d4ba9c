package accesslog

import (
	"encoding/binary"
	"io"
)

// EncodedSize returns the exact length of Marshal(b).
func EncodedSize(b *Batch) int {
	n := 1 + varintLen(b.ReceivedUnixNano) + varintLen(b.SeqNum)
	for _, s := range b.strings() {
		n += uvarintLen(uint64(len(*s))) + len(*s)
	}
	n += uvarintLen(uint64(len(b.Records)))
	for _, r := range b.Records {
		n += uvarintLen(uint64(len(r))) + len(r)
	}
	return n
}

// EncodeTo writes Marshal(b) to w piece by piece, without building the
// encoding in memory: the spool streams a batch into its segment file
// while the records still alias the request body.
func EncodeTo(w io.Writer, b *Batch) (int64, error) {
	var total int64
	write := func(p []byte) error {
		n, err := w.Write(p)
		total += int64(n)
		return err
	}
	head := make([]byte, 0, 256)
	head = append(head, codecVersion)
	head = binary.AppendVarint(head, b.ReceivedUnixNano)
	head = binary.AppendVarint(head, b.SeqNum)
	for _, s := range b.strings() {
		head = binary.AppendUvarint(head, uint64(len(*s)))
		head = append(head, *s...)
	}
	head = binary.AppendUvarint(head, uint64(len(b.Records)))
	if err := write(head); err != nil {
		return total, err
	}
	var prefix [binary.MaxVarintLen64]byte
	for _, r := range b.Records {
		if err := write(binary.AppendUvarint(prefix[:0], uint64(len(r)))); err != nil {
			return total, err
		}
		if err := write(r); err != nil {
			return total, err
		}
	}
	return total, nil
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func varintLen(v int64) int {
	// binary.AppendVarint's zig-zag encoding.
	u := uint64(v) << 1
	if v < 0 {
		u = ^u
	}
	return uvarintLen(u)
}
