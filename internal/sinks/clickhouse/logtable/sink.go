// Package logtable is the receiver's ClickHouse sink: every access-log
// record becomes one row of the access_logs table, with a typed column per
// known log field and the rest kept as JSON in extra. The table is a
// ReplacingMergeTree keyed by each record's identity, so a redelivered record
// collapses under `SELECT … FINAL`.
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
package logtable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
// with the same bytes). The table is a ReplacingMergeTree ordered by that
// identity, so every redelivery collapses and `SELECT count() FROM
// access_logs FINAL` counts each delivered record once.
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
}

// Sink is the receiver's ClickHouse sink. It connects (and creates or
// extends the table) at the first delivery, or at Check, so a server that
// is down at start-up only delays delivery. It is safe for concurrent use.
type Sink struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	db      *clickhouse.DB
	columns []accessColumn // in insert order
	names   []string
	gen     int // counts connects: prepared columns of another gen are rebuilt
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

// Check connects, creates or extends the table and checks that every
// column can hold its field. An *IncompatibleColumnError means the table
// must be changed before the sink can write; any other error that the
// server could not be reached (delivery connects again later).
func (a *Sink) Check(ctx context.Context) error {
	_, _, _, _, err := a.connect(ctx)
	return err
}

// connect opens the connection and ensures the table once (again after
// reset).
func (a *Sink) connect(ctx context.Context) (*clickhouse.DB, []accessColumn, []string, int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.db != nil {
		return a.db, a.columns, a.names, a.gen, nil
	}
	opts := append([]clickhouse.Option{clickhouse.WithLogger(a.log)}, a.cfg.Options...)
	db, err := clickhouse.Open(ctx, a.cfg.DSN, opts...)
	if err != nil {
		return nil, nil, nil, 0, err
	}
	cols, err := a.ensureTable(ctx, db)
	if err != nil {
		_ = db.Close()
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
	a.gen++
	a.db, a.columns, a.names = db, cols, names
	return db, cols, names, a.gen, nil
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
	_ = a.db.Close()
	a.db, a.columns, a.names = nil, nil, nil
}

// DDL returns the CREATE TABLE statement of access_logs for db's server
// version (exported for the README and tests). It is the one place the
// table's layout is decided.
func DDL(db *clickhouse.DB, fields []accesslog.Field) string {
	cols, _ := accessColumns(db.Version(), fields, nil)
	var b strings.Builder
	b.WriteString("CREATE TABLE IF NOT EXISTS " + db.Table(Table) + " (\n")
	for _, c := range fixedColumns {
		fmt.Fprintf(&b, "  %s %s,\n", clickhouse.QuoteIdent(c.name), c.typ)
	}
	for _, c := range cols {
		fmt.Fprintf(&b, "  %s %s,\n", clickhouse.QuoteIdent(c.name), c.typ.raw)
		if c.fraction != "" {
			fmt.Fprintf(&b, "  %s UInt32,\n", clickhouse.QuoteIdent(c.fraction))
		}
	}
	s := strings.TrimSuffix(b.String(), ",\n") + "\n)"
	part := "tuple()"
	if hasTimestamp(cols) {
		part = "toYYYYMM(`timestamp`)"
	}
	return s + " ENGINE = ReplacingMergeTree(insert_version)\nPARTITION BY " + part +
		"\nORDER BY (environment_id, profile_id, agent_id, datestamp, seq_num, record_key, record_index)"
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
		want := defaultType(f.Type, v.HasDateTime64())
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

// ensureTable creates the table, or adds the columns it lacks, and checks
// the types of those it has.
func (a *Sink) ensureTable(ctx context.Context, db *clickhouse.DB) ([]accessColumn, error) {
	existing, err := columnTypes(ctx, db, Table)
	if err != nil {
		return nil, err
	}
	if len(existing) == 0 {
		if err := db.Exec(ctx, DDL(db, a.cfg.Fields)); err != nil {
			return nil, fmt.Errorf("creating %s: %w", Table, err)
		}
		a.log.Info("clickhouse: created table", "table", Table, "server", db.Version().String())
		existing, err = columnTypes(ctx, db, Table)
		if err != nil {
			return nil, err
		}
	}
	if err := checkFixedColumns(existing); err != nil {
		return nil, err
	}
	cols, err := accessColumns(db.Version(), a.cfg.Fields, existing)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, c := range fixedColumns {
		if _, ok := existing[c.name]; !ok {
			missing = append(missing, clickhouse.QuoteIdent(c.name)+" "+c.typ)
		}
	}
	for _, c := range cols {
		if _, ok := existing[c.name]; !ok {
			missing = append(missing, clickhouse.QuoteIdent(c.name)+" "+c.typ.raw)
		}
		if _, ok := existing[c.fraction]; c.fraction != "" && !ok {
			missing = append(missing, clickhouse.QuoteIdent(c.fraction)+" UInt32")
		}
	}
	for _, m := range missing {
		// One column per ALTER: 18.16 has no ADD COLUMN IF NOT EXISTS, and a
		// concurrent replica may add the same column; re-check on error.
		if err := db.Exec(ctx, "ALTER TABLE "+db.Table(Table)+" ADD COLUMN "+m); err != nil {
			again, cerr := columnTypes(ctx, db, Table)
			name := strings.Trim(strings.Fields(m)[0], "`")
			if _, ok := again[name]; cerr != nil || !ok {
				return nil, fmt.Errorf("adding column to %s: %w", Table, err)
			}
		}
	}
	if len(missing) > 0 {
		a.log.Info("clickhouse: added columns", "table", Table, "columns", len(missing))
	}
	return cols, nil
}

func columnTypes(ctx context.Context, db *clickhouse.DB, table string) (map[string]string, error) {
	rows, err := db.Conn().Query(ctx, "SELECT name, type FROM system.columns WHERE database = "+
		clickhouse.QuoteString(db.Database())+" AND table = "+clickhouse.QuoteString(table))
	if err != nil {
		return nil, fmt.Errorf("reading columns of %s: %w", table, err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return nil, fmt.Errorf("reading columns of %s: %w", table, err)
		}
		out[name] = typ
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading columns of %s: %w", table, err)
	}
	return out, nil
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
}

// build converts every group (in parallel when there are several and
// parallel is set).
func (p *preparedInsert) build(cols []accessColumn, gen int, parallel bool) {
	p.gen = gen
	p.data = make([]*columnData, len(p.groups))
	clear(p.done) // a new table (re-created) needs every row again
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
			if errs[i] = db.InsertColumns(ctx, Table, names, data.slices()); errs[i] == nil {
				p.done[i] = true
			}
		}()
	}
	wg.Wait()
	return p.outcome(gen, errs)
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
				for bi := range group {
					for ri := range group[bi].Records {
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

// Close closes the connection.
func (a *Sink) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.db == nil {
		return nil
	}
	err := a.db.Close()
	a.db = nil
	return err
}
