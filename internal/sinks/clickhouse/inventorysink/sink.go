// Package inventorysink is the exporter's ClickHouse sink of its inventory
// (internal/inventory): it writes the tables of inventorytables,
// environments and tls_certificates, through the metrics sink's connection
// and schema manager, so they live in the DSN's database with the same
// settings, on the same cluster, and take part in its recheck and in
// edgepipe_clickhouse_incomplete_nodes.
//
// Every INSERT carries a deduplication token naming its rows (table,
// columns, the rows' keys and the write's version), and an INSERT that
// failed is retried as it was before anything newer of its table is
// written: a retry the server had stored already is dropped on servers
// with insert_deduplication_token (22.2+), so count() equals count() FINAL;
// on older servers FINAL shows one row per key as before.
package inventorysink

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/inventory"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/inventorytables"
)

// SchemaSource gives the schema manager of the connection to write through.
// *metrictables.Sink implements it: the inventory's tables share the
// metrics sink's connection, database and cluster.
type SchemaSource interface {
	Schema(ctx context.Context) (*clickhouse.Schema, error)
}

// Config configures a Sink.
type Config struct {
	// Schemas is where the tables go (required).
	Schemas SchemaSource
	// WriteTimeout bounds one write of both tables (default
	// DefaultWriteTimeout).
	WriteTimeout time.Duration
	// RetryMax is the longest wait between retries while ClickHouse fails
	// (default DefaultRetryMax; the first wait is a second).
	RetryMax time.Duration
	// Logger receives the sink's logs (default: discard).
	Logger *slog.Logger
	// Registerer receives the sink's self-metrics; nil registers nowhere.
	Registerer prometheus.Registerer
}

// Defaults of Config.
const (
	DefaultWriteTimeout = time.Minute
	DefaultRetryMax     = 30 * time.Second
)

func (c Config) withDefaults() Config {
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.RetryMax == 0 {
		c.RetryMax = DefaultRetryMax
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Schemas == nil {
		errs = append(errs, errors.New("no Schemas"))
	}
	if c.WriteTimeout < 0 || c.RetryMax < 0 {
		errs = append(errs, fmt.Errorf("WriteTimeout %s and RetryMax %s: must not be negative", c.WriteTimeout, c.RetryMax))
	}
	return errors.Join(errs...)
}

// Sink writes the inventory into the environments and tls_certificates
// tables and implements inventory.Publisher. Publishing only records the
// newest state of each key; a writer goroutine (Start … Close) creates the
// tables, writes what changed, and retries with backoff while ClickHouse
// fails, so what it holds is bounded by the inventory's size however long
// ClickHouse is away.
type Sink struct {
	cfg     Config
	log     *slog.Logger
	written *prometheus.CounterVec
	errors  *prometheus.CounterVec

	mu      sync.Mutex
	pending pending
	closing bool
	version uint64 // the last version written

	writer *clickhouse.Writer

	// ensured holds what Schema.Ensure last left of each table; a table
	// missing is ensured before its next write. Owned by the writer.
	ensured map[string]ensured
	// sealed holds, per table, the INSERT that failed last: it is retried
	// as it was (same rows, same version, same token) before anything
	// newer of the table is written. Owned by the writer.
	sealed map[string]*insert
}

// ensured is the outcome of one Schema.Ensure.
type ensured struct {
	complete bool
	at       time.Time
}

// pending is what waits to be written: the newest state of each key. A
// write forgets the changes it wrote unless they were replaced meanwhile
// (told apart by pointer).
type pending struct {
	envs  *envsChange
	byEnv map[string]*certsChange
}

type envsChange struct {
	at   time.Time
	envs []inventory.Environment
}

type certsChange struct {
	at    time.Time
	certs []inventory.Certificate
	gone  []inventory.Certificate
}

// New validates cfg and returns a sink that does not write yet; Start
// begins.
func New(cfg Config) (*Sink, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("ClickHouse inventory sink: invalid configuration: %w", err)
	}
	s := &Sink{
		cfg: cfg,
		log: cfg.Logger,
		written: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_clickhouse_inventory_rows_written_total",
			Help: "Rows written to the ClickHouse inventory tables (environments, tls_certificates), by table."}, []string{"table"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_clickhouse_inventory_write_errors_total",
			Help: "Failed writes to the ClickHouse inventory tables (retried), by table and error class."}, []string{"table", "class"}),
		pending: pending{byEnv: map[string]*certsChange{}},
		writer:  clickhouse.NewWriter(),
		ensured: map[string]ensured{},
		sealed:  map[string]*insert{},
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{s.written, s.errors} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("register ClickHouse inventory sink metrics: %w", err)
			}
		}
	}
	return s, nil
}

// PublishEnvironments records the environments served; the writer writes
// the newest list.
func (s *Sink) PublishEnvironments(at time.Time, envs []inventory.Environment) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return
	}
	s.pending.envs = &envsChange{at: at, envs: slices.Clone(envs)}
	s.mu.Unlock()
	s.poke()
}

// PublishCertificates records an environment's listing. A listing not yet
// written when the next arrives is replaced by it, keeping the certificates
// either of them saw go.
func (s *Sink) PublishCertificates(at time.Time, env string, certs, gone []inventory.Certificate) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return
	}
	c := &certsChange{at: at, certs: slices.Clone(certs)}
	var earlier []inventory.Certificate
	if old := s.pending.byEnv[env]; old != nil {
		earlier = old.gone
	}
	for _, g := range append(earlier, gone...) {
		listed := slices.ContainsFunc(certs, func(x inventory.Certificate) bool { return x.ID == g.ID })
		dup := slices.ContainsFunc(c.gone, func(x inventory.Certificate) bool { return x.ID == g.ID })
		if !listed && !dup {
			c.gone = append(c.gone, g)
		}
	}
	s.pending.byEnv[env] = c
	s.mu.Unlock()
	s.poke()
}

func (s *Sink) poke() { s.writer.Wake() }

// Start starts the writer goroutine; Close stops it.
func (s *Sink) Start() { s.writer.Start(s.run) }

// Close stops taking changes, writes what is pending (retrying while ctx
// allows), and stops the writer. Changes still pending when ctx ends are
// logged as lost: the next inventory after a start writes them again.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.writer.Stop(ctx)
	return nil
}

// run is the writer goroutine.
func (s *Sink) run() {
	ctx := s.writer.Context()
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = time.Second
	bo.MaxInterval = s.cfg.RetryMax
	for {
		select {
		case <-s.writer.Woken():
		case <-ctx.Done():
		}
		err := s.writePending()
		s.mu.Lock()
		closing, empty := s.closing, s.pending.envs == nil && len(s.pending.byEnv) == 0
		s.mu.Unlock()
		switch {
		case ctx.Err() != nil || (closing && empty):
			if !empty {
				s.log.Warn("ClickHouse inventory tables: changes not written at shutdown; the next start writes the inventory again")
			}
			return
		case err == nil:
			bo.Reset()
			if !empty {
				s.poke() // changes arrived during the write
			}
			continue
		}
		s.log.Warn("ClickHouse inventory tables: write failed, will retry", "err", err)
		select {
		case <-time.After(bo.NextBackOff()):
			s.poke()
		case <-ctx.Done():
		}
	}
}

// insert is one INSERT into one table and the pending changes it writes.
type insert struct {
	table *clickhouse.Table
	rows  [][]any
	token string
	envs  *envsChange             // environments: the change written
	certs map[string]*certsChange // tls_certificates: the changes written, by environment
}

// writePending writes, per table, the INSERT that failed last or else one
// of what is pending, and forgets the changes written unless they were
// replaced meanwhile. What an INSERT leaves pending (changes that arrived
// while a failed INSERT was retried) is written by the next call.
func (s *Sink) writePending() error {
	inserts := s.inserts()
	if len(inserts) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(s.writer.Context(), s.cfg.WriteTimeout)
	defer cancel()
	schema, err := s.cfg.Schemas.Schema(ctx)
	if err != nil {
		for _, in := range inserts {
			s.errors.WithLabelValues(in.table.Name, clickhouse.ErrorClass(err)).Inc()
		}
		return err
	}
	var errs []error
	for _, in := range inserts {
		if err := s.write(ctx, schema, in); err != nil {
			errs = append(errs, err)
			continue
		}
		s.forget(in)
	}
	return errors.Join(errs...)
}

// inserts returns the INSERTs of one write: per table the sealed one, or
// one of the pending changes with the next version.
func (s *Sink) inserts() []*insert {
	var out []*insert
	if in := s.sealed[inventorytables.TableEnvironments]; in != nil {
		out = append(out, in)
	} else {
		s.mu.Lock()
		envs := s.pending.envs
		s.mu.Unlock()
		if envs != nil {
			t := inventorytables.EnvironmentsTable()
			out = append(out, newInsert(t, environmentRows(envs, s.nextVersion()), envs, nil))
		}
	}
	if in := s.sealed[inventorytables.TableTLSCertificates]; in != nil {
		out = append(out, in)
	} else {
		s.mu.Lock()
		certs := maps.Clone(s.pending.byEnv)
		s.mu.Unlock()
		if len(certs) > 0 {
			t := inventorytables.CertificatesTable()
			out = append(out, newInsert(t, certificateRows(certs, s.nextVersion()), nil, certs))
		}
	}
	return out
}

// forget drops from what is pending the changes in wrote, unless they were
// replaced meanwhile (told apart by pointer).
func (s *Sink) forget(in *insert) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in.envs != nil && s.pending.envs == in.envs {
		s.pending.envs = nil
	}
	for env, c := range in.certs {
		if s.pending.byEnv[env] == c {
			delete(s.pending.byEnv, env)
		}
	}
}

// newInsert returns the INSERT of rows into t, with its token: a hash of
// the table, its columns and every row's key and version, so that the same
// token always names the same rows (a version is unique to one write).
func newInsert(t *clickhouse.Table, rows [][]any, envs *envsChange, certs map[string]*certsChange) *insert {
	h := sha256.New()
	h.Write([]byte(t.Name))
	for _, c := range t.Columns {
		h.Write([]byte{0})
		h.Write([]byte(c.Name))
	}
	keys := keyColumns(t)
	for _, r := range rows {
		for _, i := range keys {
			fmt.Fprintf(h, "\x00%v", r[i])
		}
	}
	return &insert{table: t, rows: rows, envs: envs, certs: certs,
		token: "edgepipe-inventory-" + hex.EncodeToString(h.Sum(nil)[:16])}
}

// keyColumns returns the positions of t's sorting-key columns and of its
// version column: what names a row.
func keyColumns(t *clickhouse.Table) []int {
	var out []int
	for i, c := range t.Columns {
		if c.SortingKey || c.Name == inventorytables.ColumnVersion {
			out = append(out, i)
		}
	}
	return out
}

// nextVersion returns a version larger than every one written before.
func (s *Sink) nextVersion() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := uint64(time.Now().UnixNano())
	if v <= s.version {
		v = s.version + 1
	}
	s.version = v
	return v
}

// write ensures in's table (on its first write, after a schema error, and
// while a cluster leaves it incomplete) and inserts its rows with its
// token. An INSERT that fails is sealed, to be retried as it was, unless
// the server refused its rows (then nothing was stored, and the next write
// is made afresh from what is pending).
func (s *Sink) write(ctx context.Context, schema *clickhouse.Schema, in *insert) error {
	t := in.table
	if e, ok := s.ensured[t.Name]; !ok || (!e.complete && time.Since(e.at) >= clickhouse.RecheckInterval) {
		state, err := schema.Ensure(ctx, t)
		if err != nil {
			s.errors.WithLabelValues(t.Name, clickhouse.ErrorClass(err)).Inc()
			return fmt.Errorf("ClickHouse table %s: %w", t.Name, err)
		}
		s.ensured[t.Name] = ensured{complete: state.Complete, at: time.Now()}
	}
	err := schema.DB().Insert(clickhouse.WithDeduplicationToken(ctx, in.token), t.Name, columnNames(t), in.rows)
	if err != nil {
		class := clickhouse.ErrorClass(err)
		s.errors.WithLabelValues(t.Name, class).Inc()
		if class == clickhouse.ClassSchema || class == clickhouse.ClassRejected {
			delete(s.ensured, t.Name)
		}
		if class == clickhouse.ClassRejected {
			delete(s.sealed, t.Name)
		} else {
			s.sealed[t.Name] = in
		}
		return err
	}
	delete(s.sealed, t.Name)
	s.written.WithLabelValues(t.Name).Add(float64(len(in.rows)))
	return nil
}

func environmentRows(c *envsChange, version uint64) [][]any {
	rows := make([][]any, 0, len(c.envs))
	for _, e := range c.envs {
		rows = append(rows, []any{e.ID, e.Name, e.PropertyID, e.Property, e.OrganizationID, c.at.UTC(), version})
	}
	return rows
}

func certificateRows(byEnv map[string]*certsChange, version uint64) [][]any {
	var rows [][]any
	for _, env := range slices.Sorted(maps.Keys(byEnv)) {
		c := byEnv[env]
		for _, x := range c.certs {
			rows = append(rows, certificateRow(env, x, 0, c.at, version))
		}
		for _, x := range c.gone {
			rows = append(rows, certificateRow(env, x, 1, c.at, version))
		}
	}
	return rows
}

func certificateRow(env string, c inventory.Certificate, removed uint8, at time.Time, version uint64) []any {
	names := c.AlternativeNames
	if names == nil {
		names = []string{}
	}
	return []any{env, c.ID, c.CommonName, names, c.Serial, c.Status, boolByte(c.Generated), c.ActivationError,
		dateTime(c.Expiration), dateTime(c.CreatedAt), dateTime(c.UpdatedAt), removed, at.UTC(), version}
}

// dateTime is t for a DateTime column: the Unix epoch for a zero time.
func dateTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Unix(0, 0).UTC()
	}
	return t.UTC()
}

// columnNames returns the names of t's columns, in order.
func columnNames(t *clickhouse.Table) []string {
	out := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		out[i] = c.Name
	}
	return out
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
