package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
)

// Tables of the reconciliation.
const (
	// CompletenessTable holds one row per environment and compared bucket
	// under FINAL.
	CompletenessTable = "log_completeness"
	// ProgressTable holds, per receiver replica, the time before which
	// every record it accepted is in ClickHouse (ClickHouse counts).
	ProgressTable = "log_delivery_progress"
	// accessLogs is the receiver's table of records.
	accessLogs = "access_logs"
)

// Completeness returns the log_completeness table: one row per
// environment and FIVE_MINUTES bucket (time: its start), written again when
// records arrive after the comparison, the newest (reconciled_at) kept.
func Completeness() *clickhouse.Table {
	return &clickhouse.Table{
		Name: CompletenessTable,
		Columns: []clickhouse.Column{
			{Name: "environment_id", Type: "String"},
			{Name: "time", Type: "DateTime"},
			{Name: "api_requests", Type: "UInt64"},
			{Name: "log_records", Type: "UInt64"},
			{Name: "sampling", Type: "Float64"},
			{Name: "reconciled_at", Type: "DateTime"},
		},
		Engine:         "ReplacingMergeTree",
		EngineArgs:     []string{"`reconciled_at`"},
		PartitionBy:    "toYYYYMM(`time`)",
		OrderBy:        []string{"environment_id", "`time`"},
		ShardingKey:    "cityHash64(environment_id)",
		WritesOwnTypes: true,
	}
}

// Progress returns the log_delivery_progress table: one row per replica
// under FINAL.
func Progress() *clickhouse.Table {
	return &clickhouse.Table{
		Name: ProgressTable,
		Columns: []clickhouse.Column{
			{Name: "replica", Type: "String"},
			{Name: "delivered_through", Type: "DateTime"},
			{Name: "reported_at", Type: "DateTime"},
			{Name: "stopped", Type: "UInt8"},
		},
		Engine:         "ReplacingMergeTree",
		EngineArgs:     []string{"reported_at"},
		OrderBy:        []string{"replica"},
		ShardingKey:    "cityHash64(replica)",
		WritesOwnTypes: true,
	}
}

// SchemaSource hands out the schema manager (and through it the
// connection) of a ClickHouse sink: the receiver's access-log sink.
type SchemaSource interface {
	Schema(ctx context.Context) (*clickhouse.Schema, error)
}

// chClient is the reconciliation's ClickHouse connection: the one of
// ClickHouseConfig.Schemas, or its own, opened when first needed and
// again after a failure. It ensures each of its tables once per schema
// manager; the manager's recheck completes a table left incomplete (a
// cluster node out of reach).
type chClient struct {
	cfg     ClickHouseConfig
	replica string
	log     *slog.Logger

	mu sync.Mutex
	// db and own are the connection opened from cfg.DSN and its schema
	// manager, without cfg.Schemas.
	db  *clickhouse.DB
	own *clickhouse.Schema
	// schema is the manager the tables in ensured were ensured with.
	schema   *clickhouse.Schema
	ensured  map[string]bool
	reported int64 // reported_at of the last progress row (Unix seconds)
}

func newCHClient(cfg ClickHouseConfig, replica string, log *slog.Logger) *chClient {
	return &chClient{cfg: cfg, replica: replica, log: log, ensured: map[string]bool{}}
}

// currentSchema returns the schema manager to use, opening the
// connection if needed. Called with c.mu held.
func (c *chClient) currentSchema(ctx context.Context) (*clickhouse.Schema, error) {
	if c.cfg.Schemas != nil {
		return c.cfg.Schemas.Schema(ctx)
	}
	if c.own == nil {
		db, err := clickhouse.Open(ctx, c.cfg.DSN, append(c.cfg.Options, clickhouse.WithLogger(c.log))...)
		if err != nil {
			return nil, err
		}
		c.db, c.own = db, clickhouse.NewSchema(db, c.log)
		c.own.StartRecheck(clickhouse.RecheckInterval)
	}
	return c.own, nil
}

// conn returns the connection with the tables ts in shape.
func (c *chClient) conn(ctx context.Context, ts ...*clickhouse.Table) (*clickhouse.DB, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	schema, err := c.currentSchema(ctx)
	if err != nil {
		return nil, err
	}
	if schema != c.schema {
		c.schema, c.ensured = schema, map[string]bool{}
	}
	for _, t := range ts {
		if c.ensured[t.Name] {
			continue
		}
		if _, err := schema.Ensure(ctx, t); err != nil {
			return nil, fmt.Errorf("ClickHouse table %s: %w", t.Name, err)
		}
		c.ensured[t.Name] = true
	}
	return schema.DB(), nil
}

// failed forgets the tables' state after an error, so the next use checks
// them again.
func (c *chClient) failed() {
	c.mu.Lock()
	c.ensured = map[string]bool{}
	c.mu.Unlock()
}

// Close closes the connection the client opened itself (not that of
// ClickHouseConfig.Schemas).
func (c *chClient) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.own == nil {
		return nil
	}
	err := errors.Join(c.own.Close(), c.db.Close())
	c.db, c.own, c.schema = nil, nil, nil
	return err
}

// completenessRow is one row of log_completeness.
type completenessRow struct {
	env               string
	start             int64
	expected, records int64
	share             float64
	at                int64
}

// writeRows writes rows into log_completeness.
func (c *chClient) writeRows(ctx context.Context, rows []completenessRow) error {
	db, err := c.conn(ctx, Completeness())
	if err != nil {
		return err
	}
	vals := make([][]any, len(rows))
	for i, r := range rows {
		vals[i] = []any{r.env, time.Unix(r.start, 0).UTC(), uint64(r.expected), uint64(r.records), r.share, time.Unix(r.at, 0).UTC()}
	}
	err = db.Insert(ctx, CompletenessTable, []string{"environment_id", "time", "api_requests", "log_records", "sampling", "reconciled_at"}, vals)
	if err != nil {
		c.failed()
	}
	return err
}

// counts returns, per environment and bucket start in [from, to) (Unix
// seconds), the records of access_logs under FINAL: each record once
// however often it was delivered, across every replica.
func (c *chClient) counts(ctx context.Context, envs []string, from, to int64) (map[string]map[int64]int64, error) {
	db, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	quoted := make([]string, len(envs))
	for i, e := range envs {
		quoted[i] = clickhouse.QuoteString(e)
	}
	q := fmt.Sprintf("SELECT environment_id, toUInt32(toStartOfFiveMinute(toDateTime(`timestamp`))) AS b, count() FROM %s FINAL"+
		" WHERE environment_id IN (%s) AND `timestamp` >= toDateTime(%d) AND `timestamp` < toDateTime(%d) GROUP BY environment_id, b",
		db.Table(accessLogs), strings.Join(quoted, ", "), from, to)
	rows, err := db.Conn().Query(ctx, q)
	if err != nil {
		c.failed()
		return nil, fmt.Errorf("counting access_logs: %w", err)
	}
	defer rows.Close()
	out := map[string]map[int64]int64{}
	for rows.Next() {
		var env string
		var b uint32
		var n uint64
		if err := rows.Scan(&env, &b, &n); err != nil {
			return nil, fmt.Errorf("counting access_logs: %w", err)
		}
		if out[env] == nil {
			out[env] = map[int64]int64{}
		}
		out[env][int64(b)] = int64(n)
	}
	return out, rows.Err()
}

// replicaProgress is one replica's row of log_delivery_progress.
type replicaProgress struct {
	replica           string
	through, reported time.Time
	stopped           bool
}

// progressReport is every replica's progress.
type progressReport []replicaProgress

// Silence after which a replica counts as gone (ClickHouse counts): it
// cannot have accepted records with timestamps after its last report plus
// the margin.
const (
	replicaGoneAfter  = 10 * time.Minute
	replicaGoneMargin = time.Minute
)

// behind returns a replica whose records of the bucket starting at start
// may not all be in ClickHouse yet (due: when it is compared), or "".
func (p progressReport) behind(start, due, now time.Time) string {
	for _, r := range p {
		switch {
		case r.stopped && !r.through.Before(r.reported.Add(-2*time.Second)):
			// Stopped with everything delivered: it holds nothing.
		case !r.through.Before(due):
		case now.Sub(r.reported) > replicaGoneAfter && !start.Before(r.reported.Add(replicaGoneMargin)):
			// Gone before the bucket began: none of its records are in it.
		default:
			return r.replica
		}
	}
	return ""
}

// progress reads every replica's progress.
func (c *chClient) progress(ctx context.Context) (progressReport, error) {
	db, err := c.conn(ctx, Progress())
	if err != nil {
		return nil, err
	}
	rows, err := db.Conn().Query(ctx, "SELECT replica, toUInt32(delivered_through), toUInt32(reported_at), stopped FROM "+db.Table(ProgressTable)+" FINAL")
	if err != nil {
		c.failed()
		return nil, fmt.Errorf("reading %s: %w", ProgressTable, err)
	}
	defer rows.Close()
	var out progressReport
	for rows.Next() {
		var r replicaProgress
		var through, reported uint32
		var stopped uint8
		if err := rows.Scan(&r.replica, &through, &reported, &stopped); err != nil {
			return nil, fmt.Errorf("reading %s: %w", ProgressTable, err)
		}
		r.through, r.reported, r.stopped = time.Unix(int64(through), 0), time.Unix(int64(reported), 0), stopped == 1
		out = append(out, r)
	}
	return out, rows.Err()
}

// report writes this replica's progress: every record it accepted before
// through (platform time) is in ClickHouse.
func (c *chClient) report(ctx context.Context, through, now time.Time, stopped bool) error {
	db, err := c.conn(ctx, Progress())
	if err != nil {
		return err
	}
	c.mu.Lock()
	at := max(now.Unix(), c.reported+1) // the row's version: never the same twice
	c.reported = at
	c.mu.Unlock()
	var st uint8
	if stopped {
		st = 1
	}
	err = db.Insert(ctx, ProgressTable, []string{"replica", "delivered_through", "reported_at", "stopped"},
		[][]any{{c.replica, through.UTC().Truncate(time.Second), time.Unix(at, 0).UTC(), st}})
	if err != nil {
		c.failed()
	}
	return err
}
