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
	c := newColumnBuilder(cols, n)
	for _, b := range batches {
		c.addBatch(b, version)
	}
	return c.d
}

// columnBuilder is the state of one buildColumns: the columns filled, how
// to find a field's column, and the record and batch being converted.
type columnBuilder struct {
	d      *columnData
	cols   []accessColumn
	byName columnIndex
	// hint is the field column of each member position of the previous
	// record (-1: none): records of a batch list their fields in the same
	// order, so that column is tried before hashing the key.
	hint []int

	// The batch being converted.
	b         *accesslog.Batch
	batchHash string // b's content hash, once a record needed it

	// The record being converted.
	raw []byte
	// rs is raw as a string: string values without escapes are its
	// substrings, sharing the record's bytes. Records are never written
	// to after they are decoded (the spool hands out a new buffer per
	// entry), and the columns live only until the INSERT has copied them.
	rs    string
	pos   int    // the position of the next member
	set   []bool // the field columns the record set
	uuid  json.RawMessage
	extra map[string]json.RawMessage // members kept in the extra column
}

// newColumnBuilder returns a builder of n rows of the columns cols.
func newColumnBuilder(cols []accessColumn, n int) columnBuilder {
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
	return columnBuilder{
		d:      d,
		cols:   cols,
		byName: byName,
		hint:   make([]int, 0, len(cols)),
		set:    make([]bool, len(cols)),
	}
}

// addBatch appends a row for every record of b.
func (c *columnBuilder) addBatch(b *accesslog.Batch, version uint64) {
	c.b, c.batchHash = b, ""
	received := time.Unix(0, b.ReceivedUnixNano).UTC()
	d := c.d
	for ri, raw := range b.Records {
		c.addFields(raw)
		c.addIdentity(ri)
		d.profile = append(d.profile, b.ProfileID)
		d.format = append(d.format, string(b.Format))
		d.received = append(d.received, received)
		d.version = append(d.version, version)
		d.extra = append(d.extra, encodeExtra(c.extra))
		d.rows++
	}
}

// addFields appends the field columns of the record raw and sets extra to
// its members no column holds.
func (c *columnBuilder) addFields(raw []byte) {
	clear(c.set)
	clear(c.extra)
	c.raw, c.rs = raw, unsafe.String(unsafe.SliceData(raw), len(raw))
	c.pos, c.uuid = 0, nil
	if err := accesslog.EachMember(raw, c.addMember); err != nil {
		// Ingest only spools valid JSON objects, so this is
		// corruption: keep the record whole rather than lose it.
		c.keep("_unparsed_record", json.RawMessage(strconv.Quote(c.rs)))
	}
	for i, ok := range c.set {
		if !ok {
			c.d.fields[i].addDefault()
		}
	}
}

// addMember adds the record's member key (escaped: holding escapes) with
// the value v, a subslice of the record. It runs for every member of every
// record: the common case, the column the previous record had at this
// position, makes no call but the column's add.
func (c *columnBuilder) addMember(key []byte, escaped bool, v []byte) {
	p := c.pos
	c.pos++
	i := c.hinted(p, key, escaped)
	if i < 0 {
		var code string
		if i, code = c.findColumn(p, key, escaped); i < 0 {
			c.addOther(code, v)
			return
		}
	}
	if string(key) == "uuid" {
		c.uuid = v
	}
	f := c.d.fields[i]
	if c.set[i] {
		// A repeated key: the last one wins, as in encoding/json.
		f.dropLast()
	}
	off := cap(c.raw) - cap(v) // v is raw[off:off+len(v)]
	if !f.add(v, c.rs[off:off+len(v)]) {
		// A value the column cannot hold leaves it at its default
		// and is kept in extra.
		f.addDefault()
		c.keep(c.cols[i].name, v)
	}
	c.set[i] = true
}

// hinted returns the field column hinted for the member key at position p
// when it is key's, else -1.
func (c *columnBuilder) hinted(p int, key []byte, escaped bool) int {
	if p >= len(c.hint) || escaped {
		return -1
	}
	if h := c.hint[p]; h >= 0 && c.cols[h].name == string(key) {
		return h
	}
	return -1
}

// findColumn returns the field column of the member key at position p,
// learning it as the hint for that position when key has no escapes; it
// returns -1 and the unescaped key when no column holds that member.
func (c *columnBuilder) findColumn(p int, key []byte, escaped bool) (int, string) {
	i, ok := c.byName[string(key)]
	for len(c.hint) <= p {
		c.hint = append(c.hint, -1)
	}
	if ok && !escaped {
		c.hint[p] = i
		return i, ""
	}
	c.hint[p] = -1
	code := accesslog.UnescapeKey(key, escaped)
	if i, ok = c.byName[code]; !ok {
		return -1, code
	}
	return i, code
}

// addOther keeps the member code, which no column holds, in extra, unless
// it is an environment_id that repeats the batch's.
func (c *columnBuilder) addOther(code string, v []byte) {
	if code == "environment_id" && jsonString(v) == c.b.EnvironmentID {
		return
	}
	c.keep(code, v)
}

// keep keeps the member code with the value v in extra.
func (c *columnBuilder) keep(code string, v json.RawMessage) {
	if c.extra == nil {
		c.extra = map[string]json.RawMessage{}
	}
	c.extra[code] = v
}

// addIdentity appends the identity columns of record ri of the batch: its
// agent, datestamp, sequence number and index when the batch has them,
// else a key made of the record's uuid or the batch's content hash.
func (c *columnBuilder) addIdentity(ri int) {
	b, d := c.b, c.d
	idx := b.RecordIndex(ri)
	d.env = append(d.env, b.EnvironmentID)
	if b.HasIdentity() {
		d.agent = append(d.agent, b.AgentID)
		d.datestamp = append(d.datestamp, b.Datestamp)
		d.seq = append(d.seq, b.SeqNum)
		d.recordKey = append(d.recordKey, "")
		d.index = append(d.index, uint32(idx))
		return
	}
	d.agent = append(d.agent, "")
	d.datestamp = append(d.datestamp, "")
	d.seq = append(d.seq, accesslog.NoSeqNum)
	if u := jsonString(c.uuid); u != "" {
		d.recordKey = append(d.recordKey, "uuid:"+u)
		d.index = append(d.index, 0)
		return
	}
	if c.batchHash == "" {
		c.batchHash = b.ContentHash()
	}
	d.recordKey = append(d.recordKey, "batch:"+c.batchHash)
	d.index = append(d.index, uint32(idx))
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
