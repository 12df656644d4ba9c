package preflight

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
)

// CheckClickHouse is the name of the ClickHouse check.
const CheckClickHouse = "ClickHouse"

// ClickHouse is the check "ClickHouse": open connects to the server of
// dsn read-only (clickhouse.ReadOnly) with the program's settings, which
// reports its version and whether the DSN's database exists. keep receives
// the connection for the table checks; the caller closes it.
func ClickHouse(dsn string, open func(context.Context) (*clickhouse.DB, error), keep func(*clickhouse.DB)) Check {
	dsn = clickhouse.RedactDSN(dsn)
	return Check{Name: CheckClickHouse, Run: func(ctx context.Context) Result {
		db, err := open(ctx)
		var unsupported *clickhouse.UnsupportedServerError
		switch {
		case errors.As(err, &unsupported):
			return Fail("%v", err)
		case err != nil && clickhouse.ErrorClass(err) == clickhouse.ClassDenied:
			return Fail("the server refuses the DSN's user: %v; check the user in --clickhouse.dsn (%s), the password ($EDGEPIPE_CLICKHOUSE_PASSWORD, its _FILE, or --clickhouse.password-file) and the user's grants", err, dsn)
		case err != nil:
			return Fail("cannot connect: %v; check --clickhouse.dsn (%s), that the server runs and that this machine reaches it", err, dsn)
		}
		exists, err := db.DatabaseExists(ctx)
		if err != nil {
			_ = db.Close()
			return Fail("%v", err)
		}
		keep(db)
		state := "exists"
		if !exists {
			state = "does not exist yet (created at start)"
		}
		return Pass("%s: ClickHouse %s over %s at %s; database %s %s", dsn, db.Version(), db.Protocol(), db.Addr(), db.Database(), state)
	}}
}

// ClickHouseTables is the check name: every table the program writes, as
// inspect reports them. It fails when a table cannot be written as it is,
// or a node of the cluster is out of reach; tables and columns the program
// creates at start pass.
func ClickHouseTables(name string, inspect func(context.Context) ([]*clickhouse.TableReport, error), needs ...string) Check {
	return Check{Name: name, Needs: append([]string{CheckClickHouse}, needs...), Run: func(ctx context.Context) Result {
		reports, err := inspect(ctx)
		if err != nil {
			return Fail("%v", err)
		}
		return tablesResult(reports)
	}}
}

// tablesResult sums up the reports.
func tablesResult(reports []*clickhouse.TableReport) Result {
	var problems, created, extended, unreachable []string
	fit := 0
	for _, r := range reports {
		switch {
		case r.Problem != nil:
			problems = append(problems, r.Problem.Error())
		case !r.Exists:
			created = append(created, r.Table)
		case len(r.Missing) > 0:
			extended = append(extended, fmt.Sprintf("%s (%s)", r.Table, strings.Join(r.Missing, ", ")))
		default:
			fit++
		}
		for _, u := range r.Unreachable {
			unreachable = append(unreachable, r.Table+": "+u)
		}
	}
	if len(problems) > 0 {
		return Fail("%s; nothing was changed", strings.Join(problems, "; "))
	}
	if len(unreachable) > 0 {
		return Fail("%s; the program writes, but these copies stay incomplete until the nodes are back: check the nodes and the cluster's remote_servers",
			strings.Join(dedupe(unreachable), "; "))
	}
	msg := fmt.Sprintf("%d tables: %d exist and fit", len(reports), fit)
	if len(extended) > 0 {
		msg += fmt.Sprintf("; columns added at start: %s", strings.Join(extended, "; "))
	}
	if len(created) > 0 {
		msg += fmt.Sprintf("; created at start: %s", strings.Join(created, ", "))
	}
	return Pass("%s", msg)
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
