package logtable

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
)

// The per-minute rollup of access_logs: RollupTable is an
// AggregatingMergeTree that RollupView fills from every INSERT into
// access_logs, so the Access logs dashboard's aggregate panels read a few
// rows per minute instead of every record.
const (
	RollupTable = "access_logs_1m"
	RollupView  = "access_logs_1m_mv"
)

// rollupDimensions are the rollup's keys besides minute: bounded sets
// (an environment's status codes, cache statuses and POPs), so a minute
// has at most a few hundred rows per environment whatever the traffic.
// Hosts, paths and countries stay in access_logs only.
var rollupDimensions = []string{"environment_id", "minute", "status_code", "cache_status", "pop"}

// rollupSource is a column of access_logs the rollup reads: which base
// types it can take and how its value is written into the rollup.
type rollupSource struct {
	column string
	// accepts reports whether a column of type t can be read.
	accepts func(t columnType) bool
	// expr returns the expression reading a column of type t.
	expr func(t columnType) string
}

func isString(t columnType) bool { return t.base == "String" }
func isNumber(t columnType) bool { return t.isInteger() || t.isFloat() }
func asIs(column string) func(columnType) string {
	return func(columnType) string { return column }
}

// cast returns expr of a column that is converted with fn unless it has
// the type base already.
func cast(column, fn, base string) func(columnType) string {
	return func(t columnType) string {
		if t.base == base {
			return column
		}
		return fn + "(" + column + ")"
	}
}

// rollupSources are the columns the rollup reads, in its column order:
// the dimensions, then the measures' arguments.
var rollupSources = []rollupSource{
	{"timestamp", columnType.isTime, func(columnType) string { return "toStartOfMinute(toDateTime(`timestamp`))" }},
	{"status_code", isNumber, cast("status_code", "toInt64", "Int64")},
	{"cache_status", isString, asIs("cache_status")},
	{"pop", isString, asIs("pop")},
	{"bytes_out", isNumber, cast("bytes_out", "toInt64", "Int64")},
	{"total_time", isNumber, cast("total_time", "toFloat64", "Float64")},
}

// RollupSourceError says why access_logs cannot feed the rollup: columns
// it lacks (fields left out of --fields) or has in a type the rollup
// cannot aggregate (Nullable, or a number kept as String).
type RollupSourceError struct {
	Problems []string
}

// Error implements error.
func (e *RollupSourceError) Error() string {
	return "access_logs cannot feed the per-minute rollup " + RollupTable + ": " + strings.Join(e.Problems, "; ")
}

var codecSuffix = regexp.MustCompile(`\s+CODEC\(.*\)$`)

// RollupSpec returns access_logs_1m, the per-minute rollup of the table
// accessLogs (as TableSpec returns it, for the table as found), for servers
// of version v:
//
//	environment_id, minute, status_code, cache_status, pop   (the key)
//	requests_state    AggregateFunction(count)
//	bytes_out_state   AggregateFunction(sum, Int64)
//	total_time_state  AggregateFunction(quantileTDigest, Float64)
//
// an AggregatingMergeTree partitioned by day, with the retention of
// access_logs as a TTL on minute (whole days dropped on servers without
// TTL), and the view access_logs_1m_mv that adds every block inserted into
// access_logs to it. Read it with countMerge(requests_state),
// sumMerge(bytes_out_state) and
// quantileTDigestMerge(0.95)(total_time_state), grouped by any of the keys
// (the states are named apart from the aliases a query gives the merged
// values: an alias equal to a column's name would shadow the column). It returns a *RollupSourceError when access_logs
// lacks a column the rollup reads or has one it cannot aggregate.
func RollupSpec(v clickhouse.Version, accessLogs *clickhouse.Table, retention time.Duration) (*clickhouse.Table, error) {
	exprs, err := rollupExprs(accessLogs)
	if err != nil {
		return nil, err
	}
	str := "String"
	if Modern(v) {
		str = "LowCardinality(String)"
	}
	t := &clickhouse.Table{
		Name: RollupTable,
		Columns: []clickhouse.Column{
			{Name: "environment_id", Type: str},
			{Name: "minute", Type: "DateTime"},
			{Name: "status_code", Type: "Int64"},
			{Name: "cache_status", Type: str},
			{Name: "pop", Type: str},
			{Name: "requests_state", Type: "AggregateFunction(count)"},
			{Name: "bytes_out_state", Type: "AggregateFunction(sum, Int64)"},
			{Name: "total_time_state", Type: "AggregateFunction(quantileTDigest, Float64)"},
		},
		Engine:        "AggregatingMergeTree",
		PartitionBy:   "toDate(`minute`)",
		OrderBy:       rollupDimensions,
		ShardingKey:   "cityHash64(environment_id, minute)",
		Retention:     retention,
		RetentionTime: "`minute`",
		// Daily partitions under a retention in seconds, as access_logs.
		TTLOnlyDropParts: true,
		View:             &clickhouse.View{Name: RollupView, Source: Table, Query: rollupQuery(exprs)},
	}
	return t, nil
}

// rollupExprs returns the expressions reading each of rollupSources from
// accessLogs' columns.
func rollupExprs(accessLogs *clickhouse.Table) ([]string, error) {
	types := map[string]string{}
	for _, c := range accessLogs.Columns {
		types[c.Name] = codecSuffix.ReplaceAllString(c.Type, "")
	}
	var exprs, problems []string
	for _, src := range rollupSources {
		raw, ok := types[src.column]
		if !ok {
			problems = append(problems, "no column "+src.column+" (a field left out of --fields)")
			continue
		}
		t, ok := parseColumnType(raw)
		if !ok || t.nullable || !src.accepts(t) {
			problems = append(problems, fmt.Sprintf("column %s is %s", src.column, raw))
			continue
		}
		exprs = append(exprs, src.expr(t))
	}
	if len(problems) > 0 {
		return nil, &RollupSourceError{Problems: problems}
	}
	return exprs, nil
}

// rollupQuery returns the view's query over access_logs, given the
// expressions of rollupExprs.
func rollupQuery(exprs []string) func(source string) string {
	named := func(expr, name string) string {
		if expr == name {
			return name
		}
		return expr + " AS " + name
	}
	return func(source string) string {
		return fmt.Sprintf(`SELECT
    environment_id,
    %s,
    %s,
    %s,
    %s,
    countState() AS requests_state,
    sumState(%s) AS bytes_out_state,
    quantileTDigestState(%s) AS total_time_state
FROM %s
GROUP BY %s`, named(exprs[0], "minute"), named(exprs[1], "status_code"), named(exprs[2], "cache_status"), named(exprs[3], "pop"),
			exprs[4], exprs[5], source, strings.Join(rollupDimensions, ", "))
	}
}

// ensureRollup makes the per-minute rollup and its view once per
// connection (a reset, after the table changed, makes them again: a view
// left on a renamed access_logs is replaced), through the schema manager,
// on every node of a cluster. A failure is logged and tried again after
// clickhouse.RecheckInterval, never failing a delivery: records delivered
// meanwhile are in access_logs, not in the rollup (docs/clickhouse.md: rebuilding the
// rollup). An access_logs that cannot feed it (fields left out of --fields)
// gets no rollup, which is logged once per connection. Called with a.mu
// held, after ensureTable.
func (a *Sink) ensureRollup(ctx context.Context) {
	if a.rollupEnsured == a.schema || time.Since(a.rollupFailed) < clickhouse.RecheckInterval {
		return
	}
	spec, err := RollupSpec(a.db.Version(), a.spec, a.cfg.Retention)
	if err != nil {
		a.rollupEnsured, a.rollup = a.schema, nil
		a.log.Warn("clickhouse: no per-minute rollup: the Access logs dashboard's aggregate panels read it and stay empty", "table", a.db.Table(RollupTable), "err", err)
		return
	}
	if _, err := a.schema.Ensure(ctx, spec); err != nil {
		a.rollupFailed = time.Now()
		a.log.Warn("clickhouse: could not create the per-minute rollup of access_logs; trying again (records delivered meanwhile are not counted in it)",
			"table", a.db.Table(RollupTable), "err", err)
		return
	}
	a.rollupEnsured, a.rollupFailed, a.rollup = a.schema, time.Time{}, spec
}
