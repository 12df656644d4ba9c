package metrictables

import (
	"fmt"
	"strings"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
)

// Well-known columns of every metrics table besides the dataset's dimensions
// and metrics.
const (
	ColumnTime        = "time"
	ColumnGranularity = "granularity"
	ColumnEnvironment = "environment_id"
	// ColumnVersion orders the writes of one key: ReplacingMergeTree keeps
	// the row with the largest version. edgepipe writes the fetch time in
	// nanoseconds, made strictly increasing within a process.
	ColumnVersion = "version"
)

// SchemaOptions say how metrics tables are created. The zero value (apart
// from Version) is a plain single-server table without TTL.
type SchemaOptions struct {
	// Version is the server's version; newer features (LowCardinality, TTL,
	// codecs) are used only where it has them.
	Version clickhouse.Version
	// Database is the database the tables live in.
	Database string
	// Retention, when positive and the server supports TTL, drops rows whose
	// bucket is older than this.
	Retention time.Duration
	// Cluster, when set, creates every table ON CLUSTER with a Replicated
	// engine under the name <dataset>_local, and a Distributed table named as
	// the dataset for reads and writes.
	Cluster string
}

// ColumnKind tells how a Go value is converted for a column.
type ColumnKind int

// The column kinds of a metrics table.
const (
	KindString   ColumnKind = iota // String or LowCardinality(String)
	KindInt                        // Int64 (NUMBER dimensions)
	KindDateTime                   // DateTime('UTC') (DATE dimensions, time)
	KindUInt64                     // counts, version
	KindFloat64                    // gauges, rates, percentiles
)

// Column is one column of a metrics table.
type Column struct {
	Name string
	Kind ColumnKind
	// Key marks the columns of the sorting key (which identifies a row).
	Key bool
}

// Type returns the column's ClickHouse type, with a codec where the server
// supports one. It is the same on every version apart from LowCardinality
// and codecs, which do not change what readers see.
func (c Column) Type(v clickhouse.Version) string {
	var t, codec string
	switch c.Kind {
	case KindString:
		t = "String"
		if v.HasLowCardinality() {
			t = "LowCardinality(String)"
		}
	case KindInt:
		t = "Int64"
	case KindDateTime:
		t = "DateTime('UTC')"
		codec = "CODEC(DoubleDelta, ZSTD(1))"
	case KindUInt64:
		t = "UInt64"
		codec = "CODEC(T64, ZSTD(1))"
	case KindFloat64:
		t = "Float64"
		codec = "CODEC(Gorilla, ZSTD(1))"
	}
	if codec != "" && v.HasCodecs() && !c.Key {
		return t + " " + codec
	}
	return t
}

// MetricsColumns returns the columns of dataset ds's table for the given
// label dimensions and metrics (nil: all of the descriptor's), in table
// order: time, granularity, environment_id, the labels, the metrics, version.
func MetricsColumns(ds *metricsapi.Dataset, labels, metrics []string) []Column {
	if labels == nil {
		for _, d := range ds.Labels() {
			labels = append(labels, d.Name)
		}
	}
	if metrics == nil {
		metrics = ds.MetricNames()
	}
	cols := make([]Column, 0, 4+len(labels)+len(metrics))
	cols = append(cols,
		Column{Name: ColumnTime, Kind: KindDateTime, Key: true},
		Column{Name: ColumnGranularity, Kind: KindString, Key: true},
		Column{Name: ColumnEnvironment, Kind: KindString, Key: true},
	)
	for _, l := range labels {
		cols = append(cols, Column{Name: l, Kind: dimensionKind(ds, l), Key: true})
	}
	for _, m := range metrics {
		cols = append(cols, Column{Name: m, Kind: MetricKind(m)})
	}
	return append(cols, Column{Name: ColumnVersion, Kind: KindUInt64})
}

// MetricKind returns the column kind of a metric: UInt64 for counts,
// Float64 for everything else.
func MetricKind(name string) ColumnKind {
	if metricsapi.Classify(name).Kind == metricsapi.KindCount {
		return KindUInt64
	}
	return KindFloat64
}

func dimensionKind(ds *metricsapi.Dataset, name string) ColumnKind {
	for _, d := range ds.Dimensions {
		if d.Name != name {
			continue
		}
		switch d.Type {
		case metricsapi.TypeNumber:
			return KindInt
		case metricsapi.TypeDate:
			return KindDateTime
		}
		return KindString
	}
	return KindString
}

// sortingKey returns the ORDER BY columns: granularity, environment_id, the
// labels, time.
func sortingKey(cols []Column) []string {
	key := []string{ColumnGranularity, ColumnEnvironment}
	for _, c := range cols {
		if c.Key && c.Name != ColumnTime && c.Name != ColumnGranularity && c.Name != ColumnEnvironment {
			key = append(key, c.Name)
		}
	}
	return append(key, ColumnTime)
}

// TableName returns the table that stores dataset ds as exported. A dataset
// exported with every dimension (the descriptor as the platform sends it) is
// stored in the table named as the dataset. One exported with fewer
// dimensions (a selection of the exporter's config file, see
// metricsapi.Dataset.Select) has rows of another aggregation level and gets
// a table of its own: the dataset's name, "__by_", then the dimensions kept
// besides time and environment_id joined by "__", or "environment_id" when
// it keeps none of those (edge_usage_by_country__by_environment_id,
// origin_errors__by_origin_name__http_status_code). Metrics left out of a
// selection do not change the name: they are columns the rows do not fill.
func TableName(ds *metricsapi.Dataset) string {
	if len(ds.Aggregated) == 0 {
		return ds.Name
	}
	kept := ds.LabelNames()
	if len(kept) == 0 {
		kept = []string{metricsapi.DimensionEnvironment}
	}
	return ds.Name + "__by_" + strings.Join(kept, "__")
}

// LocalTable returns the name of the table that stores the rows: the dataset
// itself, or <dataset>_local on a cluster (where the dataset's name is the
// Distributed table).
func (o SchemaOptions) LocalTable(dataset string) string {
	if o.Cluster != "" {
		return dataset + "_local"
	}
	return dataset
}

func (o SchemaOptions) onCluster() string {
	if o.Cluster == "" {
		return ""
	}
	return " ON CLUSTER " + clickhouse.QuoteIdent(o.Cluster)
}

func (o SchemaOptions) qualified(table string) string {
	return clickhouse.QuoteIdent(o.Database) + "." + clickhouse.QuoteIdent(table)
}

// CreateTableDDL returns the statements that create dataset's table with
// cols (from MetricsColumns), in order, each idempotent (IF NOT EXISTS).
// Readers query `SELECT … FROM <database>.<dataset> FINAL` on every version
// and topology.
func CreateTableDDL(dataset string, cols []Column, o SchemaOptions) []string {
	local := o.LocalTable(dataset)
	var b strings.Builder
	b.WriteString("CREATE TABLE IF NOT EXISTS ")
	b.WriteString(o.qualified(local))
	b.WriteString(o.onCluster())
	b.WriteString("\n(\n")
	for i, c := range cols {
		b.WriteString("    ")
		b.WriteString(clickhouse.QuoteIdent(c.Name))
		b.WriteByte(' ')
		b.WriteString(c.Type(o.Version))
		if i < len(cols)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString(")\n")
	if o.Cluster != "" {
		fmt.Fprintf(&b, "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/%s/%s', '{replica}', %s)\n",
			escapeLiteral(o.Database), escapeLiteral(local), clickhouse.QuoteIdent(ColumnVersion))
	} else {
		fmt.Fprintf(&b, "ENGINE = ReplacingMergeTree(%s)\n", clickhouse.QuoteIdent(ColumnVersion))
	}
	fmt.Fprintf(&b, "PARTITION BY toYYYYMM(%s)\n", clickhouse.QuoteIdent(ColumnTime))
	key := sortingKey(cols)
	for i, k := range key {
		key[i] = clickhouse.QuoteIdent(k)
	}
	fmt.Fprintf(&b, "ORDER BY (%s)", strings.Join(key, ", "))
	if ttl := o.ttl(); ttl != "" {
		b.WriteString("\n" + ttl)
	}
	stmts := []string{b.String()}
	if o.Cluster != "" {
		stmts = append(stmts, fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s%s AS %s\nENGINE = Distributed(%s, %s, %s, cityHash64(%s))",
			o.qualified(dataset), o.onCluster(), o.qualified(local),
			clickhouse.QuoteString(o.Cluster), clickhouse.QuoteString(o.Database), clickhouse.QuoteString(local), clickhouse.QuoteIdent(ColumnEnvironment)))
	}
	return stmts
}

// ttl returns the TTL clause for the retention, or "" when there is none or
// the server has no TTL.
func (o SchemaOptions) ttl() string {
	if o.Retention <= 0 || !o.Version.HasTTL() {
		return ""
	}
	return fmt.Sprintf("TTL %s + INTERVAL %d SECOND", clickhouse.QuoteIdent(ColumnTime), int64(o.Retention/time.Second))
}

// RetentionDDL returns the statement that sets (or, with no retention,
// removes nothing: "" ) the TTL of an existing table, or "" when the server
// has no TTL.
func RetentionDDL(dataset string, o SchemaOptions) string {
	ttl := o.ttl()
	if ttl == "" {
		return ""
	}
	return "ALTER TABLE " + o.qualified(o.LocalTable(dataset)) + o.onCluster() + " MODIFY " + ttl
}

// AddColumnsDDL returns the statements that add the columns missing from an
// existing table: metrics become plain new columns; a new dimension is also
// appended to the sorting key (after time), so rows that differ only in it
// stay apart. On a cluster the Distributed table gets the columns too.
// Nothing is ever dropped.
func AddColumnsDDL(dataset string, missing []Column, existingKey []string, o SchemaOptions) []string {
	if len(missing) == 0 {
		return nil
	}
	var adds []string
	newKey := append([]string(nil), existingKey...)
	keyChanged := false
	for _, c := range missing {
		adds = append(adds, "ADD COLUMN "+clickhouse.QuoteIdent(c.Name)+" "+c.Type(o.Version))
		if c.Key {
			newKey = append(newKey, c.Name)
			keyChanged = true
		}
	}
	local := adds
	if keyChanged {
		q := make([]string, len(newKey))
		for i, k := range newKey {
			q[i] = clickhouse.QuoteIdent(k)
		}
		local = append(append([]string(nil), adds...), "MODIFY ORDER BY ("+strings.Join(q, ", ")+")")
	}
	stmts := []string{"ALTER TABLE " + o.qualified(o.LocalTable(dataset)) + o.onCluster() + "\n    " + strings.Join(local, ",\n    ")}
	if o.Cluster != "" {
		stmts = append(stmts, "ALTER TABLE "+o.qualified(dataset)+o.onCluster()+"\n    "+strings.Join(adds, ",\n    "))
	}
	return stmts
}

func escapeLiteral(s string) string {
	q := clickhouse.QuoteString(s)
	return q[1 : len(q)-1]
}
