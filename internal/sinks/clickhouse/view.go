package clickhouse

import (
	"context"
	"fmt"
	"slices"
)

// View is the materialized view that fills a Table (Table.View) from the
// rows inserted into another table, its Source: every block INSERTed into
// Source passes through Query, and what Query makes of it is inserted into
// the table. On a cluster there is one view on every node, from Source's
// local table into the table's local table (a view sees only the INSERTs
// of its own node, and replication copies parts without passing them
// through views: each row is counted on the node it was inserted on, and
// the table's own replication carries the result to the other replicas).
//
// Schema creates a missing view once its Source exists on the node, and
// re-creates a view its Source no longer feeds (on Atomic databases a view
// follows its source by UUID, so a source renamed away and made anew
// would leave the view on the renamed table). It never changes the query
// of a view that works: a changed Query needs a view of another name.
type View struct {
	// Name is the view's name, the same on every node.
	Name string
	// Source is the table whose INSERTs the view reads, by the name
	// writers use (the view reads <Source>_local on a cluster).
	Source string
	// Query returns the view's SELECT reading from source, the quoted,
	// database-qualified name of the table the view reads. Its result
	// columns are the table's, by name.
	Query func(source string) string
}

// sourceName returns the table the view reads on each node: Source, or
// <Source>_local on a cluster.
func (v *View) sourceName(cluster string) string {
	if cluster == "" {
		return v.Source
	}
	return v.Source + "_local"
}

// createView renders CREATE MATERIALIZED VIEW of t's view; on is
// " ON CLUSTER c" or "".
func createView(database, cluster string, t *Table, on string) string {
	v := t.View
	return fmt.Sprintf("CREATE MATERIALIZED VIEW IF NOT EXISTS %s.%s%s TO %s.%s\nAS %s",
		QuoteIdent(database), QuoteIdent(v.Name), on, QuoteIdent(database), QuoteIdent(t.LocalName(cluster)),
		v.Query(QuoteIdent(database)+"."+QuoteIdent(v.sourceName(cluster))))
}

// viewNames returns the names read() looks up for t's view: the view and
// its source on each node (none without a view).
func viewNames(cluster string, t *Table) []string {
	if t.View == nil {
		return nil
	}
	return []string{t.View.Name, t.View.sourceName(cluster)}
}

// readView fills st's view state from the tables found on its node.
func readView(cluster string, t *Table, tables map[string]*tableInfo, st *nodeState) {
	if t.View == nil {
		return
	}
	st.view = tables[t.View.Name]
	if src := tables[t.View.sourceName(cluster)]; src != nil {
		st.hasSource = true
		st.viewFed = st.view != nil && slices.Contains(src.dependents, t.View.Name)
	}
}

// viewIncomplete reports whether t's view is missing on node n, or there
// but not fed by its source.
func viewIncomplete(t *Table, n *nodeState) bool {
	return t.View != nil && !n.viewFed
}

// createViewOn creates t's view on node n, which has t's local table,
// replacing a view there that its source does not feed. It reports
// whether it changed anything, and what must wait.
func (s *Schema) createViewOn(ctx context.Context, t *Table, n *nodeState) (bool, string, error) {
	if t.View == nil || n.viewFed {
		return false, "", nil
	}
	view := s.db.Table(t.View.Name)
	if !n.hasSource {
		return false, fmt.Sprintf("view %s on %s waits for its source table %s", view, n.addr, s.db.Table(t.View.sourceName(s.db.cluster))), nil
	}
	if n.view != nil {
		// The source does not list it: it reads a table that is gone or
		// was renamed (Atomic databases follow a table by UUID).
		if err := n.db.Exec(ctx, "DROP TABLE IF EXISTS "+view); err != nil {
			return false, "", fmt.Errorf("replace view %s on %s: %w", view, n.addr, err)
		}
		s.log.Warn("dropped a ClickHouse materialized view its source table no longer feeds (the source was renamed or re-created); creating it again: rows inserted meanwhile are not in its table",
			"view", view, "source", s.db.Table(t.View.sourceName(s.db.cluster)), "node", n.addr)
	}
	if err := n.db.Exec(ctx, createView(s.db.database, s.db.cluster, t, "")); err != nil {
		if SchemaCode(ErrorCode(err)) {
			return false, fmt.Sprintf("view %s on %s: %v", view, n.addr, err), nil
		}
		return false, "", fmt.Errorf("create view %s on %s: %w", view, n.addr, err)
	}
	s.log.Info("created ClickHouse materialized view", "view", view, "source", s.db.Table(t.View.sourceName(s.db.cluster)),
		"table", s.db.Table(t.LocalName(s.db.cluster)), "node", n.addr)
	return true, "", nil
}
