package logtable

import (
	"bytes"
	"encoding/json"
	"sort"
	"strconv"
	"time"
	"unsafe"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// columnData holds one INSERT, column by column. Every column is kept in
// the typed slice its ClickHouse type takes (not []any), so that appending
// a value never allocates.
type columnData struct {
	rows int
	// fixed columns
	env, agent, datestamp, recordKey, profile, format, extra []string
	seq                                                      []int64
	index                                                    []uint32
	received                                                 []time.Time
	version                                                  []uint64
	// field columns, parallel to the sink's columns
	fields []valueColumn
}

func (d *columnData) slices() []any {
	out := make([]any, 0, 11+len(d.fields)+1)
	out = append(out, d.env, d.agent, d.datestamp, d.seq, d.recordKey, d.index, d.profile, d.format, d.received, d.extra, d.version)
	for _, c := range d.fields {
		out = c.data(out)
	}
	return out
}

// columnIndex finds a field column by its code.
type columnIndex map[string]int

// buildColumns converts the records into typed columns. Each record's
// members are walked once (accesslog.EachMember); string values without
// escapes are substrings of the record's own bytes, so a record costs no
// allocation for them. A value its column cannot hold
// leaves the column at its default and is kept in extra.
func buildColumns(batches []*accesslog.Batch, cols []accessColumn, version uint64) *columnData {
	n := 0
	for _, b := range batches {
		n += len(b.Records)
	}
	d := &columnData{
		fields: make([]valueColumn, len(cols)),
		env:    make([]string, 0, n), agent: make([]string, 0, n), datestamp: make([]string, 0, n),
		recordKey: make([]string, 0, n), profile: make([]string, 0, n), format: make([]string, 0, n),
		extra: make([]string, 0, n), seq: make([]int64, 0, n), index: make([]uint32, 0, n),
		received: make([]time.Time, 0, n), version: make([]uint64, 0, n),
	}
	byName := make(columnIndex, len(cols))
	for i, c := range cols {
		byName[c.name] = i
		d.fields[i] = newValueColumn(c, n)
	}
	set := make([]bool, len(cols))
	hint := make([]int, 0, len(cols)) // column index by member position
	var extra map[string]json.RawMessage
	for _, b := range batches {
		var batchHash string
		received := time.Unix(0, b.ReceivedUnixNano).UTC()
		for ri, raw := range b.Records {
			for i := range set {
				set[i] = false
			}
			clear(extra)
			// String values without escapes are substrings of rs, which
			// shares the record's bytes: records are never written to
			// after they are decoded (the spool hands out a new buffer
			// per entry), and the columns live only until the INSERT
			// has copied them.
			rs := unsafe.String(unsafe.SliceData(raw), len(raw))
			keep := func(code string, v json.RawMessage) {
				if extra == nil {
					extra = map[string]json.RawMessage{}
				}
				extra[code] = v
			}
			var uuid json.RawMessage
			pos := 0
			err := accesslog.EachMember(raw, func(key []byte, escaped bool, v []byte) {
				// Records of a batch list their fields in the same order:
				// try the column the previous record had at this position
				// before hashing the key.
				p := pos
				pos++
				var i int
				var ok bool
				if p < len(hint) && hint[p] >= 0 && cols[hint[p]].name == string(key) && !escaped {
					i, ok = hint[p], true
				} else {
					i, ok = byName[string(key)]
					for len(hint) <= p {
						hint = append(hint, -1)
					}
					if ok && !escaped {
						hint[p] = i
					} else {
						hint[p] = -1
					}
				}
				if escaped || !ok {
					code := accesslog.UnescapeKey(key, escaped)
					if i, ok = byName[code]; !ok {
						if code == "environment_id" && jsonString(v) == b.EnvironmentID {
							return
						}
						keep(code, v)
						return
					}
				}
				if string(key) == "uuid" {
					uuid = v
				}
				if set[i] {
					// A repeated key: the last one wins, as in encoding/json.
					d.fields[i].dropLast()
				}
				// v is raw[off:off+len(v)].
				off := cap(raw) - cap(v)
				if !d.fields[i].add(v, rs[off:off+len(v)]) {
					d.fields[i].addDefault()
					keep(cols[i].name, v)
				}
				set[i] = true
			})
			if err != nil {
				// Ingest only spools valid JSON objects, so this is
				// corruption: keep the record whole rather than lose it.
				keep("_unparsed_record", json.RawMessage(strconv.Quote(rs)))
			}
			for i, ok := range set {
				if !ok {
					d.fields[i].addDefault()
				}
			}
			// Identity.
			idx := b.RecordIndex(ri)
			d.env = append(d.env, b.EnvironmentID)
			if b.HasIdentity() {
				d.agent = append(d.agent, b.AgentID)
				d.datestamp = append(d.datestamp, b.Datestamp)
				d.seq = append(d.seq, b.SeqNum)
				d.recordKey = append(d.recordKey, "")
				d.index = append(d.index, uint32(idx))
			} else {
				d.agent = append(d.agent, "")
				d.datestamp = append(d.datestamp, "")
				d.seq = append(d.seq, accesslog.NoSeqNum)
				if u := jsonString(uuid); u != "" {
					d.recordKey = append(d.recordKey, "uuid:"+u)
					d.index = append(d.index, 0)
				} else {
					if batchHash == "" {
						batchHash = b.ContentHash()
					}
					d.recordKey = append(d.recordKey, "batch:"+batchHash)
					d.index = append(d.index, uint32(idx))
				}
			}
			d.profile = append(d.profile, b.ProfileID)
			d.format = append(d.format, string(b.Format))
			d.received = append(d.received, received)
			d.version = append(d.version, version)
			d.extra = append(d.extra, encodeExtra(extra))
			d.rows++
		}
	}
	return d
}

func encodeExtra(m map[string]json.RawMessage) string {
	if len(m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		b.Write(m[k])
	}
	b.WriteByte('}')
	return b.String()
}

// jsonString returns the string a JSON string holds, or "" for anything else.
func jsonString(v json.RawMessage) string {
	if len(v) < 2 || v[0] != '"' {
		return ""
	}
	if bytes.IndexByte(v, '\\') < 0 {
		return string(v[1 : len(v)-1])
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return ""
	}
	return s
}
