// Package clickhouse is what both programs' ClickHouse sinks share: a
// connection over the native protocol or the HTTP interface that knows the
// server's version (conn.go, http.go), the classification of server errors
// (errors.go), the self-metric of the schema (metrics.go), and the schema
// manager that creates and repairs tables, and the materialized views that
// fill some of them, on a single server or on every node of a cluster
// (table.go, view.go, schema.go). The tables themselves live in one package
// per program: metrictables (the exporter's table per metrics dataset),
// inventorysink (the exporter's writer of the inventory's tables) and
// logtable (the receiver's access_logs and its per-minute rollup), so
// neither binary links the other's code; inventorytables holds the
// definitions of the inventory's tables, which both programs make (the
// receiver only environments, for the Access logs dashboard).
//
// Every table written directly is a ReplacingMergeTree, so writing a row
// again is harmless: `SELECT … FINAL` shows one row per key with the newest
// values. Writers therefore retry freely, and INSERTs always name their
// columns explicitly so that a table with columns added later still accepts
// older writers. A table a view fills by aggregating (the receiver's
// rollup) cannot collapse a copy: there the INSERTs' deduplication tokens
// keep a retry from counting twice (WithDeduplicationToken).
//
// # Using the connection
//
//	db, err := clickhouse.Open(ctx, dsn, clickhouse.WithLogger(log))
//	defer db.Close()
//	v := db.Version()                          // e.g. v.HasLowCardinality()
//	err = db.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+db.Table("t")+" (…) ENGINE = …")
//	err = db.Insert(ctx, "t", []string{"a", "b"}, [][]any{{1, "x"}, {2, "y"}})
//	err = db.InsertColumns(ctx, "t", []string{"a", "b"}, []any{[]uint64{1, 2}, []string{"x", "y"}})
//
// # Keeping a table in shape
//
//	db, err := clickhouse.Open(ctx, dsn, clickhouse.WithCluster("prod")) // or no cluster
//	schema := clickhouse.NewSchema(db, log)
//	schema.StartRecheck(clickhouse.RecheckInterval) // completes incomplete tables; schema.Close stops it
//	state, err := schema.Ensure(ctx, &clickhouse.Table{Name: "t", Columns: …, Engine: "ReplacingMergeTree", …})
//	// insert into "t" (clickhouse.WithDeduplicationToken(ctx, <the rows' identity>));
//	// on an error of ClassSchema call Ensure again, then retry
//
// Open parses a DSN of the form `clickhouse://user:password@host:9000/db?dial_timeout=5s`,
// `http://host:8123/db` or `https://host:8443/db?secure=true`
// (clickhouse-go's ParseDSN: secure, skip_verify, compress, … work; the
// password may also come from WithPassword, so it need not sit in a flag;
// WithTLS adds a CA file and a server name), creates the database if it is
// missing and reads `SELECT version()`. An INSERT in a context from
// WithDeduplicationToken carries its token.
package clickhouse

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Version is a ClickHouse server version such as 18.16.1 or 24.8.4.13.
// The zero Version sorts before every real one.
type Version struct {
	Major, Minor, Patch, Build int
}

// ParseVersion parses the output of `SELECT version()` ("18.16.1",
// "24.8.4.13", "23.3.1.2823-lts"); missing parts are zero.
func ParseVersion(s string) (Version, error) {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, "-+ "); i >= 0 {
		s = s[:i]
	}
	parts := strings.Split(s, ".")
	if s == "" || len(parts) > 4 {
		return Version{}, fmt.Errorf("parse ClickHouse version %q: want MAJOR.MINOR[.PATCH[.BUILD]]", s)
	}
	var n [4]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 {
			return Version{}, fmt.Errorf("parse ClickHouse version %q: bad part %q", s, p)
		}
		n[i] = v
	}
	if len(parts) < 2 {
		return Version{}, fmt.Errorf("parse ClickHouse version %q: want MAJOR.MINOR[.PATCH[.BUILD]]", s)
	}
	return Version{Major: n[0], Minor: n[1], Patch: n[2], Build: n[3]}, nil
}

// String returns the version as MAJOR.MINOR.PATCH[.BUILD].
func (v Version) String() string {
	s := fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
	if v.Build != 0 {
		s += "." + strconv.Itoa(v.Build)
	}
	return s
}

// Compare returns -1, 0 or +1 as v is older than, equal to or newer than o.
func (v Version) Compare(o Version) int {
	a := [4]int{v.Major, v.Minor, v.Patch, v.Build}
	b := [4]int{o.Major, o.Minor, o.Patch, o.Build}
	for i := range a {
		switch {
		case a[i] < b[i]:
			return -1
		case a[i] > b[i]:
			return 1
		}
	}
	return 0
}

// AtLeast reports whether v is major.minor or newer.
func (v Version) AtLeast(major, minor int) bool {
	return v.Compare(Version{Major: major, Minor: minor}) >= 0
}

// HasLowCardinality reports whether LowCardinality(String) can be used without
// experimental settings (19.3 and later, ClickHouse PR #4323; 18.16 has it
// only behind allow_experimental_low_cardinality_type, which edgepipe does
// not turn on).
func (v Version) HasLowCardinality() bool { return v.AtLeast(19, 3) }

// HasTTL reports whether tables accept a TTL clause (19.6 and later).
func (v Version) HasTTL() bool { return v.AtLeast(19, 6) }

// HasCodecs reports whether columns accept CODEC(Delta, ZSTD) and friends.
// Per-column codecs arrived in 19.x; edgepipe uses them from 20.1 on, where
// Delta, DoubleDelta, Gorilla and ZSTD are all settled.
func (v Version) HasCodecs() bool { return v.AtLeast(20, 1) }

// HasReplicatedAlterLog reports whether an ALTER of a Replicated table is
// an entry of the replication log that a replica applies in order when it
// comes back (20.3 and later, metadata_version). Before, a replica applies
// the table structure it finds in ZooKeeper when it starts, and refuses to
// start when that differs from its own by more than two columns.
func (v Version) HasReplicatedAlterLog() bool { return v.AtLeast(20, 3) }

// HasDateTime64 reports whether the DateTime64 type exists (20.1 and later).
func (v Version) HasDateTime64() bool { return v.AtLeast(20, 1) }

// HasDeduplicationToken reports whether an INSERT can carry
// insert_deduplication_token (22.2 and later; with async_insert, which
// such servers have, turned off per INSERT, and the MergeTree setting
// non_replicated_deduplication_window for tables that are not Replicated).
func (v Version) HasDeduplicationToken() bool { return v.AtLeast(22, 2) }

// HasTTLOnlyDropParts reports whether a table takes ttl_only_drop_parts
// and ALTER … MODIFY TTL takes materialize_ttl_after_modify (both there
// well before 21.8, the oldest release edgepipe relies on for them).
func (v Version) HasTTLOnlyDropParts() bool { return v.AtLeast(21, 8) }

// Option configures Open.
type Option func(*openConfig)

type openConfig struct {
	log          *slog.Logger
	password     string
	hasPassword  bool
	dialTimeout  time.Duration
	cluster      string
	insertQuorum int
	tls          TLSOptions
	readOnly     bool
}

// TLSOptions are the client's side of TLS to ClickHouse, for a DSN that
// asks for TLS (https://…?secure=true, or clickhouse://…?secure=true).
type TLSOptions struct {
	// CAFile is a PEM file of the CA certificates the server's certificate
	// must chain to (default: the system's).
	CAFile string
	// ServerName is the name the certificate must be valid for (default:
	// the DSN's host).
	ServerName string
	// InsecureSkipVerify accepts any certificate: for tests only.
	InsecureSkipVerify bool
}

// IsZero reports whether no option is set.
func (o TLSOptions) IsZero() bool { return o == TLSOptions{} }

// apply sets o on the DSN's TLS configuration; it fails when the DSN does
// not use TLS or the CA file cannot be read.
func (o TLSOptions) apply(opts *ch.Options) error {
	if o.IsZero() {
		return nil
	}
	if opts.TLS == nil {
		return errors.New("TLS options need a DSN with TLS (https://HOST:8443/DB?secure=true, or clickhouse://HOST:9440/DB?secure=true)")
	}
	cfg := opts.TLS.Clone()
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return fmt.Errorf("ClickHouse TLS CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("ClickHouse TLS CA file %s: no PEM certificate in it", o.CAFile)
		}
		cfg.RootCAs = pool
	}
	if o.ServerName != "" {
		cfg.ServerName = o.ServerName
	}
	if o.InsecureSkipVerify {
		cfg.InsecureSkipVerify = true
	}
	opts.TLS = cfg
	return nil
}

// WithLogger sets the logger for connection events (default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *openConfig) { c.log = l } }

// WithPassword sets the password, overriding any in the DSN, so that the
// secret can come from the environment or a file instead of a flag.
func WithPassword(p string) Option {
	return func(c *openConfig) { c.password, c.hasPassword = p, true }
}

// WithCluster says that the DSN's server is a node of the cluster name (as
// in its remote_servers): Schema then manages every table on every node of
// the cluster, and INSERTs into Distributed tables are synchronous
// (insert_distributed_sync=1), so an acknowledged INSERT is on its shard,
// not queued on the entry node.
func WithCluster(name string) Option { return func(c *openConfig) { c.cluster = name } }

// WithTLS sets the TLS options of a DSN that uses TLS (Open fails when it
// does not).
func WithTLS(o TLSOptions) Option { return func(c *openConfig) { c.tls = o } }

// WithInsertQuorum makes every INSERT wait until n replicas of its shard
// have the rows (insert_quorum=n; Replicated tables only, so a cluster). 0
// or 1 waits for one.
func WithInsertQuorum(n int) Option { return func(c *openConfig) { c.insertQuorum = n } }

// ReadOnly makes Open leave the DSN's database alone: it neither creates
// it nor selects it on the connection (it may not exist), so the
// connection only reads the server's state, such as Schema.Inspect does
// for `check`. Table still names the DSN's database; DatabaseExists tells
// whether it exists.
func ReadOnly() Option { return func(c *openConfig) { c.readOnly = true } }

// DB is an open connection pool to one database of one ClickHouse server.
// It is safe for concurrent use.
type DB struct {
	conn     driver.Conn
	database string
	version  Version
	revision uint64
	addr     string
	cluster  string
	http     bool // the HTTP interface, not the native protocol
	log      *slog.Logger
	// options open connections to the cluster's other nodes (openNode).
	options *ch.Options
}

// Open connects to the ClickHouse server named by dsn, over the native
// protocol (clickhouse://host:9000/db) or the HTTP interface
// (http://host:8123/db, https://host:8443/db?secure=true), creates the
// DSN's database on that server if it does not exist (default "default";
// on a cluster Schema creates it on the other nodes; not with ReadOnly) and
// detects the server version. It fails when the server cannot be reached (callers that must
// survive an outage retry Open), and with an *UnsupportedServerError when
// the server answers but cannot serve this protocol (HTTP before 23.3).
func Open(ctx context.Context, dsn string, opts ...Option) (*DB, error) {
	cfg := openConfig{log: slog.Default(), dialTimeout: 5 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	chOpts, err := cfg.driverOptions(dsn)
	if err != nil {
		return nil, err
	}
	database := chOpts.Auth.Database
	if database == "" {
		database = "default"
	}
	addr := strings.Join(chOpts.Addr, ",")

	// The native handshake fails for a database that does not exist, so
	// create it over a connection without one first.
	if database != "default" && !cfg.readOnly {
		if err := createDatabase(ctx, chOpts, addr, database); err != nil {
			return nil, err
		}
	}
	connOpts := *chOpts
	connOpts.Auth.Database = database
	if cfg.readOnly {
		connOpts.Auth.Database = "" // it may not exist
	}
	db, err := connect(ctx, &connOpts, addr, database, cfg.log)
	if err != nil {
		if chOpts.Protocol == ch.HTTP {
			err = httpUnsupported(ctx, &connOpts, addr, err)
		}
		return nil, err
	}
	db.cluster = cfg.cluster
	db.options = chOpts
	cfg.log.Debug("connected to ClickHouse", "addr", addr, "database", database, "version", db.version.String(), "cluster", cfg.cluster)
	return db, nil
}

// driverOptions returns the driver's options for dsn with the Options of
// Open applied.
func (cfg *openConfig) driverOptions(dsn string) (*ch.Options, error) {
	chOpts, err := ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	if err := CheckDSN(dsn, cfg.cluster, cfg.tls); err != nil {
		return nil, err
	}
	if err := cfg.tls.apply(chOpts); err != nil {
		return nil, fmt.Errorf("ClickHouse DSN %s: %w", RedactDSN(dsn), err)
	}
	if cfg.hasPassword {
		chOpts.Auth.Password = cfg.password
	}
	if !strings.Contains(dsn, "dial_timeout") {
		chOpts.DialTimeout = cfg.dialTimeout
	}
	if cfg.insertQuorum < 0 {
		return nil, fmt.Errorf("ClickHouse insert quorum %d: want 0 or more", cfg.insertQuorum)
	}
	cfg.applySettings(chOpts)
	return chOpts, nil
}

// applySettings sets the settings inserts need on a cluster
// (insert_distributed_sync) and with an insert quorum.
func (cfg *openConfig) applySettings(chOpts *ch.Options) {
	if cfg.cluster == "" && cfg.insertQuorum <= 1 {
		return
	}
	if chOpts.Settings == nil {
		chOpts.Settings = ch.Settings{}
	}
	if cfg.cluster != "" {
		// UInt64 settings reach every server version as sent.
		chOpts.Settings["insert_distributed_sync"] = 1
	}
	if cfg.insertQuorum > 1 {
		chOpts.Settings["insert_quorum"] = cfg.insertQuorum
	}
}

// createDatabase creates database, if it does not exist, on the server at
// addr of chOpts, over a connection that selects no database.
func createDatabase(ctx context.Context, chOpts *ch.Options, addr, database string) error {
	boot := *chOpts
	boot.Auth.Database = ""
	bootConn, err := ch.Open(&boot)
	if err != nil {
		return fmt.Errorf("connect to ClickHouse at %s: %w", addr, err)
	}
	err = bootConn.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+QuoteIdent(database))
	_ = bootConn.Close()
	if err != nil {
		if chOpts.Protocol == ch.HTTP {
			err = httpUnsupported(ctx, &boot, addr, err)
		}
		return fmt.Errorf("create ClickHouse database %s at %s: %w", database, addr, err)
	}
	return nil
}

// connect opens a pool with opts and reads the server's version.
func connect(ctx context.Context, opts *ch.Options, addr, database string, log *slog.Logger) (*DB, error) {
	conn, err := ch.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("connect to ClickHouse at %s: %w", addr, err)
	}
	var vs string
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&vs); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("read ClickHouse server version at %s: %w", addr, err)
	}
	v, err := ParseVersion(vs)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	var revision uint64
	if sv, err := conn.ServerVersion(); err == nil {
		revision = sv.Revision
	}
	return &DB{conn: conn, database: database, version: v, revision: revision, addr: addr, http: opts.Protocol == ch.HTTP, log: log}, nil
}

// ParseDSN parses a DSN as Open does: clickhouse-go's ParseDSN, with the
// password redacted from any error. tcp:// and clickhouse:// are the
// native protocol, http:// and https:// (with secure=true) the HTTP
// interface.
func ParseDSN(dsn string) (*ch.Options, error) {
	opts, err := ch.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse ClickHouse DSN %s: %w", RedactDSN(dsn), err)
	}
	return opts, nil
}

// openNode connects to a server of the DSN's cluster at addr (host:port of
// its native port, as system.clusters lists it), or with addr "" to the
// DSN's own server(s), with the DSN's user, password and TLS settings. The
// connection selects no database (the DSN's may not exist there, or not any
// more); Table still qualifies names with the DSN's database.
func (db *DB) openNode(ctx context.Context, addr string) (*DB, error) {
	opts := *db.options
	if addr != "" {
		opts.Addr = []string{addr}
	} else {
		addr = db.addr
	}
	opts.Auth.Database = ""
	node, err := connect(ctx, &opts, addr, db.database, db.log)
	if err != nil {
		return nil, err
	}
	node.cluster, node.options = db.cluster, db.options
	return node, nil
}

// int64Setting returns what to send for the value n of an Int64 setting
// (such as distributed_ddl_task_timeout). Servers before the revision that
// reads settings as strings (54429, ClickHouse 19.11) read Int64 settings as
// zigzag varints while the driver writes plain ones, so n arrives as n/2:
// send 2n to them.
func (db *DB) int64Setting(n int) int {
	if !db.http && db.revision != 0 && db.revision <= 54429 {
		return 2 * n
	}
	return n
}

// Conn returns the underlying clickhouse-go connection for queries the
// helpers here do not cover.
func (db *DB) Conn() driver.Conn { return db.conn }

// Cluster returns the cluster given with WithCluster ("" for a single
// server).
func (db *DB) Cluster() string { return db.cluster }

// Database returns the name of the database the DSN selected.
func (db *DB) Database() string { return db.database }

// Version returns the server version found at Open.
func (db *DB) Version() Version { return db.version }

// Protocol returns "native" or "http".
func (db *DB) Protocol() string {
	if db.http {
		return "http"
	}
	return "native"
}

// Addr returns the server address(es), for logs (never carries credentials).
func (db *DB) Addr() string { return db.addr }

// Table returns the quoted, database-qualified name of table: `db`.`table`.
func (db *DB) Table(table string) string { return QuoteIdent(db.database) + "." + QuoteIdent(table) }

// Ping checks that the server answers.
func (db *DB) Ping(ctx context.Context) error {
	if err := db.conn.Ping(ctx); err != nil {
		return fmt.Errorf("ping ClickHouse at %s: %w", db.addr, err)
	}
	return nil
}

// Exec runs one statement (DDL or a parameterless command).
func (db *DB) Exec(ctx context.Context, query string, args ...any) error {
	if err := db.conn.Exec(ctx, query, args...); err != nil {
		return fmt.Errorf("ClickHouse %s: %w", firstWords(query), err)
	}
	return nil
}

// eachRow runs query and calls scan for each row of its answer (scan reads
// the row with rows.Scan); the first error ends it.
func (db *DB) eachRow(ctx context.Context, query string, scan func(rows driver.Rows) error) error {
	rows, err := db.conn.Query(ctx, query)
	if err != nil {
		return err
	}
	for rows.Next() {
		if err := scan(rows); err != nil {
			rows.Close()
			return err
		}
	}
	rows.Close() // before Err: closing reads the rest of the answer, errors included
	return rows.Err()
}

// Insert writes rows into table (unqualified; the DSN's database) in one
// INSERT with an explicit column list. Each row holds one value per column,
// in the order of columns, of a Go type the column accepts (string, uint64,
// float64, time.Time, …).
func (db *DB) Insert(ctx context.Context, table string, columns []string, rows [][]any) error {
	if len(rows) == 0 {
		return nil
	}
	batch, err := db.prepare(ctx, table, columns)
	if err != nil {
		return err
	}
	defer batch.Close()
	for i, r := range rows {
		if err := batch.Append(r...); err != nil {
			return fmt.Errorf("ClickHouse insert into %s: row %d: %w", table, i, err)
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("ClickHouse insert into %s (%d rows): %w", table, len(rows), err)
	}
	return nil
}

// InsertColumns writes one INSERT with column-oriented data: cols[i] is a
// slice ([]string, []uint64, []float64, []time.Time, …) with column i's value
// for every row; all slices have the same length. It is the fast path for
// large batches.
func (db *DB) InsertColumns(ctx context.Context, table string, columns []string, cols []any) error {
	if len(cols) != len(columns) {
		return fmt.Errorf("ClickHouse insert into %s: %d columns named, %d given", table, len(columns), len(cols))
	}
	batch, err := db.prepare(ctx, table, columns)
	if err != nil {
		return err
	}
	defer batch.Close()
	for i, c := range cols {
		if err := batch.Column(i).Append(c); err != nil {
			return fmt.Errorf("ClickHouse insert into %s: column %s: %w", table, columns[i], err)
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("ClickHouse insert into %s: %w", table, err)
	}
	return nil
}

func (db *DB) prepare(ctx context.Context, table string, columns []string) (driver.Batch, error) {
	quoted := make([]string, len(columns))
	for i, c := range columns {
		quoted[i] = QuoteIdent(c)
	}
	q := "INSERT INTO " + db.Table(table) + " (" + strings.Join(quoted, ", ") + ")"
	if settings := db.insertSettings(ctx); settings != nil {
		ctx = ch.Context(ctx, ch.WithSettings(settings))
	}
	batch, err := db.conn.PrepareBatch(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("ClickHouse prepare insert into %s: %w", table, err)
	}
	return batch, nil
}

// dedupTokenKey is the context key of WithDeduplicationToken.
type dedupTokenKey struct{}

// WithDeduplicationToken returns ctx for one INSERT (Insert,
// InsertColumns) that carries token, the identity of its rows: a server
// that has insert_deduplication_token (HasDeduplicationToken) stores the
// rows of a retried INSERT with the same token once, and so do the tables
// of materialized views fed by it (deduplicate_blocks_in_dependent_materialized_views;
// their tables need a deduplication window too). The same token must
// always name the same rows, in the same order. Older servers store the
// copy; FINAL collapses it.
func WithDeduplicationToken(ctx context.Context, token string) context.Context {
	return context.WithValue(ctx, dedupTokenKey{}, token)
}

// insertSettings returns the settings of an INSERT in ctx, nil for none.
// On servers with deduplication tokens, async_insert is off for every
// INSERT (ClickHouse 26 turns it on by default, and an asynchronous INSERT
// ignores the token unless async_insert_deduplicate is on); edgepipe's
// INSERTs are large already.
func (db *DB) insertSettings(ctx context.Context) ch.Settings {
	if !db.version.HasDeduplicationToken() {
		return nil
	}
	settings := ch.Settings{"async_insert": 0}
	if token, _ := ctx.Value(dedupTokenKey{}).(string); token != "" {
		settings["insert_deduplication_token"] = token
		settings["deduplicate_blocks_in_dependent_materialized_views"] = 1
	}
	return settings
}

// Close closes the connection pool.
func (db *DB) Close() error {
	if err := db.conn.Close(); err != nil {
		return fmt.Errorf("close ClickHouse connection to %s: %w", db.addr, err)
	}
	return nil
}

// QuoteIdent quotes a database, table or column name with backquotes
// (accepted by every ClickHouse version), escaping backquotes and
// backslashes inside it.
func QuoteIdent(name string) string {
	r := strings.NewReplacer("\\", "\\\\", "`", "\\`")
	return "`" + r.Replace(name) + "`"
}

// QuoteString quotes a string literal for ClickHouse SQL.
func QuoteString(s string) string {
	r := strings.NewReplacer("\\", "\\\\", "'", "\\'")
	return "'" + r.Replace(s) + "'"
}

// RedactDSN returns dsn with any password replaced by "xxxxx", for logs and
// error messages.
func RedactDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "(unparsable DSN)"
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.String()
}

func firstWords(q string) string {
	f := strings.Fields(q)
	if len(f) > 3 {
		f = f[:3]
	}
	return strings.Join(f, " ")
}
