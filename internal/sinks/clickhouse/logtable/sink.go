// Package logtable is the receiver's ClickHouse sink: every access-log
// record becomes one row of the access_logs table, with a typed column per
// known log field and the rest kept as JSON in extra. The table is a
// ReplacingMergeTree whose sorting key ends with each record's identity, so
// a redelivered record collapses under `SELECT … FINAL`; time comes before
// the identity in the key, so a query over a time range reads only that
// range's part of each environment (see TableSpec).
package logtable

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/delivery"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
)

// Table is the table the receiver writes records to.
const Table = "access_logs"

// Fixed columns of access_logs. A record field whose code is one of these
// names is kept in the extra column (environment_id only when it differs
// from the batch's environment).
//
// Identity: a batch with identity (log_format json) names each record by
// (environment_id, profile_id, agent_id, datestamp, seq_num, record_index)
// (seq_num counts per profile and agent), with an empty record_key. A
// record of a batch without identity (json_array, json_lines) gets an empty
// agent_id and datestamp, seq_num -1 and record_key =
// its "uuid" field with record_index 0 when it has one, or else the batch's
// content hash with its record_index (the platform resends a failed batch
// with the same bytes). The table is a ReplacingMergeTree ordered by
// environment, hour of the record's timestamp and that identity (a
// redelivered record has the same timestamp), so every redelivery collapses
// and `SELECT count() FROM access_logs FINAL` counts each delivered record
// once.
var fixedColumns = []struct{ name, typ string }{
	{"environment_id", "String"},
	{"agent_id", "String"},
	{"datestamp", "String"},
	{"seq_num", "Int64"},
	{"record_key", "String"},
	{"record_index", "UInt32"},
	{"profile_id", "String"},
	{"format", "String"},
	{"received_at", "DateTime"},
	{"extra", "String"},
	{"insert_version", "UInt64"},
}

// Config configures the access-log sink.
type Config struct {
	// DSN names the server and database (see Open).
	DSN string
	// Options are passed to Open (password, logger, …).
	Options []clickhouse.Option
	// Fields are the catalogue fields that get typed columns (default:
	// accesslog.Fields()). Fields not listed land in the extra column.
	Fields []accesslog.Field
	// Logger receives connection and schema notes.
	Logger *slog.Logger
	// InsertTimeout bounds one delivery (default 60s).
	InsertTimeout time.Duration
	// Concurrency is how many INSERTs one delivery runs at once, each with
	// a share of the batches (default 1). Rows are idempotent, so order does
	// not matter; more than 1 helps when the server has idle cores (on a
	// 2-core machine shared with the server it did not).
	Concurrency int
	// Retention, when positive, removes records whose timestamp is older: a
	// TTL on servers that have one (19.6+), else whole daily partitions are
	// dropped once all their records are older (clickhouse.Schema.Expire).
	Retention time.Duration
}

// Sink is the receiver's ClickHouse sink. It connects (and creates or
// extends the table, on every node of the cluster when Options has
// clickhouse.WithCluster) at the first delivery, so a server that is down at
// start-up only delays delivery. A delivery refused for a schema reason (a
// table or column missing, the schema mid-change) makes the next delivery
// check and repair the table first. It is safe for concurrent use.
type Sink struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	db       *clickhouse.DB
	schema   *clickhouse.Schema
	spec     *clickhouse.Table // the table as last ensured
	columns  []accessColumn    // in insert order; nil: ensure the table first
	names    []string
	gen      int // counts column layouts: prepared columns of another gen are rebuilt
	complete bool
	checked  time.Time
	warned   bool // the old-layout warning was logged
}

// accessColumn is one typed field column.
type accessColumn struct {
	field accesslog.Field
	name  string // column name (the field code)
	typ   string // ClickHouse type
	// fraction is the companion column holding microseconds of a timestamp
	// on servers without DateTime64.
	fraction string
}

// New returns the sink; it does not connect yet.
func New(cfg Config) *Sink {
	if cfg.Fields == nil {
		cfg.Fields = accesslog.Fields()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.InsertTimeout <= 0 {
		cfg.InsertTimeout = 60 * time.Second
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	return &Sink{cfg: cfg, log: cfg.Logger}
}

func isFixed(code string) bool {
	for _, c := range fixedColumns {
		if c.name == code {
			return true
		}
	}
	return false
}

// connect opens the connection if needed and ensures the table when its
// columns are not known (the first delivery, after a schema error) or it
// was incomplete on the cluster RecheckInterval ago.
func (a *Sink) connect(ctx context.Context) (*clickhouse.DB, []accessColumn, []string, int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.db == nil {
		opts := append([]clickhouse.Option{clickhouse.WithLogger(a.log)}, a.cfg.Options...)
		db, err := clickhouse.Open(ctx, a.cfg.DSN, opts...)
		if err != nil {
			return nil, nil, nil, 0, err
		}
		if a.cfg.Retention > 0 && !db.Version().HasTTL() {
			a.log.Info("clickhouse: the server has no TTL; the retention drops whole days of access_logs once all their records are older",
				"version", db.Version().String(), "retention", a.cfg.Retention.String())
		}
		a.db, a.schema = db, clickhouse.NewSchema(db, a.log)
	}
	if a.columns == nil || (!a.complete && time.Since(a.checked) >= clickhouse.RecheckInterval) {
		cols, spec, complete, err := a.ensureTable(ctx, a.db)
		if err != nil {
			return nil, nil, nil, 0, err
		}
		names := make([]string, 0, len(fixedColumns)+2*len(cols))
		for _, c := range fixedColumns {
			names = append(names, c.name)
		}
		for _, c := range cols {
			names = append(names, c.name)
			if c.fraction != "" {
				names = append(names, c.fraction)
			}
		}
		if !slices.Equal(names, a.names) || !sameTypes(cols, a.columns) {
			a.gen++
		}
		a.columns, a.names, a.spec, a.complete, a.checked = cols, names, spec, complete, time.Now()
	}
	return a.db, a.columns, a.names, a.gen, nil
}

// forgetTable makes the next delivery check and repair the table first.
func (a *Sink) forgetTable() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.columns = nil
}

func sameTypes(a, b []accessColumn) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].name != b[i].name || a[i].typ != b[i].typ || a[i].fraction != b[i].fraction {
			return false
		}
	}
	return true
}

// identity is the columns that name a record (see fixedColumns).
var identity = []string{"environment_id", "profile_id", "agent_id", "datestamp", "seq_num", "record_key", "record_index"}

// TableSpec returns access_logs for servers of version v: the fixed
// columns, a typed column per field (types of existing, the table's present
// columns, win), ReplacingMergeTree(insert_version),
//
//	PARTITION BY toDate(timestamp)
//	ORDER BY (environment_id, toStartOfHour(timestamp), profile_id, agent_id,
//	          datestamp, seq_num, record_key, record_index)
//
// so a query over the last hour reads that hour of each environment (the
// hour sits ahead of the identity; a redelivered record has the same
// timestamp, so it still collapses), and the retention as a TTL on the
// timestamp (or daily partitions dropped on servers without TTL). On a
// cluster the Distributed table shards by the hash of the identity, which
// keeps every copy of a record on one shard so FINAL and uniqExact of the
// identity through it count each record once. Without a timestamp field
// (--fields without it) the table is ordered by environment and identity,
// unpartitioned.
func TableSpec(v clickhouse.Version, fields []accesslog.Field, existing map[string]string, retention time.Duration) *clickhouse.Table {
	cols := accessColumns(v, fields, existing)
	t := &clickhouse.Table{
		Name:        Table,
		Engine:      "ReplacingMergeTree",
		EngineArgs:  []string{"insert_version"},
		OrderBy:     identity,
		ShardingKey: "cityHash64(" + strings.Join(identity, ", ") + ")",
	}
	for _, c := range fixedColumns {
		t.Columns = append(t.Columns, clickhouse.Column{Name: c.name, Type: c.typ})
	}
	for _, c := range cols {
		t.Columns = append(t.Columns, clickhouse.Column{Name: c.name, Type: c.typ})
		if c.fraction != "" {
			t.Columns = append(t.Columns, clickhouse.Column{Name: c.fraction, Type: "UInt32"})
		}
	}
	if hasTimestamp(cols) {
		t.PartitionBy = "toDate(`timestamp`)"
		t.OrderBy = append([]string{"environment_id", "toStartOfHour(`timestamp`)"}, identity[1:]...)
		t.Retention, t.RetentionTime = retention, "toDateTime(`timestamp`)"
	}
	return t
}

// DDL returns the statements that create access_logs with fields in
// database on a fresh server (cluster "") or cluster of servers of version
// v (for the README and tests; the sink runs them through
// clickhouse.Schema).
func DDL(database, cluster string, v clickhouse.Version, fields []accesslog.Field) []string {
	return clickhouse.CreateStatements(database, cluster, v, TableSpec(v, fields, nil, 0))
}

func hasTimestamp(cols []accessColumn) bool {
	for _, c := range cols {
		if c.name == "timestamp" {
			return true
		}
	}
	return false
}

// accessColumns maps fields to columns. existing holds the types of columns
// already in the table, which win (a table created by an older server keeps
// its DateTime + fraction layout after an upgrade).
func accessColumns(v clickhouse.Version, fields []accesslog.Field, existing map[string]string) []accessColumn {
	var cols []accessColumn
	seen := map[string]bool{}
	for _, f := range fields {
		if isFixed(f.Code) || seen[f.Code] || f.Code == "" {
			continue
		}
		seen[f.Code] = true
		c := accessColumn{field: f, name: f.Code}
		switch f.Type {
		case accesslog.TypeInteger:
			c.typ = "Int64"
		case accesslog.TypeFloat:
			c.typ = "Float64"
		case accesslog.TypeTimestamp:
			if v.HasDateTime64() {
				c.typ = "DateTime64(6)"
			} else {
				c.typ = "DateTime"
				c.fraction = f.Code + "_us"
			}
		default:
			c.typ = "String"
		}
		if t, ok := existing[c.name]; ok {
			c.typ = t
			c.fraction = ""
			if f.Type == accesslog.TypeTimestamp && t == "DateTime" {
				c.fraction = f.Code + "_us"
			}
		}
		cols = append(cols, c)
	}
	return cols
}

// ensureTable creates the table, or adds the columns it lacks, on the
// server or every node of the cluster, and returns its field columns, its
// spec and whether it is complete on every node.
func (a *Sink) ensureTable(ctx context.Context, db *clickhouse.DB) ([]accessColumn, *clickhouse.Table, bool, error) {
	spec := TableSpec(db.Version(), a.cfg.Fields, nil, a.cfg.Retention)
	// Twice at most: the second time with the types the table has (an
	// older server's DateTime timestamp wants its timestamp_us column).
	for range 2 {
		st, err := a.schema.Ensure(ctx, spec)
		if err != nil {
			return nil, nil, false, fmt.Errorf("clickhouse: %s: %w", Table, err)
		}
		next := TableSpec(db.Version(), a.cfg.Fields, st.Columns, a.cfg.Retention)
		missing := false
		for _, c := range next.Columns {
			if _, ok := st.Columns[c.Name]; !ok {
				missing = true
			}
		}
		if !missing {
			a.warnOldLayout(st)
			return accessColumns(db.Version(), a.cfg.Fields, st.Columns), next, st.Complete, nil
		}
		spec = next
	}
	return nil, nil, false, &clickhouse.SchemaError{Table: db.Table(Table), Reason: "columns still missing after adding them"}
}

// warnOldLayout logs, once, that access_logs is sorted without time (the
// layout before time joined the sorting key): it keeps working, but a query
// over a time range reads every part of an environment.
func (a *Sink) warnOldLayout(st *clickhouse.TableState) {
	if a.warned || st.SortingKey == "" || strings.Contains(st.SortingKey, "toStartOfHour") {
		return
	}
	if _, ok := st.Columns["timestamp"]; !ok {
		return
	}
	a.warned = true
	a.log.Warn("clickhouse: access_logs has the old layout, sorted without time: it keeps working, but a query over a time range reads every part of an environment; see the README (access_logs layout and migration) to move it to the new layout with RENAME and INSERT … SELECT",
		"table", Table, "sorting_key", st.SortingKey)
}

// Deliver inserts every record of the batches (in up to Concurrency
// INSERTs running at once) and returns nil once ClickHouse acknowledged all
// of them. A retried delivery inserts the same rows again;
// ReplacingMergeTree collapses them.
func (a *Sink) Deliver(ctx context.Context, batches []*accesslog.Batch) error {
	return a.Prepare(batches).Deliver(ctx)
}

// Prepare converts the batches into columns now, when the table's columns
// are known (after the first connect), so that the returned delivery only
// sends them (delivery.Preparer: the worker converts the next group while
// ClickHouse is still inserting the current one).
func (a *Sink) Prepare(batches []*accesslog.Batch) delivery.Prepared {
	p := &preparedInsert{a: a, groups: splitBatches(batches, a.cfg.Concurrency), version: uint64(time.Now().UnixNano())}
	a.mu.Lock()
	cols, gen := a.columns, a.gen
	a.mu.Unlock()
	if cols != nil {
		p.build(cols, gen, false)
	}
	return p
}

// preparedInsert is one delivery: its groups of batches, each converted
// into columns for the column layout of connect generation gen.
type preparedInsert struct {
	a       *Sink
	groups  [][]*accesslog.Batch
	version uint64
	gen     int
	data    []*columnData
}

// build converts every group (in parallel when there are several and
// parallel is set).
func (p *preparedInsert) build(cols []accessColumn, gen int, parallel bool) {
	p.gen = gen
	p.data = make([]*columnData, len(p.groups))
	if !parallel || len(p.groups) == 1 {
		for i, g := range p.groups {
			p.data[i] = buildColumns(g, cols, p.version)
		}
		return
	}
	var wg sync.WaitGroup
	for i, g := range p.groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.data[i] = buildColumns(g, cols, p.version)
		}()
	}
	wg.Wait()
}

// Deliver runs the INSERTs (connecting first when needed) and returns nil
// once ClickHouse acknowledged every row. It may be called again after an
// error.
func (p *preparedInsert) Deliver(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.a.cfg.InsertTimeout)
	defer cancel()
	db, cols, names, gen, err := p.a.connect(ctx)
	if err != nil {
		return err
	}
	if p.data == nil || p.gen != gen {
		p.build(cols, gen, true)
	}
	errs := make([]error, len(p.data))
	var wg sync.WaitGroup
	for i, data := range p.data {
		if data.rows == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = db.InsertColumns(ctx, Table, names, data.slices())
		}()
	}
	wg.Wait()
	err = errors.Join(errs...)
	if err != nil {
		if clickhouse.IsSchemaError(err) {
			// A table or column missing, or the schema mid-change: the
			// worker retries, and this sink repairs the table first.
			p.a.forgetTable()
		}
		return err
	}
	p.a.expire(ctx)
	return nil
}

// expire enforces the retention on servers without TTL (hourly at most,
// see clickhouse.Schema.Expire); a failure is logged, not returned.
func (a *Sink) expire(ctx context.Context) {
	a.mu.Lock()
	schema, spec := a.schema, a.spec
	a.mu.Unlock()
	if schema == nil || spec == nil {
		return
	}
	if _, err := schema.Expire(ctx, spec, time.Now()); err != nil {
		a.log.Warn("clickhouse: could not drop access_logs partitions older than the retention", "err", err)
	}
}

// splitBatches cuts batches into at most n runs of about equal record counts.
func splitBatches(batches []*accesslog.Batch, n int) [][]*accesslog.Batch {
	total := 0
	for _, b := range batches {
		total += len(b.Records)
	}
	if n <= 1 || len(batches) < 2 || total < 2000 {
		return [][]*accesslog.Batch{batches}
	}
	per := (total + n - 1) / n
	var out [][]*accesslog.Batch
	start, count := 0, 0
	for i, b := range batches {
		count += len(b.Records)
		if count >= per && len(out) < n-1 {
			out = append(out, batches[start:i+1])
			start, count = i+1, 0
		}
	}
	if start < len(batches) {
		out = append(out, batches[start:])
	}
	return out
}

// Close closes the connections.
func (a *Sink) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.db == nil {
		return nil
	}
	err := errors.Join(a.schema.Close(), a.db.Close())
	a.db, a.schema, a.columns = nil, nil, nil
	return err
}

// Kinds of field columns.
const (
	kindString = iota
	kindInt
	kindFloat
	kindTime
)

// columnData holds one INSERT, column by column. Field columns are kept in
// typed slices (not []any) so that appending a value never allocates.
type columnData struct {
	rows int
	// fixed columns
	env, agent, datestamp, recordKey, profile, format, extra []string
	seq                                                      []int64
	index                                                    []uint32
	received                                                 []time.Time
	version                                                  []uint64
	// field columns, parallel to cols; only the slice of each column's
	// kind is used
	cols   []accessColumn
	kind   []uint8
	strs   [][]string
	ints   [][]int64
	floats [][]float64
	times  [][]time.Time
	fracs  [][]uint32
}

func (d *columnData) slices() []any {
	out := []any{d.env, d.agent, d.datestamp, d.seq, d.recordKey, d.index, d.profile, d.format, d.received, d.extra, d.version}
	for i, c := range d.cols {
		switch d.kind[i] {
		case kindTime:
			out = append(out, d.times[i])
		case kindInt:
			out = append(out, d.ints[i])
		case kindFloat:
			out = append(out, d.floats[i])
		default:
			out = append(out, d.strs[i])
		}
		if c.fraction != "" {
			out = append(out, d.fracs[i])
		}
	}
	return out
}

// columnIndex finds a field column by its code.
type columnIndex map[string]int

// buildColumns converts the records into typed columns. Each record's
// members are walked once (accesslog.EachMember); string values without escapes
// are substrings of one string copy of the record, so a record costs one
// allocation, not one per field.
func buildColumns(batches []*accesslog.Batch, cols []accessColumn, version uint64) *columnData {
	n := 0
	for _, b := range batches {
		n += len(b.Records)
	}
	k := len(cols)
	d := &columnData{
		cols: cols, kind: make([]uint8, k),
		strs: make([][]string, k), ints: make([][]int64, k), floats: make([][]float64, k),
		times: make([][]time.Time, k), fracs: make([][]uint32, k),
		env: make([]string, 0, n), agent: make([]string, 0, n), datestamp: make([]string, 0, n),
		recordKey: make([]string, 0, n), profile: make([]string, 0, n), format: make([]string, 0, n),
		extra: make([]string, 0, n), seq: make([]int64, 0, n), index: make([]uint32, 0, n),
		received: make([]time.Time, 0, n), version: make([]uint64, 0, n),
	}
	byName := make(columnIndex, len(cols))
	for i, c := range cols {
		byName[c.name] = i
		switch {
		case c.field.Type == accesslog.TypeTimestamp:
			d.kind[i] = kindTime
			d.times[i] = make([]time.Time, 0, n)
			if c.fraction != "" {
				d.fracs[i] = make([]uint32, 0, n)
			}
		case c.typ == "Int64":
			d.kind[i] = kindInt
			d.ints[i] = make([]int64, 0, n)
		case c.typ == "Float64":
			d.kind[i] = kindFloat
			d.floats[i] = make([]float64, 0, n)
		default:
			d.kind[i] = kindString
			d.strs[i] = make([]string, 0, n)
		}
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
			rs := string(raw) // string values without escapes are substrings of rs
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
					d.dropLast(i)
				}
				// v is raw[off:off+len(v)].
				off := cap(raw) - cap(v)
				if !d.appendValue(i, v, rs[off:off+len(v)]) {
					d.appendZero(i)
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
					d.appendZero(i)
				}
			}
			// Identity.
			d.env = append(d.env, b.EnvironmentID)
			if b.HasIdentity() {
				d.agent = append(d.agent, b.AgentID)
				d.datestamp = append(d.datestamp, b.Datestamp)
				d.seq = append(d.seq, b.SeqNum)
				d.recordKey = append(d.recordKey, "")
				d.index = append(d.index, uint32(ri))
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
					d.index = append(d.index, uint32(ri))
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

// appendValue appends v to column i; vs is v's text as a string (shared
// with the rest of its record). It returns false when v does not fit the
// column's type (the caller then keeps it in extra). null counts as
// fitting: zero value.
func (d *columnData) appendValue(i int, v json.RawMessage, vs string) bool {
	if vs == "null" {
		d.appendZero(i)
		return true
	}
	switch d.kind[i] {
	case kindTime:
		sec, us, ok := parseTimestamp(vs)
		if !ok {
			return false
		}
		if d.cols[i].fraction != "" {
			d.times[i] = append(d.times[i], time.Unix(sec, 0).UTC())
			d.fracs[i] = append(d.fracs[i], us)
		} else {
			d.times[i] = append(d.times[i], time.Unix(sec, int64(us)*1000).UTC())
		}
	case kindInt:
		n, ok := parseRecordInt(vs)
		if !ok {
			return false
		}
		d.ints[i] = append(d.ints[i], n)
	case kindFloat:
		f, ok := parseRecordFloat(vs)
		if !ok {
			return false
		}
		d.floats[i] = append(d.floats[i], f)
	default:
		if len(vs) > 0 && vs[0] == '"' {
			var s string
			if strings.IndexByte(vs, '\\') < 0 {
				s = vs[1 : len(vs)-1]
			} else if s = jsonString(v); s == "" {
				return false
			}
			d.strs[i] = append(d.strs[i], s)
		} else {
			// A number or boolean where a string was expected: keep its text.
			if vs[0] == '{' || vs[0] == '[' {
				return false
			}
			d.strs[i] = append(d.strs[i], vs)
		}
	}
	return true
}

// dropLast removes the last value of column i.
func (d *columnData) dropLast(i int) {
	switch d.kind[i] {
	case kindTime:
		d.times[i] = d.times[i][:len(d.times[i])-1]
		if d.cols[i].fraction != "" {
			d.fracs[i] = d.fracs[i][:len(d.fracs[i])-1]
		}
	case kindInt:
		d.ints[i] = d.ints[i][:len(d.ints[i])-1]
	case kindFloat:
		d.floats[i] = d.floats[i][:len(d.floats[i])-1]
	default:
		d.strs[i] = d.strs[i][:len(d.strs[i])-1]
	}
}

// epoch is the zero of timestamp columns.
var epoch = time.Unix(0, 0).UTC()

func (d *columnData) appendZero(i int) {
	switch d.kind[i] {
	case kindTime:
		d.times[i] = append(d.times[i], epoch)
		if d.cols[i].fraction != "" {
			d.fracs[i] = append(d.fracs[i], 0)
		}
	case kindInt:
		d.ints[i] = append(d.ints[i], 0)
	case kindFloat:
		d.floats[i] = append(d.floats[i], 0)
	default:
		d.strs[i] = append(d.strs[i], "")
	}
}

// unquoteNumber strips the quotes of a JSON string holding a number ("200").
func unquoteNumber(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return s[1 : len(s)-1]
	}
	return s
}

func parseRecordInt(v string) (int64, bool) {
	s := unquoteNumber(v)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, true
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<62 {
		return 0, false
	}
	return int64(f), true
}

func parseRecordFloat(v string) (float64, bool) {
	f, err := strconv.ParseFloat(unquoteNumber(v), 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, false
	}
	return f, true
}

// parseTimestamp reads Unix seconds with an optional fraction
// ("1523916295.768957") exactly, without a float's rounding.
func parseTimestamp(v string) (sec int64, us uint32, ok bool) {
	s := unquoteNumber(v)
	if strings.ContainsAny(s, "eE") {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || f < 0 || f > 1<<40 {
			return 0, 0, false
		}
		sec = int64(f)
		return sec, uint32(math.Round((f - float64(sec)) * 1e6)), true
	}
	whole, frac, _ := strings.Cut(s, ".")
	sec, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || sec < 0 || sec > 1<<40 {
		return 0, 0, false
	}
	if frac != "" {
		if len(frac) > 6 {
			frac = frac[:6]
		}
		for len(frac) < 6 {
			frac += "0"
		}
		n, err := strconv.ParseUint(frac, 10, 32)
		if err != nil {
			return 0, 0, false
		}
		us = uint32(n)
	}
	return sec, us, true
}
