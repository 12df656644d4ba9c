package deploytest

import (
	"context"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// runSQLQueries expands every ClickHouse query of the dashboards with each of
// values, runs it, and fails the test for an error or an empty result. It
// returns the number of queries run.
func runSQLQueries(t *testing.T, conn driver.Conn, ds []Dashboard, values []Values) int {
	t.Helper()
	n := 0
	for _, d := range ds {
		qs, err := d.Queries()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if q.Language != ClickHouseSQL {
				continue
			}
			for _, v := range values {
				sql, err := Expand(d, q, v)
				if err != nil {
					t.Errorf("%s %s: %v", q.Dashboard, q.Where, err)
					continue
				}
				rows, unnamed, err := countNamedRows(conn, sql)
				if err != nil {
					t.Errorf("%s %s: %v\n%s", q.Dashboard, q.Where, err, sql)
					continue
				}
				if rows == 0 {
					t.Errorf("%s %s: no rows\n%s", q.Dashboard, q.Where, sql)
				}
				if unnamed != "" {
					t.Errorf("%s %s: environments not named: %s\n%s", q.Dashboard, q.Where, unnamed, sql)
				}
				n++
			}
		}
	}
	return n
}

// countRows runs sql and counts the rows it returns.
func countRows(conn driver.Conn, sql string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		n++
	}
	return n, rows.Err()
}
