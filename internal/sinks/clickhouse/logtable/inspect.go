package logtable

import (
	"context"
	"fmt"

	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/inventorytables"
)

// OpenReadOnly connects to cfg's server with cfg's options without
// creating its database (clickhouse.ReadOnly), for Inspect. The caller
// closes it.
func OpenReadOnly(ctx context.Context, cfg Config) (*clickhouse.DB, error) {
	cfg = cfg.withDefaults()
	opts := append([]clickhouse.Option{clickhouse.WithLogger(cfg.Logger)}, cfg.Options...)
	return clickhouse.Open(ctx, cfg.DSN, append(opts, clickhouse.ReadOnly())...)
}

// Inspect reports what the sink would find on db (opened with
// OpenReadOnly), without creating or altering anything: access_logs, with
// the columns it would add (with the types the table has, as the sink reads
// them) and as its Problem an *IncompatibleColumnError for a column that
// cannot hold its field, its per-minute rollup (table and view; none when
// access_logs cannot feed it, which the sink logs), the environments table
// the sink makes for the dashboards, then each of extra (the
// reconciliation's tables). An error means the server could not be read.
func Inspect(ctx context.Context, db *clickhouse.DB, cfg Config, extra ...*clickhouse.Table) ([]*clickhouse.TableReport, error) {
	cfg = cfg.withDefaults()
	spec, err := TableSpec(db.Version(), cfg.Fields, nil, cfg.Retention)
	if err != nil {
		return nil, err
	}
	schema := clickhouse.NewSchema(db, cfg.Logger)
	defer schema.Close()
	r, err := schema.Inspect(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("ClickHouse table %s: %w", db.Table(Table), err)
	}
	if r.Exists && r.Problem == nil {
		checkColumns(db.Version(), cfg, r)
	}
	reports := []*clickhouse.TableReport{r}
	tables := []*clickhouse.Table{inventorytables.EnvironmentsTable()}
	if r.Exists && r.Problem == nil {
		// The rollup reads the columns as the table has them.
		if spec, err = TableSpec(db.Version(), cfg.Fields, r.Columns, cfg.Retention); err != nil {
			return nil, err
		}
	}
	if rollup, err := RollupSpec(db.Version(), spec, cfg.Retention); err == nil {
		tables = append([]*clickhouse.Table{rollup}, tables...)
	}
	for _, t := range append(tables, extra...) {
		r, err := schema.Inspect(ctx, t)
		if err != nil {
			return nil, fmt.Errorf("ClickHouse table %s: %w", db.Table(t.Name), err)
		}
		reports = append(reports, r)
	}
	return reports, nil
}

// checkColumns reads the columns of an existing access_logs as
// ensureTable does: the fixed columns' types, then the fields' with the
// types the table has; r gets the columns to add, or the problem.
func checkColumns(v clickhouse.Version, cfg Config, r *clickhouse.TableReport) {
	if err := checkFixedColumns(r.Columns); err != nil {
		r.Problem = err
		return
	}
	next, err := TableSpec(v, cfg.Fields, r.Columns, cfg.Retention)
	if err != nil {
		r.Problem = err
		return
	}
	r.Missing = clickhouse.MissingColumns(next, r.Columns)
}
