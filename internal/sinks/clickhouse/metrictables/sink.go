// Package metrictables is the exporter's ClickHouse sink: one table per
// metrics dataset, named as the dataset (a dataset exported with fewer
// dimensions has a table of its own, see TableName), written idempotently. Every table is
// a ReplacingMergeTree versioned by insert time, so a bucket written again
// (a revision, a retry, a restart) collapses to its newest row under
// `SELECT … FINAL`, and INSERTs name their columns so that tables extended
// later still accept older writers.
package metrictables

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/schedule"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
)

// SinkConfig configures the exporter's metrics sink.
type SinkConfig struct {
	// DSN names the server and database: clickhouse://host:9000/db
	// (native protocol), http://host:8123/db or https://host:8443/db?secure=true.
	DSN string
	// Password, when set, overrides the DSN's password (from the
	// environment or a file, never a flag).
	Password string
	// Retention, when positive, becomes the tables' TTL on servers that
	// have TTL (19.6+); on older servers whole monthly partitions are
	// dropped once all their rows are older (clickhouse.Schema.Expire). 0
	// keeps rows forever.
	Retention time.Duration
	// Cluster, when set, names the cluster (remote_servers) the DSN's
	// server belongs to: every dataset gets a Replicated <dataset>_local on
	// every node and a Distributed <dataset> sharded by environment, and
	// INSERTs are synchronous (see clickhouse.Schema).
	Cluster string
	// TLS holds the TLS options of a DSN with TLS (https://…?secure=true).
	TLS clickhouse.TLSOptions
	// InsertQuorum, when above 1, makes every INSERT wait until that many
	// replicas of its shard have the rows (insert_quorum).
	InsertQuorum int
	// MaxBackfill bounds how far back Resume lets the scheduler go
	// (default DefaultMaxBackfill).
	MaxBackfill time.Duration
	// QueueRows bounds the rows waiting to be written (default
	// DefaultQueueRows).
	// A batch that does not fit is dropped, counted and logged.
	QueueRows int
	// InsertTimeout bounds one INSERT (default DefaultInsertTimeout).
	InsertTimeout time.Duration
	// RetryMax is the longest wait between retries while ClickHouse is down
	// (default DefaultRetryMax; the first wait is 250ms).
	RetryMax time.Duration
	// Logger receives the sink's logs (default slog.Default()).
	Logger *slog.Logger
	// Registerer receives the sink's self-metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Sink writes every published bucket as a full row into its dataset's table
// and implements schedule.Publisher. Publish only queues; a writer goroutine
// (Start … Close) creates and migrates tables, batches rows into one INSERT
// per dataset and retries with backoff while ClickHouse is unavailable.
//
// Rows carry a strictly increasing version, so a revision written later
// replaces the bucket under `SELECT … FINAL`, and a row written twice (a
// retry after an ambiguous failure, a restart that re-polls) is harmless.
type Sink struct {
	cfg     SinkConfig
	log     *slog.Logger
	metrics *sinkMetrics

	mu          sync.Mutex
	queue       []*block
	queuedRows  int
	closing     bool
	inFlight    int
	lastVersion uint64
	// failedWrite is the batch of the last Write that failed and the
	// block it tried: a Write of the same batch next inserts that block
	// again.
	failedWrite struct {
		batch *schedule.Batch
		blk   *block
	}

	writer *clickhouse.Writer

	dbMu   sync.Mutex
	db     *clickhouse.DB
	schema *clickhouse.Schema
	// lastDialErr and lastDialAt make callers fail fast for a moment after
	// a failed connect, so that Resume calls of many datasets do not each
	// wait for a dial timeout while ClickHouse is down.
	lastDialErr error
	lastDialAt  time.Time

	// tables is the writer's knowledge of each dataset table's columns;
	// owned by the writer goroutine (and Resume, under dbMu).
	tablesMu sync.Mutex
	tables   map[string]*tableState
}

// tableState is what the last Schema.Ensure of a dataset's table left.
type tableState struct {
	spec     *clickhouse.Table
	columns  map[string]string
	complete bool
	checked  time.Time
}

// Defaults of SinkConfig.
const (
	DefaultMaxBackfill   = 24 * time.Hour
	DefaultQueueRows     = 1_000_000
	DefaultInsertTimeout = 60 * time.Second
	DefaultRetryMax      = 30 * time.Second
)

// withDefaults returns c with every unset field set to its default.
func (c SinkConfig) withDefaults() SinkConfig {
	if c.MaxBackfill == 0 {
		c.MaxBackfill = DefaultMaxBackfill
	}
	if c.QueueRows == 0 {
		c.QueueRows = DefaultQueueRows
	}
	if c.InsertTimeout == 0 {
		c.InsertTimeout = DefaultInsertTimeout
	}
	if c.RetryMax == 0 {
		c.RetryMax = DefaultRetryMax
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// validate reports every setting of c (with defaults applied) that cannot
// work.
func (c SinkConfig) validate() error {
	var errs []error
	if c.DSN == "" {
		errs = append(errs, errors.New("no DSN"))
	} else if err := clickhouse.CheckDSN(c.DSN, c.Cluster, c.TLS); err != nil {
		errs = append(errs, err)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Retention", c.Retention}, {"MaxBackfill", c.MaxBackfill}, {"InsertTimeout", c.InsertTimeout}, {"RetryMax", c.RetryMax}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %s: must not be negative", d.name, d.v))
		}
	}
	if c.QueueRows < 0 {
		errs = append(errs, fmt.Errorf("QueueRows %d: must be positive", c.QueueRows))
	}
	if c.InsertQuorum < 0 {
		errs = append(errs, fmt.Errorf("InsertQuorum %d: must not be negative", c.InsertQuorum))
	}
	return errors.Join(errs...)
}

// NewSink validates cfg and returns a sink that is not connected yet; Start
// begins writing.
func NewSink(cfg SinkConfig) (*Sink, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("clickhouse sink: invalid configuration: %w", err)
	}
	m, err := newSinkMetrics(cfg.Registerer, cfg.QueueRows)
	if err != nil {
		return nil, err
	}
	s := &Sink{
		cfg:     cfg,
		log:     cfg.Logger.With("sink", "clickhouse"),
		metrics: m,
		writer:  clickhouse.NewWriter(),
		tables:  make(map[string]*tableState),
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(clickhouse.NewSchemaCollector(s.currentSchema)); err != nil {
			return nil, fmt.Errorf("register ClickHouse sink metrics: %w", err)
		}
	}
	return s, nil
}

// currentSchema returns the schema manager of the open connection (nil
// while not connected).
func (s *Sink) currentSchema() *clickhouse.Schema {
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	return s.schema
}

// Start starts the writer goroutine. Call Close to stop it.
func (s *Sink) Start() { s.writer.Start(s.run) }

// Close stops accepting batches, writes what is queued (retrying while ctx
// allows), then stops the writer and closes the connection. Rows still
// queued when ctx ends are dropped, counted and logged.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.writer.Stop(ctx)
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	if s.db != nil {
		err := errors.Join(s.schema.Close(), s.db.Close())
		s.db, s.schema = nil, nil
		return err
	}
	return nil
}

func (s *Sink) poke() { s.writer.Wake() }

// Publish queues the batch's rows for writing and returns at once. It never
// blocks on ClickHouse; when the queue is full the batch is dropped and
// counted in edgepipe_clickhouse_dropped_rows_total{reason="queue_full"}.
func (s *Sink) Publish(_ context.Context, b *schedule.Batch) error {
	if b == nil || len(b.Updates) == 0 || b.Dataset == nil {
		return nil
	}
	blk := s.newBlock(b)
	if blk.rows == 0 {
		return nil
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		s.metrics.dropped.WithLabelValues(blk.dataset, "closed").Add(float64(blk.rows))
		return errors.New("clickhouse sink: closed")
	}
	if s.queuedRows+blk.rows > s.cfg.QueueRows {
		queued := s.queuedRows
		s.mu.Unlock()
		s.metrics.dropped.WithLabelValues(blk.dataset, "queue_full").Add(float64(blk.rows))
		s.log.Error("ClickHouse queue full: dropped a batch (ClickHouse down or too slow); run `exporter backfill` over the gap once it is back",
			"dataset", blk.dataset, "rows", blk.rows, "queued_rows", queued, "capacity_rows", s.cfg.QueueRows,
			"from", blk.minTime.Format(time.RFC3339), "to", blk.maxTime.Format(time.RFC3339))
		return nil
	}
	s.queue = append(s.queue, blk)
	s.queuedRows += blk.rows
	s.metrics.queueRows.Set(float64(s.queuedRows))
	s.mu.Unlock()
	s.poke()
	return nil
}

// newBlock converts b with the next version, counting rows it must skip.
func (s *Sink) newBlock(b *schedule.Batch) *block {
	s.mu.Lock()
	// The version orders writes, so it comes from the wall clock even when
	// a test gives the sink a simulated one.
	version := uint64(time.Now().UnixNano())
	if version <= s.lastVersion {
		version = s.lastVersion + 1
	}
	s.lastVersion = version
	s.mu.Unlock()
	blk, invalid := newBlock(b, version)
	if invalid > 0 {
		s.metrics.dropped.WithLabelValues(b.Dataset.Name, "invalid").Add(float64(invalid))
		s.log.Error("dropped rows with unparsable dimension values", "dataset", b.Dataset.Name, "rows", invalid)
	}
	return blk
}

// Write inserts the batch at once, bypassing the queue, and returns the
// number of rows written. It creates or migrates the table first. The
// backfill command uses it so that every chunk is stored before the next
// is fetched; the exporter's poll loops use Publish.
//
// A Write of the same batch (the same *schedule.Batch) right after one
// that failed is a retry: it inserts the rows as the failed one did, with
// the same version and deduplication token, so rows the server had stored
// before the failure are not stored again (22.2+). Unless the server
// refused the rows: then nothing was stored, and the retry is made afresh.
func (s *Sink) Write(ctx context.Context, b *schedule.Batch) (int, error) {
	if b == nil || b.Dataset == nil || len(b.Updates) == 0 {
		return 0, nil
	}
	s.mu.Lock()
	blk := s.failedWrite.blk
	if s.failedWrite.batch != b {
		blk = nil
	}
	s.failedWrite.batch, s.failedWrite.blk = nil, nil
	s.mu.Unlock()
	if blk == nil {
		blk = s.newBlock(b)
	}
	if blk.rows == 0 {
		return 0, nil
	}
	db, err := s.connect(ctx)
	if err == nil {
		err = s.writeBlock(ctx, db, blk)
	}
	if err != nil {
		class := clickhouse.ErrorClass(err)
		if db == nil {
			class = "connect"
		}
		s.metrics.insertErrors.WithLabelValues(blk.dataset, class).Inc()
		if class == clickhouse.ClassSchema || class == clickhouse.ClassRejected {
			s.forgetTable(blk.table)
		}
		if class != clickhouse.ClassRejected {
			s.mu.Lock()
			s.failedWrite.batch, s.failedWrite.blk = b, blk
			s.mu.Unlock()
		}
		return 0, err
	}
	s.metrics.rowsWritten.WithLabelValues(blk.dataset).Add(float64(blk.rows))
	return blk.rows, nil
}

// QueuedRows returns the number of rows waiting to be written.
func (s *Sink) QueuedRows() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queuedRows
}

// run is the writer goroutine.
func (s *Sink) run() {
	ctx := s.writer.Context()
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 250 * time.Millisecond
	bo.MaxInterval = s.cfg.RetryMax
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closing {
			s.mu.Unlock()
			select {
			case <-s.writer.Woken():
			case <-ctx.Done():
			}
			s.mu.Lock()
			if ctx.Err() != nil {
				break
			}
		}
		if len(s.queue) == 0 || ctx.Err() != nil {
			s.dropQueueLocked("shutdown")
			s.mu.Unlock()
			return
		}
		items := s.queue
		s.queue = nil
		s.inFlight = len(items)
		s.mu.Unlock()

		failed := s.writeAll(items)

		s.mu.Lock()
		s.inFlight = 0
		written := 0
		for _, it := range items {
			written += it.rows
		}
		for _, it := range failed {
			written -= it.rows
		}
		s.queuedRows -= written
		s.queue = append(failed, s.queue...)
		s.metrics.queueRows.Set(float64(s.queuedRows))
		s.mu.Unlock()

		if len(failed) == 0 {
			bo.Reset()
			continue
		}
		wait := bo.NextBackOff()
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
	}
}

// dropQueueLocked drops everything queued (the writer is stopping for good).
func (s *Sink) dropQueueLocked(reason string) {
	if s.queuedRows == 0 {
		return
	}
	for _, b := range s.queue {
		s.metrics.dropped.WithLabelValues(b.dataset, reason).Add(float64(b.rows))
	}
	s.log.Error("ClickHouse sink stopped with rows unwritten", "rows", s.queuedRows, "reason", reason)
	s.queue = nil
	s.queuedRows = 0
	s.metrics.queueRows.Set(0)
}

// maxInsertRows bounds the rows merged into one INSERT.
const maxInsertRows = 200_000

// writeAll writes the blocks, merged into one INSERT per dataset and column
// set, and returns the blocks that could not be written (to retry).
func (s *Sink) writeAll(items []*block) []*block {
	db, err := s.connect(s.writer.Context())
	if err != nil {
		s.metrics.up.Set(0)
		s.metrics.insertErrors.WithLabelValues("", "connect").Inc()
		s.log.Warn("ClickHouse unavailable, will retry", "err", err, "queued_rows", s.QueuedRows())
		return items
	}
	// One INSERT per dataset and column set, each of at most
	// maxInsertRows rows (after an outage the queue may hold many polls).
	groups := make(map[string][]*block)
	groupRows := make(map[string]int)
	var order []string
	for i, it := range items {
		sig := it.signature()
		k := sig
		if it.sealed {
			// A failed INSERT is retried as it was, so that its
			// deduplication token names the same rows.
			k = "\x00sealed#" + strconv.Itoa(i)
		}
		for n := 1; groupRows[k] > 0 && groupRows[k]+it.rows > maxInsertRows; n++ {
			k = sig + "\x00#" + strconv.Itoa(n)
		}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], it)
		groupRows[k] += it.rows
	}
	var failed []*block
	for _, k := range order {
		g := groups[k]
		merged := mergeBlocks(g)
		if err := s.writeBlock(s.writer.Context(), db, merged); err != nil {
			s.metrics.up.Set(0)
			class := clickhouse.ErrorClass(err)
			s.metrics.insertErrors.WithLabelValues(merged.dataset, class).Inc()
			switch class {
			case clickhouse.ClassSchema:
				// A table or column missing or changed, or the schema
				// mid-change: transient. The next attempt checks and
				// repairs the schema on every node first; the rows wait
				// in the queue.
				s.forgetTable(merged.table)
			case clickhouse.ClassRejected:
				// The server rejected the data itself: forget what we know
				// about the table (it may have changed) and give up on the
				// rows after a few attempts rather than blocking the queue.
				s.forgetTable(merged.table)
				merged.rejections++
				if merged.rejections >= 5 {
					s.metrics.dropped.WithLabelValues(merged.dataset, "rejected").Add(float64(merged.rows))
					s.log.Error("ClickHouse rejected rows five times; dropped them", "dataset", merged.dataset, "rows", merged.rows, "err", err)
					continue // not returned as failed: leaves the queue
				}
			}
			s.log.Warn("ClickHouse insert failed, will retry", "dataset", merged.dataset, "rows", merged.rows, "err", err)
			merged.sealed = true
			failed = append(failed, merged)
			continue
		}
		s.metrics.up.Set(1)
		s.metrics.rowsWritten.WithLabelValues(merged.dataset).Add(float64(merged.rows))
	}
	return failed
}

func (s *Sink) writeBlock(ctx context.Context, db *clickhouse.DB, b *block) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.InsertTimeout)
	defer cancel()
	spec, err := s.ensureTable(ctx, db, b.ds, b.cols)
	if err != nil {
		return err
	}
	start := time.Now()
	err = db.InsertColumns(clickhouse.WithDeduplicationToken(ctx, b.token()), b.table, columnNames(b.cols), b.columnData())
	s.metrics.insertDuration.WithLabelValues(b.dataset).Observe(time.Since(start).Seconds())
	if err == nil {
		s.expire(ctx, spec)
	}
	return err
}

// expire enforces the retention on servers without TTL (Schema.Expire
// runs at most hourly per table); a failure is logged, not returned.
func (s *Sink) expire(ctx context.Context, spec *clickhouse.Table) {
	s.dbMu.Lock()
	schema := s.schema
	s.dbMu.Unlock()
	if schema == nil {
		return
	}
	if _, err := schema.Expire(ctx, spec, s.cfg.Now()); err != nil {
		s.log.Warn("could not drop ClickHouse partitions older than --clickhouse.retention", "table", spec.Name, "err", err)
	}
}

// connect returns the open connection, opening one if needed.
func (s *Sink) connect(ctx context.Context) (*clickhouse.DB, error) {
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	if s.db != nil {
		return s.db, nil
	}
	if s.lastDialErr != nil && time.Since(s.lastDialAt) < 2*time.Second {
		return nil, s.lastDialErr
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	db, err := clickhouse.Open(ctx, s.cfg.DSN, s.openOptions()...)
	if err != nil {
		s.lastDialErr, s.lastDialAt = err, time.Now()
		return nil, err
	}
	s.lastDialErr = nil
	s.log.Info("connected to ClickHouse", "addr", db.Addr(), "protocol", db.Protocol(), "database", db.Database(), "version", db.Version().String(),
		"cluster", s.cfg.Cluster, "low_cardinality", db.Version().HasLowCardinality(), "ttl", db.Version().HasTTL(), "codecs", db.Version().HasCodecs())
	if s.cfg.Retention > 0 && !db.Version().HasTTL() {
		s.log.Info("ClickHouse server has no TTL; --clickhouse.retention drops whole monthly partitions once all their rows are older",
			"version", db.Version().String(), "retention", s.cfg.Retention.String())
	}
	s.db, s.schema = db, clickhouse.NewSchema(db, s.log)
	s.schema.StartRecheck(clickhouse.RecheckInterval)
	return db, nil
}

// openOptions are the options of clickhouse.Open for the configuration.
func (s *Sink) openOptions() []clickhouse.Option {
	opts := []clickhouse.Option{clickhouse.WithLogger(s.log), clickhouse.WithCluster(s.cfg.Cluster),
		clickhouse.WithInsertQuorum(s.cfg.InsertQuorum), clickhouse.WithTLS(s.cfg.TLS)}
	if s.cfg.Password != "" {
		opts = append(opts, clickhouse.WithPassword(s.cfg.Password))
	}
	return opts
}

// Preflight connects once to stop the program at its start when the server
// answers but can never be used (clickhouse.Preflight); a server out of
// reach is not an error.
func (s *Sink) Preflight(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	return clickhouse.Preflight(ctx, s.cfg.DSN, s.openOptions()...)
}

// Schema returns the sink's schema manager (the tables of its connection,
// on its cluster), connecting if needed.
func (s *Sink) Schema(ctx context.Context) (*clickhouse.Schema, error) {
	if _, err := s.connect(ctx); err != nil {
		return nil, err
	}
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	if s.schema == nil {
		return nil, errors.New("clickhouse sink: closed")
	}
	return s.schema, nil
}

func (s *Sink) forgetTable(table string) {
	s.tablesMu.Lock()
	defer s.tablesMu.Unlock()
	delete(s.tables, table)
}

// ensureTable makes sure dataset ds's table has cols (and every column of
// the descriptor) before an INSERT. It asks the schema manager on the
// first write of the dataset, when a batch brings a column the table has
// not, after a schema error (forgetTable), and every
// clickhouse.RecheckInterval while the table is incomplete on the cluster.
func (s *Sink) ensureTable(ctx context.Context, db *clickhouse.DB, ds *metricsapi.Dataset, cols []Column) (*clickhouse.Table, error) {
	s.tablesMu.Lock()
	defer s.tablesMu.Unlock()
	table := TableName(ds)
	st := s.tables[table]
	if st != nil && (st.complete || time.Since(st.checked) < clickhouse.RecheckInterval) {
		missing := false
		for _, c := range cols {
			if _, ok := st.columns[c.Name]; !ok {
				missing = true
				break
			}
		}
		if !missing {
			return st.spec, nil
		}
	}
	schema, err := s.Schema(ctx)
	if err != nil {
		return nil, err
	}
	// Every column the descriptor knows, plus any the batch has beyond it.
	spec := TableSpec(table, withExtra(MetricsColumns(ds, nil, nil), cols), db.Version(), s.cfg.Retention)
	state, err := schema.Ensure(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("ClickHouse table %s for dataset %s: %w", table, ds.Name, err)
	}
	s.tables[table] = &tableState{spec: spec, columns: state.Columns, complete: state.Complete, checked: time.Now()}
	return spec, nil
}

// withExtra appends the columns of extra that cols lacks (before version).
func withExtra(cols, extra []Column) []Column {
	have := make(map[string]bool, len(cols))
	for _, c := range cols {
		have[c.Name] = true
	}
	out := cols[: len(cols)-1 : len(cols)-1]
	for _, c := range extra {
		if !have[c.Name] {
			out = append(out, c)
			have[c.Name] = true
		}
	}
	return append(out, cols[len(cols)-1])
}

// Resume returns, per environment of envs, where the scheduler should resume
// polling dataset ds (as exported: its TableName) at granularity g: the start
// of the environment's newest stored bucket. An environment with no row in the table (a series without
// traffic, or one added while the exporter was down) gets the newest bucket
// of the whole table instead, since buckets without traffic are simply
// missing and the previous run polled all environments together. Every
// point is bounded to MaxBackfill before now (truncated to g); a warning
// names what is left to `exporter backfill`. An empty or missing table
// yields an empty map (the scheduler starts as new).
//
// Sink implements schedule.ResumeSource.
func (s *Sink) Resume(ctx context.Context, ds *metricsapi.Dataset, g metricsapi.Granularity, envs []string) (map[string]time.Time, error) {
	dataset, table := ds.Name, TableName(ds)
	out := make(map[string]time.Time)
	if len(envs) == 0 {
		return out, nil
	}
	db, err := s.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("resume %s from ClickHouse: %w", dataset, err)
	}
	where := " FROM " + db.Table(table) + " WHERE " + clickhouse.QuoteIdent(ColumnGranularity) + " = " + clickhouse.QuoteString(string(g))
	var newest time.Time
	var n uint64
	if err := db.Conn().QueryRow(ctx, "SELECT count(), max("+clickhouse.QuoteIdent(ColumnTime)+")"+where).Scan(&n, &newest); err != nil {
		if clickhouse.ErrorCode(err) == 60 { // UNKNOWN_TABLE: nothing stored yet
			return out, nil
		}
		return nil, fmt.Errorf("resume %s from ClickHouse: %w", dataset, err)
	}
	if n == 0 {
		return out, nil
	}
	quoted := make([]string, len(envs))
	for i, e := range envs {
		quoted[i] = clickhouse.QuoteString(e)
	}
	rows, err := db.Conn().Query(ctx, "SELECT "+clickhouse.QuoteIdent(ColumnEnvironment)+", max("+clickhouse.QuoteIdent(ColumnTime)+")"+where+
		" AND "+clickhouse.QuoteIdent(ColumnEnvironment)+" IN ("+strings.Join(quoted, ", ")+")"+
		" GROUP BY "+clickhouse.QuoteIdent(ColumnEnvironment))
	if err != nil {
		return nil, fmt.Errorf("resume %s from ClickHouse: %w", dataset, err)
	}
	defer rows.Close()
	for rows.Next() {
		var env string
		var t time.Time
		if err := rows.Scan(&env, &t); err != nil {
			return nil, fmt.Errorf("resume %s from ClickHouse: %w", dataset, err)
		}
		out[env] = t.UTC()
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("resume %s from ClickHouse: %w", dataset, err)
	}
	floor := g.Truncate(s.cfg.Now().Add(-s.cfg.MaxBackfill))
	clamped := 0
	var oldest time.Time
	for _, e := range envs {
		t, ok := out[e]
		if !ok {
			t = newest.UTC()
		}
		if t.Before(floor) {
			if clamped == 0 || t.Before(oldest) {
				oldest = t
			}
			clamped++
			t = floor
		}
		out[e] = t
	}
	if clamped > 0 {
		s.log.Warn("stored data ends before --clickhouse.max-backfill; resuming at the bound, run `exporter backfill` for the rest",
			"dataset", dataset, "environments", clamped, "oldest_newest_bucket", oldest.Format(time.RFC3339),
			"resume", floor.Format(time.RFC3339))
	}
	return out, nil
}

func columnNames(cols []Column) []string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = c.Name
	}
	return out
}

// block is one batch's rows in column-oriented form, ready to insert, or
// several merged into one INSERT.
type block struct {
	dataset    string
	table      string // TableName(ds)
	ds         *metricsapi.Dataset
	cols       []Column
	data       []colData
	rows       int
	rejections int
	// versions are the versions of the batches in the block, in order:
	// its identity (token).
	versions []uint64
	// sealed marks an INSERT that failed: it is retried as is, never
	// merged with other blocks, so its token names the same rows.
	sealed bool

	minTime, maxTime time.Time
}

// colData holds one column's values; only the slice of its kind is used.
type colData struct {
	kind ColumnKind
	s    []string
	i    []int64
	t    []time.Time
	u    []uint64
	f    []float64
}

func (c *colData) value() any {
	switch c.kind {
	case KindString:
		return c.s
	case KindInt:
		return c.i
	case KindDateTime:
		return c.t
	case KindUInt64:
		return c.u
	default:
		return c.f
	}
}

func (c *colData) appendFrom(o *colData) {
	c.s = append(c.s, o.s...)
	c.i = append(c.i, o.i...)
	c.t = append(c.t, o.t...)
	c.u = append(c.u, o.u...)
	c.f = append(c.f, o.f...)
}

// token returns the block's deduplication token: its table, columns and
// the versions of its batches (each unique within the process and across
// restarts, being wall-clock nanoseconds), so a retry of the same INSERT
// carries the same token and nothing else does.
func (b *block) token() string {
	h := sha256.New()
	h.Write([]byte(b.signature()))
	var buf [8]byte
	for _, v := range b.versions {
		binary.BigEndian.PutUint64(buf[:], v)
		h.Write(buf[:])
	}
	return "edgepipe-metrics-" + hex.EncodeToString(h.Sum(nil)[:16])
}

func (b *block) signature() string {
	return b.table + "\x00" + strings.Join(columnNames(b.cols), "\x00")
}

func (b *block) columnData() []any {
	out := make([]any, len(b.data))
	for i := range b.data {
		out[i] = b.data[i].value()
	}
	return out
}

// mergeBlocks concatenates blocks of the same signature into one.
func mergeBlocks(bs []*block) *block {
	if len(bs) == 1 {
		return bs[0]
	}
	m := &block{dataset: bs[0].dataset, table: bs[0].table, ds: bs[0].ds, cols: bs[0].cols, data: make([]colData, len(bs[0].cols))}
	for i := range m.data {
		m.data[i].kind = bs[0].data[i].kind
	}
	for _, b := range bs {
		for i := range m.data {
			m.data[i].appendFrom(&b.data[i])
		}
		m.rows += b.rows
		m.versions = append(m.versions, b.versions...)
		m.rejections = max(m.rejections, b.rejections)
	}
	return m
}

// newBlock converts a batch into columns, copying everything (Publish keeps
// no reference to the batch). It returns the number of rows it had to skip
// because a NUMBER or DATE dimension value did not parse.
func newBlock(b *schedule.Batch, version uint64) (*block, int) {
	cols := MetricsColumns(b.Dataset, nonNil(b.Labels), nonNil(b.Metrics))
	blk := &block{dataset: b.Dataset.Name, table: TableName(b.Dataset), ds: b.Dataset, cols: cols, data: make([]colData, len(cols)), versions: []uint64{version}}
	for i, c := range cols {
		blk.data[i] = newColData(c.Kind, len(b.Updates))
	}
	labels := newLabelValues(cols[3 : 3+len(b.Labels)])
	invalid := 0
	for ui := range b.Updates {
		r := &b.Updates[ui].Row
		// Parse labels first so a bad row is skipped whole.
		if !labels.parse(r) {
			invalid++
			continue
		}
		blk.appendRow(b, r, labels, version)
	}
	return blk, invalid
}

// newColData returns an empty column of kind with room for n values.
func newColData(kind ColumnKind, n int) colData {
	d := colData{kind: kind}
	switch kind {
	case KindString:
		d.s = make([]string, 0, n)
	case KindInt:
		d.i = make([]int64, 0, n)
	case KindDateTime:
		d.t = make([]time.Time, 0, n)
	case KindUInt64:
		d.u = make([]uint64, 0, n)
	case KindFloat64:
		d.f = make([]float64, 0, n)
	}
	return d
}

// labelValues holds the parsed values of a row's NUMBER and DATE labels,
// by label index.
type labelValues struct {
	cols  []Column // the label columns
	ints  []int64
	times []time.Time
}

// newLabelValues returns the parsed values of the label columns cols.
func newLabelValues(cols []Column) *labelValues {
	return &labelValues{cols: cols, ints: make([]int64, len(cols)), times: make([]time.Time, len(cols))}
}

// parse parses the NUMBER and DATE labels of r and reports whether they
// all parsed.
func (l *labelValues) parse(r *metricsapi.Row) bool {
	for li, c := range l.cols {
		var err error
		switch c.Kind {
		case KindInt:
			l.ints[li], err = parseInt(rowLabel(r, li))
		case KindDateTime:
			l.times[li], err = parseTime(rowLabel(r, li))
		}
		if err != nil {
			return false
		}
	}
	return true
}

// rowLabel returns label li of r, or "" when r has fewer.
func rowLabel(r *metricsapi.Row, li int) string {
	if li < len(r.Labels) {
		return r.Labels[li]
	}
	return ""
}

// appendRow appends row r of batch, whose labels are parsed in labels, to
// the block.
func (b *block) appendRow(batch *schedule.Batch, r *metricsapi.Row, labels *labelValues, version uint64) {
	nl, nm := len(batch.Labels), len(batch.Metrics)
	t := r.Time.UTC()
	if b.rows == 0 || t.Before(b.minTime) {
		b.minTime = t
	}
	if t.After(b.maxTime) {
		b.maxTime = t
	}
	b.data[0].t = append(b.data[0].t, t)
	b.data[1].s = append(b.data[1].s, string(batch.Granularity))
	b.data[2].s = append(b.data[2].s, r.Environment)
	appendLabels(b.data[3:3+nl], r, labels)
	appendValues(b.data[3+nl:3+nl+nm], r)
	b.data[3+nl+nm].u = append(b.data[3+nl+nm].u, version)
	b.rows++
}

// appendLabels appends the labels of r to their columns data, the parsed
// value of a NUMBER or DATE label, a copy of any other.
func appendLabels(data []colData, r *metricsapi.Row, labels *labelValues) {
	for li := range data {
		d := &data[li]
		switch d.kind {
		case KindInt:
			d.i = append(d.i, labels.ints[li])
		case KindDateTime:
			d.t = append(d.t, labels.times[li])
		default:
			d.s = append(d.s, strings.Clone(rowLabel(r, li)))
		}
	}
}

// appendValues appends the metric values of r to their columns data, a
// missing value as null (NaN), counts as UInt64.
func appendValues(data []colData, r *metricsapi.Row) {
	for mi := range data {
		v := math.NaN()
		if mi < len(r.Values) {
			v = r.Values[mi]
		}
		d := &data[mi]
		if d.kind == KindUInt64 {
			d.u = append(d.u, countValue(v))
		} else {
			d.f = append(d.f, v)
		}
	}
}

// nonNil turns nil into an empty slice, so MetricsColumns does not fill in
// the descriptor's names for a batch that has none.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// countValue converts an API count to UInt64: rounded, with null (NaN) and
// negative values as 0.
func countValue(v float64) uint64 {
	if math.IsNaN(v) || v <= 0 {
		return 0
	}
	if v >= math.MaxUint64 {
		return math.MaxUint64
	}
	return uint64(math.Round(v))
}

func parseInt(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return i, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<62 {
		return 0, fmt.Errorf("not an integer: %q", s)
	}
	return int64(f), nil
}

func parseTime(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02 15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, strings.TrimSpace(s)); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("not a date: %q", s)
}

// sinkMetrics are the sink's self-metrics.
type sinkMetrics struct {
	queueRows      prometheus.Gauge
	queueCapacity  prometheus.Gauge
	rowsWritten    *prometheus.CounterVec
	dropped        *prometheus.CounterVec
	insertErrors   *prometheus.CounterVec
	insertDuration *prometheus.HistogramVec
	up             prometheus.Gauge
}

func newSinkMetrics(reg prometheus.Registerer, capacity int) (*sinkMetrics, error) {
	m := &sinkMetrics{
		queueRows: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgepipe_clickhouse_queue_rows", Help: "Rows waiting in memory to be written to ClickHouse."}),
		queueCapacity: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgepipe_clickhouse_queue_capacity_rows", Help: "Most rows the ClickHouse queue holds before it drops batches."}),
		rowsWritten: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_clickhouse_rows_written_total", Help: "Rows written to ClickHouse, by dataset."}, []string{"dataset"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_clickhouse_dropped_rows_total",
			Help: "Rows not written to ClickHouse, by dataset and reason (queue_full, rejected, invalid, shutdown, closed)."}, []string{"dataset", "reason"}),
		insertErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_clickhouse_insert_errors_total", Help: "Failed ClickHouse inserts (retried), by dataset and class."}, []string{"dataset", "class"}),
		insertDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "edgepipe_clickhouse_insert_duration_seconds", Help: "Duration of ClickHouse inserts, by dataset.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12)}, []string{"dataset"}),
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgepipe_clickhouse_up", Help: "1 when the last ClickHouse write succeeded, 0 when it failed."}),
	}
	m.queueCapacity.Set(float64(capacity))
	if reg != nil {
		for _, c := range []prometheus.Collector{m.queueRows, m.queueCapacity, m.rowsWritten, m.dropped, m.insertErrors, m.insertDuration, m.up} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register ClickHouse sink metrics: %w", err)
			}
		}
	}
	return m, nil
}
