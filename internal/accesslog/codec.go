package accesslog

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// codecVersion is the first byte of every encoded batch; bump it when the
// layout changes and keep decoding the old one.
const codecVersion byte = 1

// errCodec reports a spool entry that cannot be decoded.
var errCodec = errors.New("corrupt spooled batch")

// Marshal encodes b compactly for the spool: a version byte, the batch
// metadata as length-prefixed strings and varints, then every record's JSON
// length-prefixed. The spool adds its own length and CRC around it. It
// encodes a batch as ingest decoded it: RecordIndexes and BatchHash (set
// only on a batch narrowed by Select) are not kept.
func Marshal(b *Batch) []byte {
	size := 1 + 10 + 10 + 10 + len(b.Records)*5 + b.RecordBytes()
	for _, s := range b.strings() {
		size += len(*s) + 5
	}
	out := make([]byte, 0, size)
	out = append(out, codecVersion)
	out = binary.AppendVarint(out, b.ReceivedUnixNano)
	out = binary.AppendVarint(out, b.SeqNum)
	for _, s := range b.strings() {
		out = binary.AppendUvarint(out, uint64(len(*s)))
		out = append(out, *s...)
	}
	out = binary.AppendUvarint(out, uint64(len(b.Records)))
	for _, r := range b.Records {
		out = binary.AppendUvarint(out, uint64(len(r)))
		out = append(out, r...)
	}
	return out
}

func (b *Batch) strings() []*string {
	f := (*string)(&b.Format)
	return []*string{&b.EnvironmentID, f, &b.AccountNumber, &b.AgentID, &b.Datestamp, &b.Platform, &b.ProfileID}
}

// Unmarshal decodes what Marshal encoded. Records alias data.
func Unmarshal(data []byte) (*Batch, error) { return unmarshal(data, true) }

// UnmarshalHeader decodes only the metadata of what Marshal
// encoded; Records is left nil.
func UnmarshalHeader(data []byte) (*Batch, error) { return unmarshal(data, false) }

func unmarshal(data []byte, records bool) (*Batch, error) {
	if len(data) == 0 || data[0] != codecVersion {
		return nil, fmt.Errorf("%w: unknown version", errCodec)
	}
	p := data[1:]
	varint := func() (int64, bool) {
		v, n := binary.Varint(p)
		if n <= 0 {
			return 0, false
		}
		p = p[n:]
		return v, true
	}
	bytesField := func() ([]byte, bool) {
		l, n := binary.Uvarint(p)
		if n <= 0 || l > uint64(len(p)-n) {
			return nil, false
		}
		v := p[n : n+int(l)]
		p = p[n+int(l):]
		return v, true
	}
	b := &Batch{}
	var ok bool
	if b.ReceivedUnixNano, ok = varint(); !ok {
		return nil, fmt.Errorf("%w: received time", errCodec)
	}
	if b.SeqNum, ok = varint(); !ok {
		return nil, fmt.Errorf("%w: seq_num", errCodec)
	}
	for _, s := range b.strings() {
		v, ok := bytesField()
		if !ok {
			return nil, fmt.Errorf("%w: metadata", errCodec)
		}
		*s = string(v)
	}
	if !records {
		return b, nil
	}
	count, n := binary.Uvarint(p)
	if n <= 0 || count > uint64(len(p)) {
		return nil, fmt.Errorf("%w: record count", errCodec)
	}
	p = p[n:]
	b.Records = make([]json.RawMessage, 0, count)
	for i := uint64(0); i < count; i++ {
		v, ok := bytesField()
		if !ok {
			return nil, fmt.Errorf("%w: record %d", errCodec, i)
		}
		b.Records = append(b.Records, v)
	}
	if len(p) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", errCodec, len(p))
	}
	return b, nil
}
