package clickhouse

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Schema keeps the tables both programs write in shape, on a single server
// or on every node of a cluster (Open WithCluster). Ensure creates what is
// missing (a table's materialized View too, on every node) and adds
// missing columns; writers call it before their first INSERT into a table,
// again after any insert error of ClassSchema, and while a table is
// incomplete (a node was down) every RecheckInterval. It never drops or
// retypes a column.
//
// On a cluster Ensure reads every node listed in system.clusters, connected
// to it directly with the DSN's credentials (ClickHouse 18.16 has no
// clusterAllReplicas), and:
//   - when every node is reachable and none has the table yet, creates the
//     database, <table>_local (Replicated engine), the Distributed <table>
//     and the table's View ON CLUSTER;
//   - otherwise creates what a reachable node lacks on that node: the
//     database, the local table (with a live replica's own CREATE statement
//     when its shard has one, so the new replica matches ZooKeeper's
//     columns), the Distributed table, the View (once its source table is
//     there, and again when that source no longer feeds it);
//   - adds missing columns to each shard's local table on one replica (the
//     ALTER of a Replicated table reaches the shard's other replicas through
//     ZooKeeper), then to the Distributed table on every node, each node on
//     its own (18.16 refuses ALTER … ON CLUSTER of a Distributed table whose
//     shards are replicated, code 371). Before 20.3 a replica that missed
//     more than two column changes does not start again ("Table structure
//     in ZooKeeper is too different"), so there an ALTER waits until every
//     replica of the shard is active.
//
// A node out of reach leaves the table incomplete (TableState.Complete) but
// writable: the next Ensure completes it once the node is back. Writers
// call Ensure when they write; StartRecheck also calls it every
// RecheckInterval for each incomplete table whether or not anything is
// written, so a node that comes back gets its tables within two intervals
// even while no row arrives (a table is written only when its data
// changes). Incomplete tells, per table, on how many nodes it is still
// incomplete (the self-metric of NewSchemaCollector).
//
// A Schema is safe for concurrent use; Ensure and Expire run one at a time.
type Schema struct {
	db         *DB
	log        *slog.Logger
	ddlTimeout time.Duration

	// run serializes Ensure and Expire.
	run sync.Mutex

	mu     sync.Mutex
	nodes  map[string]*nodeConn
	ttlSet map[string]bool
	expiry map[string]time.Time
	// status is what the last Ensure of each table (by name) found.
	status map[string]*tableStatus
	// stopRecheck and recheckDone belong to the StartRecheck goroutine.
	stopRecheck context.CancelFunc
	recheckDone chan struct{}
}

// tableStatus is what the last Ensure of a table found.
type tableStatus struct {
	table *Table
	// incomplete counts the nodes where the table is missing, lacks
	// columns or could not be read (0: complete everywhere).
	incomplete int
	// waiting is the reason logged last, so that a recheck that finds the
	// same logs nothing new.
	waiting string
}

// RecheckInterval is how often an incomplete table is ensured again (by
// StartRecheck, and by writers).
const RecheckInterval = 15 * time.Second

// expireInterval is how often Expire looks for expired partitions of a
// table.
const expireInterval = time.Hour

// nodeRetry is how long a node that could not be reached is not dialled
// again.
const nodeRetry = 5 * time.Second

// nodeConn is the connection to one cluster node, or the last failure to
// open one.
type nodeConn struct {
	db  *DB
	err error
	at  time.Time
}

// NewSchema returns the schema manager of db's database, on db's cluster
// when db was opened WithCluster. log receives what it creates and alters
// (default slog.Default()).
func NewSchema(db *DB, log *slog.Logger) *Schema {
	if log == nil {
		log = slog.Default()
	}
	return &Schema{db: db, log: log, ddlTimeout: 30 * time.Second,
		nodes: map[string]*nodeConn{}, ttlSet: map[string]bool{}, expiry: map[string]time.Time{},
		status: map[string]*tableStatus{}}
}

// DB returns the connection given to NewSchema.
func (s *Schema) DB() *DB { return s.db }

// StartRecheck starts a goroutine that, every interval, ensures again each
// table whose last Ensure left it incomplete (a node out of reach, a change
// waiting), until Close stops it. It does nothing when already started.
func (s *Schema) StartRecheck(interval time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopRecheck != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stopRecheck, s.recheckDone = cancel, make(chan struct{})
	go func() {
		defer close(s.recheckDone)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				s.recheck(ctx, interval)
			}
		}
	}()
}

// recheck ensures every incomplete table once, each within timeout.
func (s *Schema) recheck(ctx context.Context, timeout time.Duration) {
	s.mu.Lock()
	var tables []*Table
	for _, st := range s.status {
		if st.incomplete > 0 {
			tables = append(tables, st.table)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(tables, func(a, b *Table) int { return strings.Compare(a.Name, b.Name) })
	for _, t := range tables {
		tctx, cancel := context.WithTimeout(ctx, max(timeout, 30*time.Second))
		_, err := s.Ensure(tctx, t)
		cancel()
		if err != nil && ctx.Err() == nil {
			s.log.Warn("ClickHouse table still incomplete on the cluster; checking again", "table", s.db.Table(t.Name), "err", err)
		}
	}
}

// Incomplete returns, for every table Ensure has seen, the number of nodes
// on which the last Ensure found it missing, lacking columns or out of
// reach (0: complete on every node).
func (s *Schema) Incomplete() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.status))
	for name, st := range s.status {
		out[name] = st.incomplete
	}
	return out
}

// Close stops the StartRecheck goroutine (waiting for it) and closes the
// connections to the cluster's nodes (not the DB given to NewSchema).
func (s *Schema) Close() error {
	s.mu.Lock()
	stop, done := s.stopRecheck, s.recheckDone
	s.stopRecheck = nil
	s.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for addr, n := range s.nodes {
		if n.db != nil {
			errs = append(errs, n.db.Close())
		}
		delete(s.nodes, addr)
	}
	return errors.Join(errs...)
}

// TableState is what Ensure leaves behind.
type TableState struct {
	// Columns maps each column of the table writers insert into (on a
	// cluster the Distributed table on the DSN's server) to its type.
	Columns map[string]string
	// Complete is false while some node was out of reach or some change
	// waits: the table takes INSERTs, but call Ensure again after
	// RecheckInterval.
	Complete bool
	// SortingKey is the sorting key of the table that stores the rows (the
	// local table of the first reachable node), as system.tables shows it.
	SortingKey string
	// IncompleteNodes counts the nodes where the table (local or
	// Distributed) is missing, lacks columns or could not be read; 0 when
	// Complete.
	IncompleteNodes int
}

// node is one server of the cluster (or the single server).
type node struct {
	addr           string
	shard, replica int
}

// nodeState is what one survey found on a node.
type nodeState struct {
	node
	db    *DB   // nil: out of reach
	err   error // why it is out of reach
	hasDB bool
	local *tableInfo
	dist  *tableInfo
	// view is the table's View on the node, hasSource whether the view's
	// source table is there, viewFed whether that source feeds the view.
	view               *tableInfo
	hasSource, viewFed bool
}

// tableInfo describes a table found on a node.
type tableInfo struct {
	engine     string
	create     string
	sortingKey string
	columns    map[string]string
	// dependents are the materialized views fed by the table.
	dependents []string
	// totalReplicas and activeReplicas come from system.replicas (0 for a
	// table that is not Replicated).
	totalReplicas, activeReplicas uint64
}

func (ti *tableInfo) lacks(cols []Column) []Column {
	var out []Column
	for _, c := range cols {
		if _, ok := ti.columns[c.Name]; !ok {
			out = append(out, c)
		}
	}
	return out
}

// Ensure brings t into shape on the server or on every node of the cluster
// (see Schema) and returns the state of the table writers insert into. It
// returns a *SchemaError when that table still lacks t's columns (a node or
// a change must wait; transient), and other errors when the DSN's server
// cannot be read or a statement fails.
func (s *Schema) Ensure(ctx context.Context, t *Table) (*TableState, error) {
	s.run.Lock()
	defer s.run.Unlock()
	if s.db.cluster != "" && t.ShardingKey == "" {
		return nil, fmt.Errorf("ClickHouse table %s: no sharding key for the Distributed table", t.Name)
	}
	states, waiting, err := s.complete(ctx, t)
	if err != nil {
		return nil, err
	}
	st, waiting := s.stateOf(t, states, waiting)
	waitingText := strings.Join(dedupe(waiting), "; ")
	logWaiting := s.record(t, st.IncompleteNodes, waitingText)
	if err := s.entryColumns(ctx, t, st, waitingText); err != nil {
		var se *SchemaError
		if errors.As(err, &se) {
			return st, err
		}
		return nil, err
	}
	if !st.Complete && logWaiting {
		s.log.Warn("ClickHouse table incomplete on the cluster; writing, and completing it when possible",
			"table", s.db.Table(t.Name), "cluster", s.db.cluster, "incomplete_nodes", st.IncompleteNodes, "waiting", waitingText)
	}
	return st, nil
}

// complete surveys every node and creates and alters what t lacks there;
// it returns the nodes as they are afterwards and what must wait.
func (s *Schema) complete(ctx context.Context, t *Table) ([]*nodeState, []string, error) {
	cluster := s.db.cluster
	nodes, err := s.topology(ctx)
	if err != nil {
		return nil, nil, err
	}
	states := s.survey(ctx, nodes, t)
	if err := s.checkDistributed(t, states); err != nil {
		return nil, nil, err
	}
	preexisting := anyLocal(states)
	if cluster != "" && allReachable(states) && !preexisting {
		if err := s.createOnCluster(ctx, t); err != nil {
			return nil, nil, err
		}
		states = s.survey(ctx, nodes, t)
	}
	changed, waiting, err := s.createMissing(ctx, t, states)
	if err != nil {
		return nil, nil, err
	}
	steps := []func([]*nodeState) (bool, []string){
		func(states []*nodeState) (bool, []string) { return s.addLocalColumns(ctx, t, states) },
	}
	if cluster != "" {
		steps = append(steps, func(states []*nodeState) (bool, []string) { return s.addDistributedColumns(ctx, t, states) })
	}
	for _, step := range steps {
		if changed {
			states = s.survey(ctx, nodes, t)
		}
		var w []string
		changed, w = step(states)
		waiting = append(waiting, w...)
	}
	if preexisting {
		s.setOptions(ctx, t, states)
	}
	if changed {
		states = s.survey(ctx, nodes, t)
	}
	return states, waiting, nil
}

// checkDistributed returns an error naming a node where the table writers
// insert into exists on a cluster but is not a Distributed table: writing
// there would bypass the cluster, so the operator renames it
// (docs/clickhouse.md, access_logs layout and migration) and Ensure
// creates the Distributed table.
func (s *Schema) checkDistributed(t *Table, states []*nodeState) error {
	for _, n := range states {
		if n.dist != nil && n.dist.engine != "Distributed" {
			return fmt.Errorf("ClickHouse table %s on %s is a %s table, not the Distributed table of cluster %s: rename it (its rows can be copied into the new tables with INSERT … SELECT)",
				s.db.Table(t.Name), n.addr, n.dist.engine, s.db.cluster)
		}
	}
	return nil
}

// stateOf sums up the nodes' states: the nodes where t is incomplete, the
// sorting key, and waiting with the nodes out of reach added.
func (s *Schema) stateOf(t *Table, states []*nodeState, waiting []string) (*TableState, []string) {
	st := &TableState{Complete: len(waiting) == 0}
	for _, n := range states {
		if st.SortingKey == "" && n.local != nil {
			st.SortingKey = n.local.sortingKey
		}
		if n.db == nil {
			st.IncompleteNodes++
			waiting = append(waiting, fmt.Sprintf("node %s (shard %d) is out of reach: %v", n.addr, n.shard, n.err))
			continue
		}
		if n.local == nil || len(n.local.lacks(t.Columns)) > 0 || (s.db.cluster != "" && (n.dist == nil || len(n.dist.lacks(t.Columns)) > 0)) ||
			viewIncomplete(t, n) {
			st.IncompleteNodes++
		}
	}
	if st.IncompleteNodes > 0 {
		st.Complete = false
	} else if !st.Complete {
		// Every node has the table, but a change waits (e.g. for a
		// replica to apply an ALTER): count the shard's nodes as one.
		st.IncompleteNodes = 1
	}
	return st, waiting
}

// entryColumns reads the columns of the table writers insert into (on the
// DSN's server) into st, and returns a *SchemaError when it lacks some of
// t's.
func (s *Schema) entryColumns(ctx context.Context, t *Table, st *TableState, waiting string) error {
	entry, err := s.conn(ctx, node{})
	if err != nil {
		return err
	}
	cols, err := tableColumns(ctx, entry, t.Name)
	if err != nil {
		if ErrorCode(err) == 0 {
			s.dropConn(node{}, entry, err)
		}
		return err
	}
	st.Columns = cols
	missing := MissingColumns(t, cols)
	if len(cols) > 0 && len(missing) == 0 {
		if !t.WritesOwnTypes {
			return nil
		}
		if err := ColumnTypesProblem(t, cols); err != nil {
			return &SchemaError{Table: s.db.Table(t.Name), Reason: err.Error()}
		}
		return nil
	}
	reason := "table missing"
	if len(cols) > 0 {
		reason = "columns " + strings.Join(missing, ", ") + " missing"
	}
	if waiting != "" {
		reason += " (" + waiting + ")"
	}
	return &SchemaError{Table: s.db.Table(t.Name), Reason: reason}
}

// record keeps what Ensure found for t and reports whether waiting is news
// to log (it differs from the last reason logged). A table that becomes
// complete is logged here.
func (s *Schema) record(t *Table, incomplete int, waiting string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.status[t.Name]
	s.status[t.Name] = &tableStatus{table: t, incomplete: incomplete, waiting: waiting}
	if incomplete == 0 {
		if prev != nil && prev.incomplete > 0 {
			s.log.Info("ClickHouse table complete on every node of the cluster again", "table", s.db.Table(t.Name), "cluster", s.db.cluster)
		}
		return false
	}
	return prev == nil || prev.waiting != waiting
}

// topology lists the servers Ensure keeps in shape: the cluster's nodes,
// or the DSN's server.
func (s *Schema) topology(ctx context.Context) ([]node, error) {
	if s.db.cluster == "" {
		return []node{{addr: s.db.addr, shard: 1, replica: 1}}, nil
	}
	entry, err := s.conn(ctx, node{})
	if err != nil {
		return nil, fmt.Errorf("list the nodes of ClickHouse cluster %s: %w", s.db.cluster, err)
	}
	rows, err := entry.conn.Query(ctx, "SELECT host_name, toUInt64(port), toUInt64(shard_num), toUInt64(replica_num) FROM system.clusters WHERE cluster = "+
		QuoteString(s.db.cluster)+" ORDER BY shard_num, replica_num")
	if err != nil {
		return nil, fmt.Errorf("list the nodes of ClickHouse cluster %s at %s: %w", s.db.cluster, s.db.addr, err)
	}
	defer rows.Close()
	var nodes []node
	for rows.Next() {
		var host string
		var port, shard, replica uint64
		if err := rows.Scan(&host, &port, &shard, &replica); err != nil {
			return nil, fmt.Errorf("list the nodes of ClickHouse cluster %s: %w", s.db.cluster, err)
		}
		nodes = append(nodes, node{addr: net.JoinHostPort(host, strconv.FormatUint(port, 10)), shard: int(shard), replica: int(replica)})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list the nodes of ClickHouse cluster %s: %w", s.db.cluster, err)
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("ClickHouse at %s has no cluster %q in system.clusters (remote_servers)", s.db.addr, s.db.cluster)
	}
	return nodes, nil
}

// connKey is the key of n's connection in Schema.nodes, and the address
// openNode takes: "" stands for the DSN's own server(s), which is what a
// single server's one node is.
func (s *Schema) connKey(n node) string {
	if s.db.cluster == "" {
		return ""
	}
	return n.addr
}

// conn returns the connection to n (node{} for the DSN's server), opening
// it if needed; nil and the error while n is out of reach. It selects no
// database, so it works while the DSN's database is missing (never created,
// or dropped).
func (s *Schema) conn(ctx context.Context, n node) (*DB, error) {
	key := s.connKey(n)
	s.mu.Lock()
	c := s.nodes[key]
	if c != nil && (c.db != nil || time.Since(c.at) < nodeRetry) {
		s.mu.Unlock()
		return c.db, c.err
	}
	s.mu.Unlock()
	db, err := s.db.openNode(ctx, key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.nodes[key]; old != nil && old.db != nil {
		// Another caller connected meanwhile.
		if db != nil {
			_ = db.Close()
		}
		return old.db, nil
	}
	s.nodes[key] = &nodeConn{db: db, err: err, at: time.Now()}
	return db, err
}

// dropConn forgets n's connection db after a failure to use it.
func (s *Schema) dropConn(n node, db *DB, err error) {
	key := s.connKey(n)
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.nodes[key]; c != nil && c.db == db {
		_ = db.Close()
		s.nodes[key] = &nodeConn{err: err, at: time.Now()}
	}
}

// survey reads every node's database, tables and columns, in parallel.
func (s *Schema) survey(ctx context.Context, nodes []node, t *Table) []*nodeState {
	states := make([]*nodeState, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		states[i] = &nodeState{node: n}
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := states[i]
			db, err := s.conn(ctx, n)
			if err != nil {
				st.err = err
				return
			}
			if err := s.read(ctx, db, t, st); err != nil {
				if ErrorCode(err) == 0 {
					s.dropConn(n, db, err)
				}
				st.err = err
				return
			}
			st.db = db
		}()
	}
	wg.Wait()
	return states
}

// read fills st from one node's system tables.
func (s *Schema) read(ctx context.Context, db *DB, t *Table, st *nodeState) error {
	cluster := s.db.cluster
	database := QuoteString(s.db.database)
	var n uint64
	if err := db.conn.QueryRow(ctx, "SELECT count() FROM system.databases WHERE name = "+database).Scan(&n); err != nil {
		return fmt.Errorf("read databases of %s: %w", db.addr, err)
	}
	st.hasDB = n > 0
	if !st.hasDB {
		return nil
	}
	local := t.LocalName(cluster)
	quoted := []string{QuoteString(local)}
	if cluster != "" {
		quoted = append(quoted, QuoteString(t.Name))
	}
	for _, n := range viewNames(cluster, t) {
		quoted = append(quoted, QuoteString(n))
	}
	names := strings.Join(quoted, ", ")
	tables, err := readTables(ctx, db, database, names)
	if err != nil || len(tables) == 0 {
		return err
	}
	if err := readColumns(ctx, db, database, names, tables); err != nil {
		return err
	}
	st.local, st.dist = tables[local], nil
	if cluster != "" {
		st.dist = tables[t.Name]
	}
	readView(cluster, t, tables, st)
	if cluster != "" && st.local != nil {
		return readReplicas(ctx, db, database, local, st.local)
	}
	return nil
}

// readTables reads the tables named (quoted, separated by commas) of the
// database (quoted) on db's server.
func readTables(ctx context.Context, db *DB, database, names string) (map[string]*tableInfo, error) {
	tables := map[string]*tableInfo{}
	err := db.eachRow(ctx, "SELECT name, engine, create_table_query, sorting_key, dependencies_table FROM system.tables WHERE database = "+database+" AND name IN ("+names+")",
		func(rows driver.Rows) error {
			var name string
			ti := &tableInfo{columns: map[string]string{}}
			if err := rows.Scan(&name, &ti.engine, &ti.create, &ti.sortingKey, &ti.dependents); err != nil {
				return err
			}
			tables[name] = ti
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("read tables of %s: %w", db.addr, err)
	}
	return tables, nil
}

// readColumns reads the columns of the tables named (quoted, separated by
// commas) of the database (quoted) on db's server into tables.
func readColumns(ctx context.Context, db *DB, database, names string, tables map[string]*tableInfo) error {
	err := db.eachRow(ctx, "SELECT table, name, type FROM system.columns WHERE database = "+database+" AND table IN ("+names+")",
		func(rows driver.Rows) error {
			var table, name, typ string
			if err := rows.Scan(&table, &name, &typ); err != nil {
				return err
			}
			if ti := tables[table]; ti != nil {
				ti.columns[name] = typ
			}
			return nil
		})
	if err != nil {
		return fmt.Errorf("read columns of %s: %w", db.addr, err)
	}
	return nil
}

// readReplicas reads how many replicas the replicated table local of the
// database (quoted) has, and how many are active, into ti.
func readReplicas(ctx context.Context, db *DB, database, local string, ti *tableInfo) error {
	err := db.eachRow(ctx, "SELECT toUInt64(total_replicas), toUInt64(active_replicas) FROM system.replicas WHERE database = "+database+" AND table = "+QuoteString(local),
		func(rows driver.Rows) error { return rows.Scan(&ti.totalReplicas, &ti.activeReplicas) })
	if err != nil {
		return fmt.Errorf("read replicas of %s: %w", db.addr, err)
	}
	return nil
}

func allReachable(states []*nodeState) bool {
	for _, n := range states {
		if n.db == nil {
			return false
		}
	}
	return true
}

func anyLocal(states []*nodeState) bool {
	for _, n := range states {
		if n.local != nil {
			return true
		}
	}
	return false
}

// createOnCluster runs CreateStatements ON CLUSTER. A timeout (some node
// did not finish in time; it runs the statement from the DDL queue later)
// is logged, not returned: the per-node steps that follow complete what
// is missing.
func (s *Schema) createOnCluster(ctx context.Context, t *Table) error {
	ddlCtx := ch.Context(ctx, ch.WithSettings(ch.Settings{
		"distributed_ddl_task_timeout": s.db.int64Setting(int(s.ddlTimeout / time.Second)),
	}))
	for _, stmt := range CreateStatements(s.db.database, s.db.cluster, s.db.version, t) {
		if err := s.db.Exec(ddlCtx, stmt); err != nil {
			if RetriableCode(ErrorCode(err)) || SchemaCode(ErrorCode(err)) {
				s.log.Warn("ClickHouse ON CLUSTER DDL did not finish on every node; completing node by node", "cluster", s.db.cluster, "err", err)
				return nil
			}
			return fmt.Errorf("create %s on cluster %s: %w", s.db.Table(t.Name), s.db.cluster, err)
		}
	}
	s.log.Info("created ClickHouse table on the cluster", "table", s.db.Table(t.Name), "local", s.db.Table(t.LocalName(s.db.cluster)),
		"cluster", s.db.cluster, "columns", len(t.Columns))
	return nil
}

// createMissing creates, on each reachable node, the database, tables and
// view it lacks. It reports whether it created anything, and what must
// wait.
func (s *Schema) createMissing(ctx context.Context, t *Table, states []*nodeState) (bool, []string, error) {
	var waiting []string
	changed := false
	for _, n := range states {
		if n.db == nil {
			continue
		}
		c, w, err := s.createMissingOn(ctx, t, states, n)
		if err != nil {
			return false, nil, err
		}
		changed = changed || c
		waiting = append(waiting, w...)
	}
	return changed, waiting, nil
}

// createMissingOn creates on node n what it lacks of t: the database, the
// local table (a live peer's own statement when its shard has one), the
// Distributed table and t's view.
func (s *Schema) createMissingOn(ctx context.Context, t *Table, states []*nodeState, n *nodeState) (bool, []string, error) {
	cluster := s.db.cluster
	local := t.LocalName(cluster)
	changed := false
	if !n.hasDB {
		if err := n.db.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+QuoteIdent(s.db.database)); err != nil {
			return false, nil, fmt.Errorf("create database %s on %s: %w", s.db.database, n.addr, err)
		}
		changed = true
		s.log.Info("created ClickHouse database", "database", s.db.database, "node", n.addr)
	}
	if n.local == nil {
		stmt := createLocal(s.db.database, cluster, s.db.version, t, t.Columns, "")
		if peer := livePeer(states, n); peer != nil {
			// The new replica must match the columns in ZooKeeper,
			// which its live peer has.
			stmt = ifNotExists(peer.local.create)
		}
		if err := n.db.Exec(ctx, stmt); err != nil {
			return false, nil, fmt.Errorf("create %s on %s: %w", s.db.Table(local), n.addr, err)
		}
		changed = true
		s.log.Info("created ClickHouse table", "table", s.db.Table(local), "node", n.addr, "shard", n.shard)
	}
	var waiting []string
	if cluster != "" && n.dist == nil {
		switch err := n.db.Exec(ctx, createDistributed(s.db.database, cluster, t, "")); {
		case err == nil:
			changed = true
			s.log.Info("created ClickHouse Distributed table", "table", s.db.Table(t.Name), "node", n.addr)
		case SchemaCode(ErrorCode(err)):
			waiting = append(waiting, fmt.Sprintf("Distributed table on %s: %v", n.addr, err))
		default:
			return false, nil, fmt.Errorf("create %s on %s: %w", s.db.Table(t.Name), n.addr, err)
		}
	}
	c, w, err := s.createViewOn(ctx, t, n)
	if err != nil {
		return false, nil, err
	}
	if w != "" {
		waiting = append(waiting, w)
	}
	return changed || c, waiting, nil
}

// livePeer returns a reachable replica of n's shard that has the local
// table.
func livePeer(states []*nodeState, n *nodeState) *nodeState {
	for _, p := range states {
		if p != n && p.shard == n.shard && p.db != nil && p.local != nil {
			return p
		}
	}
	return nil
}

// ifNotExists turns "CREATE TABLE x …" (system.tables.create_table_query)
// into "CREATE TABLE IF NOT EXISTS x …".
func ifNotExists(create string) string {
	const prefix = "CREATE TABLE "
	if strings.HasPrefix(create, prefix) && !strings.HasPrefix(create, prefix+"IF NOT EXISTS ") {
		return prefix + "IF NOT EXISTS " + create[len(prefix):]
	}
	return create
}

// addLocalColumns adds t's missing columns to each shard's local table,
// on one replica per shard. It reports whether it altered anything, and
// what must wait.
func (s *Schema) addLocalColumns(ctx context.Context, t *Table, states []*nodeState) (bool, []string) {
	local := s.db.Table(t.LocalName(s.db.cluster))
	var waiting []string
	changed := false
	for _, shard := range shards(states) {
		holders := holders(states, shard)
		if len(holders) == 0 {
			continue // createMissing could not reach the shard: already waiting
		}
		missing, behind := missingColumns(t, holders, shard)
		waiting = append(waiting, behind...)
		if len(missing) == 0 {
			continue
		}
		altered, wait := s.addShardColumns(ctx, local, shard, holders[0], missing)
		changed = changed || altered
		if wait != "" {
			waiting = append(waiting, wait)
		}
	}
	return changed, waiting
}

// holders returns the nodes of shard that were reached and hold the local
// table.
func holders(states []*nodeState, shard int) []*nodeState {
	var out []*nodeState
	for _, n := range states {
		if n.shard == shard && n.db != nil && n.local != nil {
			out = append(out, n)
		}
	}
	return out
}

// missingColumns returns the columns of t every live replica of shard (its
// holders) lacks, to be added, and what waits for a column only some lack:
// an ALTER a replica has yet to apply.
func missingColumns(t *Table, holders []*nodeState, shard int) (missing []Column, waiting []string) {
	for _, c := range t.Columns {
		lacking := 0
		for _, h := range holders {
			if _, ok := h.local.columns[c.Name]; !ok {
				lacking++
			}
		}
		switch lacking {
		case 0:
		case len(holders):
			missing = append(missing, c)
		default:
			waiting = append(waiting, fmt.Sprintf("a replica of shard %d has not applied column %s yet", shard, c.Name))
		}
	}
	return missing, waiting
}

// addShardColumns adds the missing columns to the local table of shard on
// its replica h. It reports whether it altered the table (or tried to),
// and what must wait, if anything.
func (s *Schema) addShardColumns(ctx context.Context, local string, shard int, h *nodeState, missing []Column) (changed bool, waiting string) {
	if s.db.cluster != "" && !s.db.version.HasReplicatedAlterLog() && h.local.activeReplicas < h.local.totalReplicas {
		return false, fmt.Sprintf("adding %s to shard %d waits until its %d replicas are all active (%d are): ClickHouse %s cannot restart a replica that missed more than two column changes",
			strings.Join(columnNames(missing), ", "), shard, h.local.totalReplicas, h.local.activeReplicas, s.db.version)
	}
	stmt := addColumns(local, missing, h.local.sortingKey)
	if err := h.db.Exec(ctx, stmt); err != nil {
		if ErrorCode(err) != 341 { // UNFINISHED: done, the inactive replicas follow
			return true, fmt.Sprintf("add columns to %s on %s: %v", local, h.addr, err)
		}
	}
	s.log.Info("added columns to ClickHouse table", "table", local, "node", h.addr, "shard", shard, "columns", strings.Join(columnNames(missing), ","))
	return true, ""
}

// addDistributedColumns adds to the Distributed table on every node the
// columns of t that every shard's local table has. It reports whether it
// altered anything, and what must wait.
func (s *Schema) addDistributedColumns(ctx context.Context, t *Table, states []*nodeState) (bool, []string) {
	dist := s.db.Table(t.Name)
	var waiting []string
	changed := false
	var ready []Column
	for _, c := range t.Columns {
		everywhere := true
		for _, shard := range shards(states) {
			has := slices.ContainsFunc(holders(states, shard), func(n *nodeState) bool {
				_, ok := n.local.columns[c.Name]
				return ok
			})
			everywhere = everywhere && has
		}
		if everywhere {
			ready = append(ready, c)
		} else {
			waiting = append(waiting, "column "+c.Name+" is not on every shard yet")
		}
	}
	for _, n := range states {
		if n.db == nil || n.dist == nil {
			continue
		}
		missing := n.dist.lacks(ready)
		if len(missing) == 0 {
			continue
		}
		changed = true
		if err := n.db.Exec(ctx, addColumns(dist, missing, "")); err != nil {
			waiting = append(waiting, fmt.Sprintf("add columns to %s on %s: %v", dist, n.addr, err))
			continue
		}
		s.log.Info("added columns to ClickHouse Distributed table", "table", dist, "node", n.addr, "columns", strings.Join(columnNames(missing), ","))
	}
	return changed, waiting
}

// setOptions brings the TTL and the table settings of a table that existed
// before this process to what t asks for, once per process and table, on
// one replica of each shard (the ALTER reaches the others); a failure is
// logged, not returned. The TTL is changed only when the retention
// changed, with materialize_ttl_after_modify = 0 where the server has it,
// so no part is rewritten: parts written before keep the old retention
// until a merge rewrites them anyway (docs/clickhouse.md, retention
// changes).
func (s *Schema) setOptions(ctx context.Context, t *Table, states []*nodeState) {
	local := s.db.Table(t.LocalName(s.db.cluster))
	s.mu.Lock()
	done := s.ttlSet[local]
	s.mu.Unlock()
	if done {
		return
	}
	ok := true
	for _, shard := range shards(states) {
		for _, n := range states {
			if n.shard != shard || n.db == nil || n.local == nil {
				continue
			}
			ok = s.setOptionsOn(ctx, t, n) && ok
			break
		}
	}
	if ok {
		s.mu.Lock()
		s.ttlSet[local] = true
		s.mu.Unlock()
	}
}

// setOptionsOn alters the local table on node n; it reports success.
func (s *Schema) setOptionsOn(ctx context.Context, t *Table, n *nodeState) bool {
	local := s.db.Table(t.LocalName(s.db.cluster))
	ok := true
	for _, st := range t.settings(s.db.cluster, s.db.version) {
		if strings.Contains(n.local.create, st.name+" = "+st.value) {
			continue
		}
		if err := n.db.Exec(ctx, "ALTER TABLE "+local+" MODIFY SETTING "+st.name+" = "+st.value); err != nil {
			s.log.Warn("could not set a ClickHouse table setting", "table", local, "node", n.addr, "setting", st.name, "err", err)
			ok = false
			continue
		}
		s.log.Info("set a ClickHouse table setting", "table", local, "node", n.addr, "setting", st.name+" = "+st.value)
	}
	ttl := t.ttl(s.db.version)
	if ttl == "" || hasTTL(n.local.create, t.Retention) {
		return ok
	}
	ttlCtx := ctx
	if s.db.version.HasTTLOnlyDropParts() {
		ttlCtx = ch.Context(ctx, ch.WithSettings(ch.Settings{"materialize_ttl_after_modify": 0}))
	}
	if err := n.db.Exec(ttlCtx, "ALTER TABLE "+local+" MODIFY TTL "+ttl); err != nil {
		s.log.Warn("could not set the ClickHouse table's TTL", "table", local, "node", n.addr, "err", err)
		return false
	}
	s.log.Info("changed the ClickHouse table's TTL; parts written before keep their old expiry until merged (ALTER TABLE … MATERIALIZE TTL applies it to them, rewriting them)",
		"table", local, "node", n.addr, "ttl", ttl)
	return ok
}

// hasTTL reports whether a CREATE statement (system.tables) already has
// the TTL of retention: the server writes "INTERVAL n SECOND" as
// toIntervalSecond(n).
func hasTTL(create string, retention time.Duration) bool {
	n := strconv.FormatInt(int64(retention/time.Second), 10)
	return strings.Contains(create, " TTL ") &&
		(strings.Contains(create, "toIntervalSecond("+n+")") || strings.Contains(create, "INTERVAL "+n+" SECOND"))
}

// Expire enforces t.Retention on servers without TTL: it drops, on each
// shard, the partitions of the local table whose newest row (by the
// partition key's time) is older than the retention, at most once an hour
// per table, and returns how many it dropped. Whole partitions only: rows
// live until every row of their partition (a day of access_logs, a month
// of a metrics table) has expired. It does nothing where the server has
// TTL (the table's TTL does the work) or without a retention.
func (s *Schema) Expire(ctx context.Context, t *Table, now time.Time) (int, error) {
	if t.Retention <= 0 || s.db.version.HasTTL() || t.PartitionBy == "" {
		return 0, nil
	}
	local := t.LocalName(s.db.cluster)
	s.mu.Lock()
	last := s.expiry[local]
	if !last.IsZero() && now.Sub(last) < expireInterval {
		s.mu.Unlock()
		return 0, nil
	}
	s.expiry[local] = now
	s.mu.Unlock()

	s.run.Lock()
	defer s.run.Unlock()
	nodes, err := s.topology(ctx)
	if err != nil {
		return 0, err
	}
	cutoff := now.Add(-t.Retention).Unix()
	dropped := 0
	var errs []error
	for _, shard := range shardsOf(nodes) {
		for _, n := range nodes {
			if n.shard != shard {
				continue
			}
			db, err := s.conn(ctx, n)
			if err != nil {
				continue // another replica of the shard, if any
			}
			d, err := s.expireOn(ctx, db, local, cutoff)
			dropped += d
			if err != nil {
				errs = append(errs, err)
			}
			break
		}
	}
	return dropped, errors.Join(errs...)
}

// expireOn drops the expired partitions of table on one server (a replica
// of a Replicated table: the drop reaches its shard's other replicas).
func (s *Schema) expireOn(ctx context.Context, db *DB, table string, cutoff int64) (int, error) {
	rows, err := db.conn.Query(ctx, "SELECT partition_id, any(partition), sum(rows) FROM system.parts WHERE active AND database = "+
		QuoteString(s.db.database)+" AND table = "+QuoteString(table)+" AND partition_id != 'all'"+
		" GROUP BY partition_id HAVING max(max_time) < toDateTime("+strconv.FormatInt(cutoff, 10)+") ORDER BY partition_id")
	if err != nil {
		return 0, fmt.Errorf("list expired partitions of %s on %s: %w", table, db.addr, err)
	}
	type part struct {
		id, name string
		rows     uint64
	}
	var parts []part
	for rows.Next() {
		var p part
		if err := rows.Scan(&p.id, &p.name, &p.rows); err != nil {
			rows.Close()
			return 0, fmt.Errorf("list expired partitions of %s: %w", table, err)
		}
		parts = append(parts, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("list expired partitions of %s: %w", table, err)
	}
	for i, p := range parts {
		if err := db.Exec(ctx, "ALTER TABLE "+s.db.Table(table)+" DROP PARTITION ID "+QuoteString(p.id)); err != nil {
			return i, fmt.Errorf("drop expired partition %s of %s on %s: %w", p.name, table, db.addr, err)
		}
		s.log.Info("dropped ClickHouse partition older than the retention", "table", s.db.Table(table), "partition", p.name,
			"rows", p.rows, "node", db.addr)
	}
	return len(parts), nil
}

func shards(states []*nodeState) []int {
	var out []int
	for _, n := range states {
		if !slices.Contains(out, n.shard) {
			out = append(out, n.shard)
		}
	}
	return out
}

func shardsOf(nodes []node) []int {
	var out []int
	for _, n := range nodes {
		if !slices.Contains(out, n.shard) {
			out = append(out, n.shard)
		}
	}
	return out
}

// tableColumns reads a table's columns and types on db's server (empty
// when it does not exist).
func tableColumns(ctx context.Context, db *DB, table string) (map[string]string, error) {
	rows, err := db.conn.Query(ctx, "SELECT name, type FROM system.columns WHERE database = "+QuoteString(db.database)+" AND table = "+QuoteString(table))
	if err != nil {
		return nil, fmt.Errorf("read columns of %s at %s: %w", db.Table(table), db.addr, err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return nil, fmt.Errorf("read columns of %s: %w", db.Table(table), err)
		}
		out[name] = typ
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", db.Table(table), err)
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

func dedupe(s []string) []string {
	out := make([]string, 0, len(s))
	for _, x := range s {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}
