package metrictables

import (
	"context"
	"fmt"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
)

// OpenReadOnly connects to the sink's server with the sink's settings
// (password, TLS, cluster) without creating its database
// (clickhouse.ReadOnly), for Inspect. The caller closes it.
func (s *Sink) OpenReadOnly(ctx context.Context) (*clickhouse.DB, error) {
	return clickhouse.Open(ctx, s.cfg.DSN, append(s.openOptions(), clickhouse.ReadOnly())...)
}

// Inspect reports what the sink would find of its tables on db (opened
// with OpenReadOnly): the table of each dataset, as exported, with every
// column of its descriptor, then each of extra (the inventory's tables).
// It creates and alters nothing. An error means the server could not be
// read; what keeps the sink from writing a table (e.g. a column of another
// type than the sink writes) is its report's Problem.
func (s *Sink) Inspect(ctx context.Context, db *clickhouse.DB, datasets []metricsapi.Dataset, extra ...*clickhouse.Table) ([]*clickhouse.TableReport, error) {
	schema := clickhouse.NewSchema(db, s.log)
	defer schema.Close()
	specs := make([]*clickhouse.Table, 0, len(datasets)+len(extra))
	for i := range datasets {
		ds := &datasets[i]
		specs = append(specs, TableSpec(TableName(ds), MetricsColumns(ds, nil, nil), db.Version(), s.cfg.Retention))
	}
	specs = append(specs, extra...)
	reports := make([]*clickhouse.TableReport, 0, len(specs))
	for _, t := range specs {
		r, err := schema.Inspect(ctx, t)
		if err != nil {
			return nil, fmt.Errorf("ClickHouse table %s: %w", db.Table(t.Name), err)
		}
		reports = append(reports, r)
	}
	return reports, nil
}
