package clickhouse

import (
	"context"
	"fmt"
)

// DatabaseExists reports whether the DSN's database exists on db's server.
func (db *DB) DatabaseExists(ctx context.Context) (bool, error) {
	var n uint64
	if err := db.conn.QueryRow(ctx, "SELECT count() FROM system.databases WHERE name = "+QuoteString(db.database)).Scan(&n); err != nil {
		return false, fmt.Errorf("read the databases of ClickHouse at %s: %w", db.addr, err)
	}
	return n > 0, nil
}

// TableReport is what Schema.Inspect found of a table: what Ensure would
// create or add, and what keeps writers from using the table.
type TableReport struct {
	// Table is the table writers insert into (on a cluster the Distributed
	// table), qualified with the database.
	Table string
	// Exists reports whether that table exists on the DSN's server, and
	// Columns maps its columns to their types.
	Exists  bool
	Columns map[string]string
	// Missing lists the columns of the spec the existing table lacks:
	// Ensure adds them when the program starts.
	Missing []string
	// Nodes counts the servers read (the cluster's nodes, or 1), and
	// Incomplete those where the table is missing or lacks columns.
	Nodes, Incomplete int
	// Unreachable says which nodes could not be read, and why.
	Unreachable []string
	// Problem, when set, is why writers cannot use the table as it is
	// (Ensure fails, or a column cannot hold what is written): the
	// operator must change the table.
	Problem error
}

// Inspect reads t on the server, or on every node of the cluster, as
// Ensure does before it changes anything, and reports what it found. It
// creates and alters nothing: open db with ReadOnly to leave the database
// alone too. An error means the DSN's server or the cluster's topology
// could not be read.
func (s *Schema) Inspect(ctx context.Context, t *Table) (*TableReport, error) {
	if s.db.cluster != "" && t.ShardingKey == "" {
		return nil, fmt.Errorf("ClickHouse table %s: no sharding key for the Distributed table", t.Name)
	}
	nodes, err := s.topology(ctx)
	if err != nil {
		return nil, err
	}
	states := s.survey(ctx, nodes, t)
	st, unreachable := s.stateOf(t, states, nil)
	r := &TableReport{Table: s.db.Table(t.Name), Nodes: len(states), Incomplete: st.IncompleteNodes, Unreachable: unreachable,
		Problem: s.checkDistributed(t, states)}
	entry, err := s.conn(ctx, node{})
	if err != nil {
		return nil, err
	}
	if r.Columns, err = tableColumns(ctx, entry, t.Name); err != nil {
		return nil, err
	}
	r.Exists = len(r.Columns) > 0
	if r.Exists {
		r.Missing = MissingColumns(t, r.Columns)
	}
	if r.Exists && r.Problem == nil && t.WritesOwnTypes {
		r.Problem = ColumnTypesProblem(t, r.Columns)
	}
	return r, nil
}

// MissingColumns returns the names of t's columns that columns (a table's
// columns and their types) lacks, in t's order.
func MissingColumns(t *Table, columns map[string]string) []string {
	var out []string
	for _, c := range t.Columns {
		if _, ok := columns[c.Name]; !ok {
			out = append(out, c.Name)
		}
	}
	return out
}
