// Package logtable is the receiver's ClickHouse sink: every access-log
// record becomes one row of the access_logs table, with a typed column per
// known log field and the rest kept as JSON in extra. The table is a
// ReplacingMergeTree whose sorting key ends with each record's identity, so
// a redelivered record collapses under `SELECT … FINAL`; time comes before
// the identity in the key, so a query over a time range reads only that
// range's part of each environment (see TableSpec). The table is kept in
// shape by clickhouse.Schema, on every node of a cluster when Options has
// clickhouse.WithCluster.
//
// The sink takes the table as it finds it: a field's existing column may
// be of any type that can hold the field (every integer and float width,
// Nullable, LowCardinality(String), String, DateTime, DateTime64); values
// are converted to it, and a value the column cannot hold (out of range, a
// fraction in an integer column, a timestamp before 1970 in a DateTime)
// leaves the column at its default and is kept as is in extra, never
// wrapped. A column that cannot hold its field at all is an
// *IncompatibleColumnError. When the table or a column disappears while the
// receiver runs, the next attempt re-creates it and inserts the rows again.
//
// Next to access_logs the sink makes its per-minute rollup, access_logs_1m,
// and the materialized view that fills it from every INSERT (RollupSpec):
// the Access logs dashboard's aggregate panels read it.
//
// The sink also makes the exporter's environments table
// (inventorytables.EnvironmentsTable), empty, which the Access logs
// dashboard joins for environment names: without it a deployment with no
// exporter writing to ClickHouse would fail every query of the dashboard.
package logtable

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/delivery"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/inventorytables"
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
//
// modern is the column's type and codec on modern servers (Modern): the
// identity's strings with few values as LowCardinality, codecs for the
// time, version and extra (long JSON text); the sorting key's other
// columns keep the default compression.
var fixedColumns = []struct{ name, typ, modern string }{
	{"environment_id", "String", "LowCardinality(String)"},
	{"agent_id", "String", "LowCardinality(String)"},
	{"datestamp", "String", "LowCardinality(String)"},
	{"seq_num", "Int64", "Int64"},
	{"record_key", "String", "String"},
	{"record_index", "UInt32", "UInt32"},
	{"profile_id", "String", "LowCardinality(String)"},
	{"format", "String", "LowCardinality(String)"},
	{"received_at", "DateTime", "DateTime CODEC(Delta, ZSTD(1))"},
	{"extra", "String", "String CODEC(ZSTD(1))"},
	{"insert_version", "UInt64", "UInt64 CODEC(Delta, ZSTD(1))"},
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
	// InsertTimeout bounds one delivery (default DefaultInsertTimeout).
	InsertTimeout time.Duration
	// Concurrency is how many INSERTs one delivery runs at once, each with
	// a share of the batches (default DefaultConcurrency). Rows are
	// idempotent, so order does not matter; more than 1 helps when the
	// server has idle cores (on a 2-core machine shared with the server it
	// did not).
	Concurrency int
	// Retention, when positive, removes records whose timestamp is older: a
	// TTL on servers that have one (19.6+), else whole daily partitions are
	// dropped once all their records are older (clickhouse.Schema.Expire).
	Retention time.Duration
}

// Sink is the receiver's ClickHouse sink. It connects (and creates or
// extends the table, on every node of the cluster when Options has
// clickhouse.WithCluster) at the first delivery, or at Check, so a server
// that is down at start-up only delays delivery. It is safe for concurrent
// use.
type Sink struct {
	cfg       Config
	log       *slog.Logger
	collector prometheus.Collector

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
	// resumed is set once a delivery succeeded: the first ones drop the
	// batches a previous run stored without committing them.
	resumed bool
	// envsEnsured is the schema manager the environments table was last
	// ensured through (not a.schema: not yet on this connection), and
	// envsFailed when ensuring it last failed (zero after a success).
	envsEnsured *clickhouse.Schema
	envsFailed  time.Time
	// rollupEnsured, rollupFailed: the same for the per-minute rollup
	// (ensureRollup), and rollup its spec (nil: none).
	rollupEnsured *clickhouse.Schema
	rollupFailed  time.Time
	rollup        *clickhouse.Table
}

// accessColumn is one typed field column.
type accessColumn struct {
	field accesslog.Field
	name  string     // column name (the field code)
	typ   columnType // its ClickHouse type
	// fraction is the companion column holding microseconds of a timestamp
	// in a DateTime column (servers without DateTime64).
	fraction string
}

// Defaults of Config.
const (
	DefaultInsertTimeout = 60 * time.Second
	DefaultConcurrency   = 1
)

// withDefaults returns c with every unset field set to its default.
func (c Config) withDefaults() Config {
	if c.Fields == nil {
		c.Fields = accesslog.Fields()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.InsertTimeout == 0 {
		c.InsertTimeout = DefaultInsertTimeout
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	return c
}

// validate reports every setting of c (with defaults applied) that cannot
// work.
func (c Config) validate() error {
	var errs []error
	if c.DSN == "" {
		errs = append(errs, errors.New("no DSN"))
	}
	if c.InsertTimeout < 0 {
		errs = append(errs, fmt.Errorf("insert timeout %s: must be positive", c.InsertTimeout))
	}
	if c.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("concurrency %d: must be positive", c.Concurrency))
	}
	if c.Retention < 0 {
		errs = append(errs, fmt.Errorf("retention %s: must not be negative", c.Retention))
	}
	return errors.Join(errs...)
}

// New returns the sink; it does not connect yet.
func New(cfg Config) (*Sink, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("clickhouse access-log sink: invalid configuration: %w", err)
	}
	a := &Sink{cfg: cfg, log: cfg.Logger}
	a.collector = clickhouse.NewSchemaCollector(a.currentSchema)
	return a, nil
}

func isFixed(code string) bool {
	for _, c := range fixedColumns {
		if c.name == code {
			return true
		}
	}
	return false
}

// Check connects, creates or extends the table and checks that every
// column can hold its field. An *IncompatibleColumnError means the table
// must be changed before the sink can write; any other error that the
// server could not be reached (delivery connects again later).
func (a *Sink) Check(ctx context.Context) error {
	_, _, _, _, err := a.connect(ctx)
	return err
}

// connect opens the connection if needed and ensures the table when its
// columns are not known (the first delivery, after a reset) or it was
// incomplete on the cluster RecheckInterval ago.
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
		a.db, a.schema, a.columns = db, clickhouse.NewSchema(db, a.log), nil
		a.schema.StartRecheck(clickhouse.RecheckInterval)
	}
	if a.columns == nil || (!a.complete && time.Since(a.checked) >= clickhouse.RecheckInterval) {
		cols, spec, complete, err := a.ensureTable(ctx, a.db)
		if err != nil {
			// Connect afresh next time: Open re-creates a dropped database.
			_ = a.schema.Close()
			_ = a.db.Close()
			a.db, a.schema, a.columns, a.names = nil, nil, nil, nil
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
		// A table read afresh (first, or re-created after a reset) needs
		// every row again; a periodic check that changed nothing does not.
		if a.columns == nil || !slices.Equal(names, a.names) || !sameTypes(cols, a.columns) {
			a.gen++
		}
		a.columns, a.names, a.spec, a.complete, a.checked = cols, names, spec, complete, time.Now()
	}
	a.ensureRollup(ctx)
	a.ensureEnvironments(ctx)
	return a.db, a.columns, a.names, a.gen, nil
}

// ensureEnvironments makes the exporter's environments table
// (inventorytables.EnvironmentsTable, the one definition both programs
// use) once per connection: the Access logs dashboard joins it for
// environment names, and without an exporter writing to this database
// every query of the dashboard would fail on a missing table. The receiver
// writes no row to it (the dashboard shows the environment's ID for one
// the table does not name). A failure is logged and tried again after
// clickhouse.RecheckInterval, never failing a delivery; on a cluster the
// schema's recheck completes the table on nodes that were out of reach.
// Called with a.mu held.
func (a *Sink) ensureEnvironments(ctx context.Context) {
	if a.envsEnsured == a.schema || time.Since(a.envsFailed) < clickhouse.RecheckInterval {
		return
	}
	if _, err := a.schema.Ensure(ctx, inventorytables.EnvironmentsTable()); err != nil {
		a.envsFailed = time.Now()
		a.log.Warn("clickhouse: could not create the environments table the Access logs dashboard joins for environment names (its queries fail without it); trying again",
			"table", a.db.Table(inventorytables.TableEnvironments), "err", err)
		return
	}
	a.envsEnsured, a.envsFailed = a.schema, time.Time{}
}

func sameTypes(a, b []accessColumn) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].name != b[i].name || a[i].typ.raw != b[i].typ.raw || a[i].fraction != b[i].fraction {
			return false
		}
	}
	return true
}

// reset forgets the connection and the table's columns of generation gen
// (the table or a column changed under the sink), so the next delivery
// connects, re-creates what is missing and reads the columns again.
func (a *Sink) reset(gen int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.db == nil || a.gen != gen {
		return
	}
	_ = a.schema.Close()
	_ = a.db.Close()
	a.db, a.schema, a.columns, a.names = nil, nil, nil, nil
}

// identity is the columns that name a record (see fixedColumns).
var identity = []string{"environment_id", "profile_id", "agent_id", "datestamp", "seq_num", "record_key", "record_index"}

// TableSpec returns access_logs for servers of version v: the fixed
// columns, a typed column per field (the types of existing, the table's
// present columns, win when they can hold the field; one that cannot is an
// *IncompatibleColumnError), ReplacingMergeTree(insert_version),
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
// unpartitioned. It is the one place the table's layout is decided.
func TableSpec(v clickhouse.Version, fields []accesslog.Field, existing map[string]string, retention time.Duration) (*clickhouse.Table, error) {
	cols, err := accessColumns(v, fields, existing)
	if err != nil {
		return nil, err
	}
	t := &clickhouse.Table{
		Name:        Table,
		Engine:      "ReplacingMergeTree",
		EngineArgs:  []string{"insert_version"},
		OrderBy:     identity,
		ShardingKey: "cityHash64(" + strings.Join(identity, ", ") + ")",
	}
	for _, c := range fixedColumns {
		typ := c.typ
		if Modern(v) {
			typ = c.modern
		}
		t.Columns = append(t.Columns, clickhouse.Column{Name: c.name, Type: typ})
	}
	for _, c := range cols {
		t.Columns = append(t.Columns, clickhouse.Column{Name: c.name, Type: c.typ.raw + fieldCodec(c.field, c.typ, v)})
		if c.fraction != "" {
			t.Columns = append(t.Columns, clickhouse.Column{Name: c.fraction, Type: "UInt32"})
		}
	}
	if hasTimestamp(cols) {
		t.PartitionBy = "toDate(`timestamp`)"
		t.OrderBy = append([]string{"environment_id", "toStartOfHour(`timestamp`)"}, identity[1:]...)
		t.Retention, t.RetentionTime = retention, "toDateTime(`timestamp`)"
		// Daily partitions and a retention in seconds: parts of a day
		// expire whole at most a day late, never rewritten row by row.
		t.TTLOnlyDropParts = true
	}
	return t, nil
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
// already in the table, which win when they can hold the field (a table
// created by an older server keeps its DateTime + fraction layout after an
// upgrade; an operator's UInt16 status_code stays UInt16); one that cannot
// is an *IncompatibleColumnError.
func accessColumns(v clickhouse.Version, fields []accesslog.Field, existing map[string]string) ([]accessColumn, error) {
	var cols []accessColumn
	seen := map[string]bool{}
	for _, f := range fields {
		if isFixed(f.Code) || seen[f.Code] || f.Code == "" {
			continue
		}
		seen[f.Code] = true
		want := defaultType(f, v)
		raw, ok := existing[f.Code]
		if !ok {
			raw = want
		}
		t, ok := parseColumnType(raw)
		if !ok || !t.holds(f.Type) {
			return nil, &IncompatibleColumnError{Table: Table, Column: f.Code, Type: raw, Field: f.Type, Want: want}
		}
		c := accessColumn{field: f, name: f.Code, typ: t}
		if f.Type == accesslog.TypeTimestamp && t.base == "DateTime" {
			c.fraction = f.Code + "_us"
		}
		cols = append(cols, c)
	}
	return cols, nil
}

// checkFixedColumns checks that the table's own columns have the types
// the sink writes (it fills them with fixed Go types).
func checkFixedColumns(existing map[string]string) error {
	for _, c := range fixedColumns {
		raw, ok := existing[c.name]
		if !ok {
			continue
		}
		t, ok := parseColumnType(raw)
		want, _ := parseColumnType(c.typ)
		if !ok || t.nullable || t.base != want.base {
			return &IncompatibleColumnError{Table: Table, Column: c.name, Type: raw, Want: c.typ}
		}
	}
	return nil
}

// ensureTable creates the table, or adds the columns it lacks, on the
// server or every node of the cluster, checks the types of those it has,
// and returns its field columns, its spec and whether it is complete on
// every node.
func (a *Sink) ensureTable(ctx context.Context, db *clickhouse.DB) ([]accessColumn, *clickhouse.Table, bool, error) {
	spec, err := TableSpec(db.Version(), a.cfg.Fields, nil, a.cfg.Retention)
	if err != nil {
		return nil, nil, false, err
	}
	// Twice at most: the second time with the types the table has (an
	// older server's DateTime timestamp wants its timestamp_us column).
	for range 2 {
		st, err := a.schema.Ensure(ctx, spec)
		if err != nil {
			return nil, nil, false, fmt.Errorf("clickhouse: %s: %w", Table, err)
		}
		if err := checkFixedColumns(st.Columns); err != nil {
			return nil, nil, false, err
		}
		next, err := TableSpec(db.Version(), a.cfg.Fields, st.Columns, a.cfg.Retention)
		if err != nil {
			return nil, nil, false, err
		}
		if len(clickhouse.MissingColumns(next, st.Columns)) == 0 {
			a.warnOldLayout(st)
			cols, err := accessColumns(db.Version(), a.cfg.Fields, st.Columns)
			return cols, next, st.Complete, err
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
	a.log.Warn("clickhouse: access_logs has the old layout, sorted without time: it keeps working, but a query over a time range reads every part of an environment; see docs/clickhouse.md (access_logs layout and migration) to move it to the new layout with RENAME and INSERT … SELECT",
		"table", Table, "sorting_key", st.SortingKey)
}

// Deliver inserts every record of the batches (in up to Concurrency
// INSERTs running at once) and returns nil once ClickHouse acknowledged all
// of them. A retried delivery inserts the same rows again;
// ReplacingMergeTree collapses them. An INSERT the server refuses for its
// data is a *delivery.RejectedError naming that INSERT's records (the
// worker splits it to find the rows at fault); a table or column that
// changed or disappeared is read again (and re-created) at the next attempt.
func (a *Sink) Deliver(ctx context.Context, batches []*accesslog.Batch) error {
	return a.Prepare(batches).Deliver(ctx)
}

// Prepare converts the batches into columns now, when the table's columns
// are known (after the first connect), so that the returned delivery only
// sends them (delivery.Preparer: the worker converts the next group while
// ClickHouse is still inserting the current one).
func (a *Sink) Prepare(batches []*accesslog.Batch) delivery.Prepared {
	p := &preparedInsert{a: a, batches: batches, groups: splitBatches(batches, a.cfg.Concurrency), version: uint64(time.Now().UnixNano())}
	p.done = make([]bool, len(p.groups))
	a.mu.Lock()
	cols, gen := a.columns, a.gen
	a.mu.Unlock()
	if cols != nil {
		p.build(cols, gen, false)
	}
	return p
}

// preparedInsert is one delivery: its groups of batches (consecutive runs
// of batches), each converted into columns for the column layout of
// connect generation gen.
type preparedInsert struct {
	a       *Sink
	batches []*accesslog.Batch
	groups  [][]*accesslog.Batch
	version uint64
	gen     int
	data    []*columnData
	done    []bool // groups acknowledged in generation gen
	// pending holds, for each batch a previous run already stored in full
	// or in part, the positions of its records still to insert (none when
	// it is stored in full); nil until dropStored checked.
	pending map[*accesslog.Batch][]int
}

// build converts every group (in parallel when there are several and
// parallel is set).
func (p *preparedInsert) build(cols []accessColumn, gen int, parallel bool) {
	p.gen = gen
	p.data = make([]*columnData, len(p.groups))
	clear(p.done) // a new table (re-created) needs every row again
	if !parallel || len(p.groups) == 1 {
		for i := range p.groups {
			p.data[i] = buildColumns(p.insertable(i), cols, p.version)
		}
		return
	}
	var wg sync.WaitGroup
	for i := range p.groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.data[i] = buildColumns(p.insertable(i), cols, p.version)
		}()
	}
	wg.Wait()
}

// insertable returns the batches of group i to insert: all but the
// records a previous run already stored (dropStored).
func (p *preparedInsert) insertable(i int) []*accesslog.Batch {
	if len(p.pending) == 0 {
		return p.groups[i]
	}
	var out []*accesslog.Batch
	for _, b := range p.groups[i] {
		pos, stored := p.pending[b]
		switch {
		case !stored:
			out = append(out, b)
		case len(pos) > 0:
			out = append(out, b.Select(pos...))
		}
	}
	return out
}

// positions returns the positions in b of the records to insert: all, or
// those a previous run did not store.
func (p *preparedInsert) positions(b *accesslog.Batch) []int {
	if pos, stored := p.pending[b]; stored {
		return pos
	}
	pos := make([]int, len(b.Records))
	for i := range pos {
		pos[i] = i
	}
	return pos
}

// dropStored finds the records of batches with identity that the table
// already holds, so that they are not inserted again: a batch stored in
// full is left out, one stored in part (an INSERT cut short: one shard of
// a cluster, or one day's partition, written) keeps only its other
// records. The first delivery after the receiver starts runs it: the spool
// delivers again what the previous run inserted but had not committed when
// it stopped, and when more batches arrived meanwhile it groups them
// differently, so their INSERT carries another deduplication token than
// the stored one (and a copy would count twice in the per-minute rollup,
// which no FINAL collapses).
func (p *preparedInsert) dropStored(ctx context.Context, db *clickhouse.DB) error {
	var keys []string
	want := map[string]*accesslog.Batch{}
	for _, b := range p.batches {
		if !b.HasIdentity() {
			continue
		}
		k := fmt.Sprintf("(%s, %s, %s, %s, %d)", clickhouse.QuoteString(b.EnvironmentID), clickhouse.QuoteString(b.ProfileID),
			clickhouse.QuoteString(b.AgentID), clickhouse.QuoteString(b.Datestamp), b.SeqNum)
		keys = append(keys, k)
		want[k] = b
	}
	if len(keys) == 0 {
		return nil
	}
	rows, err := db.Conn().Query(ctx, "SELECT environment_id, profile_id, agent_id, datestamp, seq_num, groupUniqArray(record_index) FROM "+
		db.Table(Table)+" WHERE (environment_id, profile_id, agent_id, datestamp, seq_num) IN ("+strings.Join(keys, ", ")+
		") GROUP BY environment_id, profile_id, agent_id, datestamp, seq_num")
	if err != nil {
		return fmt.Errorf("clickhouse: find the batches already stored: %w", err)
	}
	defer rows.Close()
	pending := map[*accesslog.Batch][]int{}
	records := 0
	for rows.Next() {
		var env, profile, agent, datestamp string
		var seq int64
		var indexes []uint32
		if err := rows.Scan(&env, &profile, &agent, &datestamp, &seq, &indexes); err != nil {
			return fmt.Errorf("clickhouse: find the batches already stored: %w", err)
		}
		k := fmt.Sprintf("(%s, %s, %s, %s, %d)", clickhouse.QuoteString(env), clickhouse.QuoteString(profile),
			clickhouse.QuoteString(agent), clickhouse.QuoteString(datestamp), seq)
		b := want[k]
		if b == nil {
			continue
		}
		have := make(map[uint32]bool, len(indexes))
		for _, i := range indexes {
			have[i] = true
		}
		pos := []int{}
		for i := range b.Records {
			if !have[uint32(b.RecordIndex(i))] {
				pos = append(pos, i)
			}
		}
		pending[b] = pos
		records += len(b.Records) - len(pos)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("clickhouse: find the batches already stored: %w", err)
	}
	if records > 0 {
		p.a.log.Info("clickhouse: records stored before the restart are not inserted again", "batches", len(pending), "records", records)
	}
	p.pending = pending
	return nil
}

// Deliver runs the INSERTs not yet acknowledged (connecting first when
// needed) and returns nil once ClickHouse acknowledged every row. It may be
// called again after an error.
func (p *preparedInsert) Deliver(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.a.cfg.InsertTimeout)
	defer cancel()
	db, cols, names, gen, err := p.a.connect(ctx)
	if err != nil {
		return err
	}
	first := !p.a.resumedDelivery()
	if first && p.pending == nil {
		if err := p.dropStored(ctx, db); err != nil {
			return err
		}
		p.data = nil
	}
	if p.data == nil || p.gen != gen {
		p.build(cols, gen, true)
	}
	errs := make([]error, len(p.data))
	var wg sync.WaitGroup
	for i, data := range p.data {
		if data.rows == 0 || p.done[i] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ictx := clickhouse.WithDeduplicationToken(ctx, groupToken(p.insertable(i), names))
			if errs[i] = db.InsertColumns(ictx, Table, names, data.slices()); errs[i] == nil {
				p.done[i] = true
			}
		}()
	}
	wg.Wait()
	if err := p.outcome(gen, errs); err != nil {
		return err
	}
	if first {
		p.a.mu.Lock()
		p.a.resumed = true
		p.a.mu.Unlock()
	}
	p.a.expire(ctx)
	return nil
}

// resumedDelivery reports whether a delivery succeeded since the sink was
// made (until then, deliveries drop what a previous run stored).
func (a *Sink) resumedDelivery() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.resumed
}

// expire enforces the retention of access_logs and its rollup on servers
// without TTL (hourly at most, see clickhouse.Schema.Expire); a failure is
// logged, not returned.
func (a *Sink) expire(ctx context.Context) {
	a.mu.Lock()
	schema, spec, rollup := a.schema, a.spec, a.rollup
	a.mu.Unlock()
	if schema == nil || spec == nil {
		return
	}
	for _, t := range []*clickhouse.Table{spec, rollup} {
		if t == nil {
			continue
		}
		if _, err := schema.Expire(ctx, t, time.Now()); err != nil {
			a.log.Warn("clickhouse: could not drop partitions older than the retention", "table", t.Name, "err", err)
		}
	}
}

// outcome turns the INSERTs' errors into the delivery contract's answer:
// nil, a failure to retry (resetting the sink's view of the table when it
// changed), or, when every failed INSERT was refused for its data, their
// records as a *delivery.RejectedError each.
func (p *preparedInsert) outcome(gen int, errs []error) error {
	var retry, rejected []error
	first := 0 // index of the first batch of group i
	for i, err := range errs {
		group := p.groups[i]
		if err != nil {
			switch clickhouse.ErrorClass(err) {
			case clickhouse.ClassRejected:
				var refs []delivery.RecordRef
				for bi, b := range group {
					for _, ri := range p.positions(b) {
						refs = append(refs, delivery.RecordRef{Batch: first + bi, Record: ri})
					}
				}
				rejected = append(rejected, &delivery.RejectedError{Records: refs, Reason: fmt.Sprintf("code_%d", clickhouse.ErrorCode(err)), Err: err})
			case clickhouse.ClassSchema:
				p.a.reset(gen)
				retry = append(retry, fmt.Errorf("%w (the table changed; reading it again)", err))
			default:
				retry = append(retry, err)
			}
		}
		first += len(group)
	}
	if len(retry) > 0 {
		return errors.Join(retry...)
	}
	return errors.Join(rejected...)
}

// groupToken returns the deduplication token of one INSERT: a hash of the
// identity of its batches (environment, profile, agent, datestamp and
// seq_num, or the content hash of a batch without identity), the records
// of each it holds, and the columns. A retried INSERT of the same records
// carries the same token, so a server with deduplication tokens stores its
// rows once (see clickhouse.WithDeduplicationToken).
func groupToken(batches []*accesslog.Batch, names []string) string {
	h := sha256.New()
	for _, n := range names {
		h.Write([]byte(n))
		h.Write([]byte{0})
	}
	var buf [8]byte
	for _, b := range batches {
		if b.HasIdentity() {
			fmt.Fprintf(h, "\x01%s\x00%s\x00%s\x00%s\x00%d", b.EnvironmentID, b.ProfileID, b.AgentID, b.Datestamp, b.SeqNum)
		} else {
			fmt.Fprintf(h, "\x02%s\x00%s", b.EnvironmentID, b.ContentHash())
		}
		for i := range b.Records {
			binary.BigEndian.PutUint64(buf[:], uint64(b.RecordIndex(i)))
			h.Write(buf[:])
		}
	}
	return "edgepipe-rtld-" + hex.EncodeToString(h.Sum(nil)[:16])
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

// Describe implements prometheus.Collector: the sink's self-metric
// edgepipe_clickhouse_incomplete_nodes{table} (clickhouse.NewSchemaCollector).
func (a *Sink) Describe(ch chan<- *prometheus.Desc) { a.collector.Describe(ch) }

// Collect implements prometheus.Collector.
func (a *Sink) Collect(ch chan<- prometheus.Metric) { a.collector.Collect(ch) }

// Schema connects if needed (making access_logs and the tables beside it)
// and returns the sink's schema manager, for the receiver's other tables
// (the reconciliation's): tables it ensures are rechecked while
// incomplete and counted by the sink's edgepipe_clickhouse_incomplete_nodes
// like the sink's own. After a reset the sink has another one: call
// Schema again after an error.
func (a *Sink) Schema(ctx context.Context) (*clickhouse.Schema, error) {
	if _, _, _, _, err := a.connect(ctx); err != nil {
		return nil, err
	}
	if s := a.currentSchema(); s != nil {
		return s, nil
	}
	return nil, errors.New("clickhouse access-log sink: closed")
}

func (a *Sink) currentSchema() *clickhouse.Schema {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.schema
}

// Close closes the connections.
func (a *Sink) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.db == nil {
		return nil
	}
	err := errors.Join(a.schema.Close(), a.db.Close())
	a.db, a.schema, a.columns, a.names = nil, nil, nil, nil
	return err
}
