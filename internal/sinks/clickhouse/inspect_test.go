package clickhouse

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestInspectChangesNothing: with ReadOnly and Inspect (what `check`
// does), a database that does not exist stays missing and a table that
// lacks a column keeps lacking it, while the reports say what Ensure would
// create and add.
func TestInspectChangesNothing(t *testing.T) {
	ch := testenv.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	columns := func(db string) uint64 {
		return ch.QueryUint64(t, "SELECT count() FROM system.columns WHERE database = "+QuoteString(db)+" AND table = 'events'")
	}

	// A database that does not exist.
	missing := "check_missing_db"
	db, err := Open(ctx, ch.DSN(missing), ReadOnly(), WithLogger(testLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if ok, err := db.DatabaseExists(ctx); ok || err != nil {
		t.Fatalf("DatabaseExists = %v, %v; want false", ok, err)
	}
	s := NewSchema(db, testLogger())
	defer s.Close()
	r, err := s.Inspect(ctx, eventsTable())
	if err != nil {
		t.Fatal(err)
	}
	if r.Exists || r.Problem != nil || r.Incomplete != 1 || r.Nodes != 1 || r.Table != QuoteIdent(missing)+".`events`" {
		t.Errorf("report of a table in a missing database: %+v", r)
	}
	if n := ch.QueryUint64(t, "SELECT count() FROM system.databases WHERE name = "+QuoteString(missing)); n != 0 {
		t.Error("ReadOnly Open or Inspect created the database")
	}

	// A table that lacks a column.
	name := ch.NewDatabase(t)
	rw, err := Open(ctx, ch.DSN(name), WithLogger(testLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	ensureComplete(t, NewSchema(rw, testLogger()), eventsTable())
	ro, err := Open(ctx, ch.DSN(name), ReadOnly(), WithLogger(testLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if ok, err := ro.DatabaseExists(ctx); !ok || err != nil {
		t.Fatalf("DatabaseExists = %v, %v; want true", ok, err)
	}
	before := columns(name)
	s2 := NewSchema(ro, testLogger())
	defer s2.Close()
	r, err = s2.Inspect(ctx, eventsTable("extra", "more"))
	if err != nil {
		t.Fatal(err)
	}
	if !r.Exists || !slices.Equal(r.Missing, []string{"extra", "more"}) || r.Incomplete != 1 || r.Problem != nil || r.Columns["v"] != "UInt64" {
		t.Errorf("report of a table lacking two columns: %+v", r)
	}
	if after := columns(name); after != before {
		t.Errorf("Inspect changed the table: %d columns before, %d after", before, after)
	}
	r, err = s2.Inspect(ctx, eventsTable())
	if err != nil || !r.Exists || len(r.Missing) != 0 || r.Incomplete != 0 {
		t.Errorf("report of a complete table: %+v, %v", r, err)
	}
}
