package clickhouse

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Table describes a table a sink writes, the same for a single server and
// a cluster. On a single server Schema creates it as described. On a
// cluster it becomes <Name>_local on every node, with the Replicated
// variant of Engine (ZooKeeper path /clickhouse/tables/{shard}/<database>/<Name>_local,
// replica {replica}: the servers' macros), and a Distributed table <Name>
// over it on every node, sharded by ShardingKey, that readers and writers
// use.
type Table struct {
	// Name is the table readers and writers use.
	Name string
	// Columns are the columns, in creation order. Schema adds the ones an
	// existing table lacks and never drops or retypes one.
	Columns []Column
	// Engine is a MergeTree-family engine, e.g. "ReplacingMergeTree".
	Engine string
	// EngineArgs are its parameters, e.g. "`version`".
	EngineArgs []string
	// PartitionBy is the partitioning expression ("" for none).
	PartitionBy string
	// OrderBy is the sorting key, one expression per element.
	OrderBy []string
	// ShardingKey is the Distributed table's sharding expression; on a
	// cluster every copy of a row must map to the same shard so that FINAL
	// through the Distributed table collapses them.
	ShardingKey string
	// Retention, when positive, removes rows whose RetentionTime is older:
	// a TTL on servers that have one (19.6+); on older servers
	// Schema.Expire drops whole partitions once every row of one is older.
	Retention time.Duration
	// RetentionTime is the DateTime expression Retention is measured on,
	// e.g. "`time`".
	RetentionTime string
	// TTLOnlyDropParts, for a table whose partitions match its retention
	// (a day of access_logs under a retention of whole days), sets
	// ttl_only_drop_parts = 1 on servers that have it: expired data goes
	// by whole parts, never by rewriting a part without its expired rows.
	TTLOnlyDropParts bool
	// View, when set, is the materialized view that fills the table from
	// another table's INSERTs (see View).
	View *View
	// WritesOwnTypes marks a table whose writers insert values of its
	// Columns' types, whatever types an existing table has: Ensure refuses
	// (a SchemaError), and Inspect reports as the table's Problem, a column
	// of another type that cannot take them (ColumnTypesProblem).
	WritesOwnTypes bool
}

// setting is a MergeTree table setting.
type setting struct{ name, value string }

// settings returns the table settings t gets on servers of version v:
// a deduplication window for tables that are not Replicated (so that a
// retried INSERT with the same insert_deduplication_token is dropped; a
// Replicated table has one by default), and ttl_only_drop_parts.
func (t *Table) settings(cluster string, v Version) []setting {
	var out []setting
	if cluster == "" && v.HasDeduplicationToken() {
		out = append(out, setting{"non_replicated_deduplication_window", strconv.Itoa(DeduplicationWindow)})
	}
	if t.TTLOnlyDropParts && t.ttl(v) != "" && v.HasTTLOnlyDropParts() {
		out = append(out, setting{"ttl_only_drop_parts", "1"})
	}
	return out
}

// DeduplicationWindow is how many recent INSERTs a table that is not
// Replicated remembers to drop a retry of (non_replicated_deduplication_window;
// Replicated tables remember 1000 by default from 23.x on).
const DeduplicationWindow = 1000

// Column is one column of a Table.
type Column struct {
	Name string
	// Type is the column's type, with any codec: "UInt64 CODEC(T64, ZSTD(1))".
	Type string
	// SortingKey marks a column that, when added to an existing table,
	// joins the end of its sorting key (rows that differ only in it must
	// stay apart).
	SortingKey bool
}

// LocalName returns the name of the table that stores the rows: Name on a
// single server, <Name>_local on a cluster.
func (t *Table) LocalName(cluster string) string {
	if cluster == "" {
		return t.Name
	}
	return t.Name + "_local"
}

// CreateStatements returns the statements that create t in database on a
// fresh server (cluster "") or cluster of servers of version v, in order,
// each idempotent (IF NOT EXISTS): the database, the table, on a cluster
// the Distributed table, and t's View, all ON CLUSTER. It is what Schema
// runs when no node has the table yet.
func CreateStatements(database, cluster string, v Version, t *Table) []string {
	on := onCluster(cluster)
	stmts := []string{"CREATE DATABASE IF NOT EXISTS " + QuoteIdent(database) + on}
	stmts = append(stmts, createLocal(database, cluster, v, t, t.Columns, on))
	if cluster != "" {
		stmts = append(stmts, createDistributed(database, cluster, t, on))
	}
	if t.View != nil {
		stmts = append(stmts, createView(database, cluster, t, on))
	}
	return stmts
}

func onCluster(cluster string) string {
	if cluster == "" {
		return ""
	}
	return " ON CLUSTER " + QuoteIdent(cluster)
}

// createLocal renders CREATE TABLE of the table holding the rows, with
// columns cols; on is " ON CLUSTER c" or "".
func createLocal(database, cluster string, v Version, t *Table, cols []Column, on string) string {
	local := t.LocalName(cluster)
	var b strings.Builder
	fmt.Fprintf(&b, "CREATE TABLE IF NOT EXISTS %s.%s%s\n(\n", QuoteIdent(database), QuoteIdent(local), on)
	for i, c := range cols {
		fmt.Fprintf(&b, "    %s %s", QuoteIdent(c.Name), c.Type)
		if i < len(cols)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString(")\n")
	args := t.EngineArgs
	engine := t.Engine
	if cluster != "" {
		engine = "Replicated" + engine
		path := "/clickhouse/tables/{shard}/" + database + "/" + local
		args = append([]string{QuoteString(path), "'{replica}'"}, args...)
	}
	fmt.Fprintf(&b, "ENGINE = %s(%s)\n", engine, strings.Join(args, ", "))
	if t.PartitionBy != "" {
		fmt.Fprintf(&b, "PARTITION BY %s\n", t.PartitionBy)
	}
	fmt.Fprintf(&b, "ORDER BY (%s)", strings.Join(t.OrderBy, ", "))
	if ttl := t.ttl(v); ttl != "" {
		b.WriteString("\nTTL " + ttl)
	}
	if settings := t.settings(cluster, v); len(settings) > 0 {
		parts := make([]string, len(settings))
		for i, s := range settings {
			parts[i] = s.name + " = " + s.value
		}
		b.WriteString("\nSETTINGS " + strings.Join(parts, ", "))
	}
	return b.String()
}

// createDistributed renders CREATE TABLE of the Distributed table, with the
// local table's columns.
func createDistributed(database, cluster string, t *Table, on string) string {
	local := t.LocalName(cluster)
	return fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s.%s%s AS %s.%s\nENGINE = Distributed(%s, %s, %s, %s)",
		QuoteIdent(database), QuoteIdent(t.Name), on, QuoteIdent(database), QuoteIdent(local),
		QuoteString(cluster), QuoteString(database), QuoteString(local), t.ShardingKey)
}

// ttl returns the TTL expression for t's retention, or "" when there is
// none or the server has no TTL.
func (t *Table) ttl(v Version) string {
	if t.Retention <= 0 || t.RetentionTime == "" || !v.HasTTL() {
		return ""
	}
	return fmt.Sprintf("%s + INTERVAL %d SECOND", t.RetentionTime, int64(t.Retention/time.Second))
}

// addColumns renders one ALTER TABLE that adds cols to table; with
// sortingKey (the table's current one, from system.tables) the columns
// marked SortingKey join its end.
func addColumns(table string, cols []Column, sortingKey string) string {
	parts := make([]string, 0, len(cols)+1)
	var keys []string
	for _, c := range cols {
		parts = append(parts, "ADD COLUMN "+QuoteIdent(c.Name)+" "+c.Type)
		if c.SortingKey && sortingKey != "" {
			keys = append(keys, QuoteIdent(c.Name))
		}
	}
	if len(keys) > 0 {
		parts = append(parts, "MODIFY ORDER BY ("+sortingKey+", "+strings.Join(keys, ", ")+")")
	}
	return "ALTER TABLE " + table + "\n    " + strings.Join(parts, ",\n    ")
}
