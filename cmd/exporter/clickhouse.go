package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"

	"github.com/edgepipe/edgepipe/internal/cli"
	"github.com/edgepipe/edgepipe/internal/preflight"
	"github.com/edgepipe/edgepipe/internal/schedule"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/inventorysink"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/inventorytables"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/metrictables"
)

// envClickHousePassword holds the ClickHouse password when it is not in the
// DSN (secrets never in flag values).
const envClickHousePassword = "EDGEPIPE_CLICKHOUSE_PASSWORD"

// clickhouseFlags are the --clickhouse.* flags, shared by the run and
// backfill commands.
type clickhouseFlags struct {
	dsn          string
	password     *cli.Secret
	retention    model.Duration
	maxBackfill  model.Duration
	cluster      string
	insertQuorum int
	queueRows    int
	tls          clickhouse.TLSOptions
}

// addClickHouseFlags registers the --clickhouse.* flags on cmd; those that
// only concern a running exporter are hidden when forBackfill.
func addClickHouseFlags(cmd *kingpin.CmdClause, forBackfill bool) *clickhouseFlags {
	f := &clickhouseFlags{}
	cmd.Flag("clickhouse.dsn", "Enables the ClickHouse sink: clickhouse://127.0.0.1:9000/cdn (native protocol), http://HOST:8123/cdn or https://HOST:8443/cdn?secure=true (HTTP interface, ClickHouse 23.3 on) "+
		"(database created if missing). The password goes in $"+envClickHousePassword+" or --clickhouse.password-file, not here.").
		Envar("EDGEPIPE_CLICKHOUSE_DSN").PlaceHolder("clickhouse://HOST:9000/DB").StringVar(&f.dsn)
	addClickHouseTLSFlags(cmd, &f.tls)
	f.password = cli.SecretFlag(cmd, "clickhouse.password-file", envClickHousePassword, "File holding the ClickHouse password.")
	cmd.Flag("clickhouse.retention", "Drop rows older than this, e.g. 32d: a table TTL from ClickHouse 19.6 on; on older servers whole monthly partitions are dropped once all their rows are older. 0 keeps everything.").
		Default("0s").SetValue(&f.retention)
	maxBackfill := cmd.Flag("clickhouse.max-backfill", "At start, resume each dataset from the newest stored bucket, but reach back at most this far (e.g. 24h, 3d).").
		Default(model.Duration(metrictables.DefaultMaxBackfill).String())
	maxBackfill.SetValue(&f.maxBackfill)
	cmd.Flag("clickhouse.cluster", "The cluster (remote_servers) the DSN's server belongs to: Replicated <dataset>_local tables on every node and a Distributed <dataset> sharded by environment, created ON CLUSTER, checked and completed on every node; synchronous inserts (needs macros {shard} and {replica}).").
		PlaceHolder("NAME").StringVar(&f.cluster)
	cmd.Flag("clickhouse.insert-quorum", "With --clickhouse.cluster: an INSERT succeeds only once this many replicas of its shard have the rows (insert_quorum; 0 = one replica).").
		Default("0").IntVar(&f.insertQuorum)
	queue := cmd.Flag("clickhouse.queue-rows", "Rows held in memory while ClickHouse is slow or down; beyond it batches are dropped and counted.").
		Default(strconv.Itoa(metrictables.DefaultQueueRows))
	queue.IntVar(&f.queueRows)
	if forBackfill {
		maxBackfill.Hidden()
		queue.Hidden()
	}
	return f
}

// addClickHouseTLSFlags registers the --clickhouse.tls.* flags into o.
func addClickHouseTLSFlags(cmd *kingpin.CmdClause, o *clickhouse.TLSOptions) {
	cmd.Flag("clickhouse.tls.ca-file", "With a DSN that uses TLS (https://…?secure=true, clickhouse://…?secure=true): PEM file of the CA certificates the server's certificate must chain to (default: the system's).").
		PlaceHolder("FILE").StringVar(&o.CAFile)
	cmd.Flag("clickhouse.tls.server-name", "With TLS: the name the server's certificate must be valid for (default: the DSN's host).").
		PlaceHolder("NAME").StringVar(&o.ServerName)
	cmd.Flag("clickhouse.tls.insecure-skip-verify", "FOR TESTING ONLY: accept any ClickHouse server certificate (anyone on the path can read and alter the traffic).").
		BoolVar(&o.InsecureSkipVerify)
}

// enabled reports whether a DSN was given.
func (f *clickhouseFlags) enabled() bool { return strings.TrimSpace(f.dsn) != "" }

// newSink builds the ClickHouse sink from the flags (not started).
func (f *clickhouseFlags) newSink(h *host, reg prometheus.Registerer) (*metrictables.Sink, error) {
	pw, err := f.password.Read()
	if err != nil {
		return nil, err
	}
	if f.queueRows <= 0 {
		return nil, fmt.Errorf("--clickhouse.queue-rows must be positive, got %d", f.queueRows)
	}
	if f.retention < 0 || f.maxBackfill < 0 {
		return nil, errors.New("--clickhouse.retention and --clickhouse.max-backfill must not be negative")
	}
	if f.insertQuorum < 0 || (f.insertQuorum > 1 && f.cluster == "") {
		return nil, fmt.Errorf("--clickhouse.insert-quorum %d: want 0 or more, and above 1 only with --clickhouse.cluster (a quorum counts replicas)", f.insertQuorum)
	}
	var now func() time.Time // the platform's clock when the command follows it
	if h.platformClock != nil {
		now = h.platformClock.Now
	}
	sink, err := metrictables.NewSink(metrictables.SinkConfig{
		Now:          now,
		DSN:          strings.TrimSpace(f.dsn),
		Password:     pw,
		TLS:          f.tls,
		Retention:    time.Duration(f.retention),
		Cluster:      f.cluster,
		InsertQuorum: f.insertQuorum,
		MaxBackfill:  time.Duration(f.maxBackfill),
		QueueRows:    f.queueRows,
		Logger:       h.log.With("component", "clickhouse"),
		Registerer:   reg,
	})
	if err != nil {
		return nil, fmt.Errorf("ClickHouse sink: %w", err)
	}
	return sink, nil
}

// clickhouseExtension adds the ClickHouse sink to the run command.
type clickhouseExtension struct {
	flags *clickhouseFlags
}

func newClickHouseExtension() extension { return &clickhouseExtension{} }

func (e *clickhouseExtension) register(_ *kingpin.Application, run *kingpin.CmdClause) {
	e.flags = addClickHouseFlags(run, false)
}

// setup starts the sink: it connects in the background (an unreachable
// ClickHouse does not stop the exporter; rows queue until it is back) and
// serves as the scheduler's resume source. The inventory's tables go
// through the same connection.
func (e *clickhouseExtension) setup(ctx context.Context, h *host) (parts, error) {
	if e.flags == nil || !e.flags.enabled() {
		return parts{}, nil
	}
	sink, err := e.flags.newSink(h, h.registerer)
	if err != nil {
		return parts{}, err
	}
	if err := sink.Preflight(ctx); err != nil {
		return parts{}, err
	}
	tables, err := inventorysink.New(inventorysink.Config{Schemas: sink, Logger: h.log.With("component", "clickhouse-inventory"), Registerer: h.registerer})
	if err != nil {
		return parts{}, err
	}
	sink.Start()
	tables.Start()
	h.log.Info("ClickHouse sink enabled", "dsn", clickhouse.RedactDSN(e.flags.dsn),
		"max_backfill", e.flags.maxBackfill.String(), "retention", e.flags.retention.String(), "cluster", e.flags.cluster, "insert_quorum", e.flags.insertQuorum)
	return parts{
		publishers: []schedule.NamedPublisher{{Name: "clickhouse", Publisher: sink}},
		resume:     sink,
		inventory:  tables,
		// The inventory's tables first: they write through the sink's
		// connection.
		close: func(ctx context.Context) error { return errors.Join(tables.Close(ctx), sink.Close(ctx)) },
	}, nil
}

func (e *clickhouseExtension) command(context.Context, string, *host) (bool, error) {
	return false, nil
}

// checks are "ClickHouse" (the server, read-only) and "ClickHouse tables":
// the table of every dataset polled, as exported, and the inventory's,
// as the sink would find them at start.
func (e *clickhouseExtension) checks(h *host, st *checkState) ([]preflight.Check, error) {
	if e.flags == nil || !e.flags.enabled() {
		return nil, nil
	}
	sink, err := e.flags.newSink(h, nil)
	if err != nil {
		return nil, err
	}
	st.closers = append(st.closers, func() { _ = sink.Close(context.Background()) })
	var db *clickhouse.DB
	keep := func(d *clickhouse.DB) {
		db = d
		st.closers = append(st.closers, func() { _ = d.Close() })
	}
	inspect := func(ctx context.Context) ([]*clickhouse.TableReport, error) {
		extra := []*clickhouse.Table{inventorytables.EnvironmentsTable()}
		if st.certificates {
			extra = append(extra, inventorytables.CertificatesTable())
		}
		return sink.Inspect(ctx, db, st.datasets, extra...)
	}
	return []preflight.Check{
		preflight.ClickHouse(e.flags.dsn, sink.OpenReadOnly, keep),
		preflight.ClickHouseTables("ClickHouse tables", inspect, checkDatasets),
	}, nil
}
