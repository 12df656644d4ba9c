package backfill

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
)

// ProgressTable is the ClickHouse table that records loaded chunks.
const ProgressTable = "_edgepipe_backfill_progress"

// ClickHouseProgress records loaded chunks in a small table next to the data
// (ProgressTable in the DSN's database; on a cluster a replicated
// <ProgressTable>_local on every node and a Distributed ProgressTable, so
// any node sees every chunk and losing a node loses no progress). Keeping it
// in ClickHouse rather than a local file means progress lives and dies with
// the data it describes: a backfill resumed from another machine or
// container (the usual case for a Kubernetes Job) sees it, and pointing the
// exporter at a fresh database starts from scratch. A chunk is recorded only
// after its rows are written, so a crash in between re-fetches the chunk,
// which is harmless: the metrics tables are ReplacingMergeTrees.
//
// A chunk's record carries a deduplication token of the run and the chunk,
// and a MarkDone retried after a failure writes the same row (the same
// done_at), so a record the server had stored before the failure is not
// stored again (22.2+).
type ClickHouseProgress struct {
	db  *clickhouse.DB
	run string // this run's identity in the tokens

	mu sync.Mutex
	// doneAt holds the done_at of chunks whose MarkDone failed, for its
	// retry.
	doneAt map[string]time.Time
}

// progressTable is the progress table's shape.
var progressTable = clickhouse.Table{
	Name: ProgressTable,
	Columns: []clickhouse.Column{
		{Name: "chunk", Type: "String"},
		{Name: "dataset", Type: "String"},
		{Name: "granularity", Type: "String"},
		{Name: "start", Type: "DateTime('UTC')"},
		{Name: "end", Type: "DateTime('UTC')"},
		{Name: "environments", Type: "UInt32"},
		{Name: "rows", Type: "UInt64"},
		{Name: "done_at", Type: "DateTime('UTC')"},
	},
	Engine:      "ReplacingMergeTree",
	EngineArgs:  []string{"done_at"},
	OrderBy:     []string{"chunk"},
	ShardingKey: "cityHash64(chunk)",
}

// ProgressTableSpec returns the progress table's shape (a copy).
func ProgressTableSpec() *clickhouse.Table {
	t := progressTable
	return &t
}

// NewClickHouseProgress creates the progress table if needed (on every
// node of the schema's cluster).
func NewClickHouseProgress(ctx context.Context, schema *clickhouse.Schema) (*ClickHouseProgress, error) {
	if _, err := schema.Ensure(ctx, ProgressTableSpec()); err != nil {
		return nil, fmt.Errorf("create backfill progress table: %w", err)
	}
	return &ClickHouseProgress{db: schema.DB(), run: strconv.FormatInt(time.Now().UnixNano(), 10), doneAt: map[string]time.Time{}}, nil
}

// Completed returns the IDs of every chunk recorded as done.
func (p *ClickHouseProgress) Completed(ctx context.Context) (map[string]bool, error) {
	rows, err := p.db.Conn().Query(ctx, "SELECT DISTINCT chunk FROM "+p.db.Table(ProgressTable))
	if err != nil {
		return nil, fmt.Errorf("read backfill progress: %w", err)
	}
	defer rows.Close()
	out := make(map[string]bool)
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("read backfill progress: %w", err)
		}
		out[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read backfill progress: %w", err)
	}
	return out, nil
}

// MarkDone records chunk c as loaded with rows rows.
func (p *ClickHouseProgress) MarkDone(ctx context.Context, c Chunk, rows int) error {
	r := c.Request
	p.mu.Lock()
	at, retry := p.doneAt[c.ID]
	if !retry {
		at = time.Now().UTC()
	}
	p.mu.Unlock()
	h := sha256.Sum256([]byte(p.run + "\x00" + c.ID + "\x00" + strconv.Itoa(rows)))
	ctx = clickhouse.WithDeduplicationToken(ctx, "edgepipe-backfill-"+hex.EncodeToString(h[:16]))
	err := p.db.Insert(ctx, ProgressTable,
		[]string{"chunk", "dataset", "granularity", "start", "end", "environments", "rows", "done_at"},
		[][]any{{c.ID, r.Dataset, string(r.Granularity), r.Start.UTC(), r.End.UTC(),
			uint32(len(r.Environments)), uint64(rows), at}})
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.doneAt[c.ID] = at
	} else {
		delete(p.doneAt, c.ID)
	}
	return err
}

// Fresh wraps a Progress so that earlier runs are ignored (every chunk is
// loaded again) while this run still records what it loads.
type Fresh struct{ Progress }

// Completed reports nothing as done.
func (Fresh) Completed(context.Context) (map[string]bool, error) { return map[string]bool{}, nil }
