package metrictables

import (
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

// TableSpec returns the table of dataset with columns cols (from
// MetricsColumns) for servers of version v, with the retention as TTL (or
// partition drops on servers without TTL; see clickhouse.Table). On a
// cluster the Distributed table shards by environment, so that all of an
// environment's buckets, and every version of each, are on one shard.
// Readers query `SELECT … FROM <database>.<dataset> FINAL` on every version
// and topology.
func TableSpec(dataset string, cols []Column, v clickhouse.Version, retention time.Duration) *clickhouse.Table {
	tc := make([]clickhouse.Column, len(cols))
	for i, c := range cols {
		tc[i] = clickhouse.Column{Name: c.Name, Type: c.Type(v), SortingKey: c.Key}
	}
	key := sortingKey(cols)
	for i, k := range key {
		key[i] = clickhouse.QuoteIdent(k)
	}
	return &clickhouse.Table{
		Name:           dataset,
		Columns:        tc,
		Engine:         "ReplacingMergeTree",
		EngineArgs:     []string{clickhouse.QuoteIdent(ColumnVersion)},
		PartitionBy:    "toYYYYMM(" + clickhouse.QuoteIdent(ColumnTime) + ")",
		OrderBy:        key,
		ShardingKey:    "cityHash64(" + clickhouse.QuoteIdent(ColumnEnvironment) + ")",
		Retention:      retention,
		RetentionTime:  clickhouse.QuoteIdent(ColumnTime),
		WritesOwnTypes: true,
	}
}
