package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

func TestClickHouseBatchInsertExplicitColumns(t *testing.T) {
	t.Parallel()
	ch := ClickHouse(t)
	db := ch.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	opts, err := clickhouse.ParseDSN(ch.DSN(db))
	if err != nil {
		t.Fatalf("parse DSN %q: %v", ch.DSN(db), err)
	}
	opts.Compression = &clickhouse.Compression{Method: clickhouse.CompressionLZ4}
	conn, err := clickhouse.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	v, err := conn.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("server: %s", v)

	ddl := `CREATE TABLE events (
		time DateTime, environment_id String, n UInt64, ratio Float64, version UInt64
	) ENGINE = ReplacingMergeTree(version) PARTITION BY toYYYYMM(time) ORDER BY (environment_id, time)`
	if err := conn.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	insert := func(version uint64, n int) {
		t.Helper()
		b, err := conn.PrepareBatch(ctx, "INSERT INTO events (time, environment_id, n, ratio, version)")
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			if err := b.Append(base.Add(time.Duration(i)*5*time.Minute), "env-a", uint64(i)*version, 0.5, version); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Send(); err != nil {
			t.Fatal(err)
		}
	}
	insert(1, 100)
	insert(2, 100) // the same keys again: FINAL keeps version 2

	var rows, sum uint64
	var first time.Time
	if err := conn.QueryRow(ctx, "SELECT count(), sum(n), min(time) FROM events FINAL").Scan(&rows, &sum, &first); err != nil {
		t.Fatal(err)
	}
	if rows != 100 || sum != 2*99*100/2 || !first.Equal(base) {
		t.Fatalf("FINAL: got %d rows, sum %d, first %s; want 100, %d, %s", rows, sum, first, 2*99*100/2, base)
	}
	var all uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM events").Scan(&all); err != nil {
		t.Fatal(err)
	}
	if all < rows {
		t.Fatalf("without FINAL: %d rows, fewer than FINAL's %d", all, rows)
	}
}

// TestClickHouse1816Quirks pins down what the driver and the old server do, so
// a change of either shows up here rather than in a sink's test.
func TestClickHouse1816Quirks(t *testing.T) {
	t.Parallel()
	ch := ClickHouse(t)
	conn := ch.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v, err := conn.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.Version.Major != 18 {
		t.Skipf("quirks are specific to 18.x; server is %s", v)
	}
	lcCtx := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"allow_experimental_low_cardinality_type": 1}))
	if err := conn.Exec(lcCtx, "CREATE TABLE lc (k LowCardinality(String), v UInt64) ENGINE = MergeTree ORDER BY v"); err != nil {
		t.Fatalf("LowCardinality with the setting: %v", err)
	}
	if err := conn.Exec(ctx, "CREATE TABLE lc2 (k LowCardinality(String)) ENGINE = Memory"); err == nil {
		t.Fatal("LowCardinality without allow_experimental_low_cardinality_type worked on 18.x")
	}
	b, err := conn.PrepareBatch(ctx, "INSERT INTO lc (k, v)")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := b.Append("x", uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatalf("insert into LowCardinality: %v", err)
	}
	// Without a column list the driver cannot append on 18.16.
	if b, err := conn.PrepareBatch(ctx, "INSERT INTO lc"); err == nil {
		if err := b.Append("y", uint64(1)); err == nil {
			t.Log("note: INSERT without a column list works with this driver/server now")
		}
		_ = b.Abort()
	}
	// INSERT … VALUES through Exec: 18.16 expects the client to send the
	// VALUES as data blocks and never answers; the driver hangs until the
	// context's deadline.
	valuesCtx, cancelValues := context.WithTimeout(ctx, time.Second)
	defer cancelValues()
	if err := ch.Conn(t).Exec(valuesCtx, "INSERT INTO lc (k, v) VALUES ('z', 1)"); err == nil {
		t.Log("note: Exec(INSERT … VALUES) works with this driver/server now")
	}
	// What does work on 18.16.
	for _, ddl := range []string{
		"ALTER TABLE lc ADD COLUMN w UInt64",
		"CREATE TABLE ok1 (t DateTime('UTC'), u UUID, n Nullable(String), a Array(String), e Enum8('a' = 1)) ENGINE = ReplacingMergeTree PARTITION BY toYYYYMM(t) ORDER BY (u, t)",
	} {
		if err := conn.Exec(ctx, ddl); err != nil {
			t.Errorf("%s: %v", ddl, err)
		}
	}
	if n := ch.QueryUint64(t, "SELECT count() FROM system.columns WHERE database = 'default' AND table = 'lc' AND name = 'w'"); n != 1 {
		t.Errorf("system.columns shows %d columns named w, want 1", n)
	}
	for _, ddl := range []string{
		"CREATE TABLE x1 (t DateTime64(3)) ENGINE = Memory",
		"CREATE TABLE x2 (m Map(String, String)) ENGINE = Memory",
		"CREATE TABLE x3 (t DateTime) ENGINE = MergeTree ORDER BY t TTL t + INTERVAL 1 DAY",
		"CREATE TABLE x4 (s String CODEC(ZSTD)) ENGINE = MergeTree ORDER BY s",
		"ALTER TABLE lc ADD COLUMN IF NOT EXISTS w UInt64",
	} {
		if err := conn.Exec(ctx, ddl); err == nil {
			t.Errorf("%s: worked on %s, update the ClickHouse doc comment", ddl, v)
		} else if !strings.Contains(err.Error(), "code:") {
			t.Errorf("%s: not a server exception: %v", ddl, err)
		}
	}
}

// TestClickHouseColumnarAndStructBatches checks the faster batch shapes
// against 18.16: whole columns at once, and structs tagged `ch:"…"`.
func TestClickHouseColumnarAndStructBatches(t *testing.T) {
	t.Parallel()
	ch := ClickHouse(t)
	conn := ch.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := ch.NewDatabase(t)
	ch.Exec(t, "CREATE TABLE "+db+".c (time DateTime, env String, n UInt64, f Nullable(Float64)) ENGINE = MergeTree ORDER BY (env, time)")

	const rows = 1000
	times := make([]time.Time, rows)
	envs := make([]string, rows)
	ns := make([]uint64, rows)
	fs := make([]*float64, rows)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range rows {
		times[i], envs[i], ns[i] = base.Add(time.Duration(i)*time.Minute), "e", uint64(i)
		if i%2 == 0 {
			f := float64(i)
			fs[i] = &f
		}
	}
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".c (time, env, n, f)")
	if err != nil {
		t.Fatal(err)
	}
	for i, col := range []any{times, envs, ns, fs} {
		if err := b.Column(i).Append(col); err != nil {
			t.Fatalf("column %d: %v", i, err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatalf("columnar send: %v", err)
	}

	type row struct {
		Time time.Time `ch:"time"`
		Env  string    `ch:"env"`
		N    uint64    `ch:"n"`
		F    *float64  `ch:"f"`
	}
	b, err = conn.PrepareBatch(ctx, "INSERT INTO "+db+".c (time, env, n, f)")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.AppendStruct(&row{Time: base, Env: "s", N: 7}); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(); err != nil {
		t.Fatalf("struct send: %v", err)
	}

	var got []row
	if err := conn.Select(ctx, &got, "SELECT time, env, n, f FROM "+db+".c WHERE env = 'e' ORDER BY n"); err != nil {
		t.Fatal(err)
	}
	if len(got) != rows || got[10].N != 10 || got[10].F == nil || *got[10].F != 10 || got[11].F != nil || !got[1].Time.Equal(base.Add(time.Minute)) {
		t.Fatalf("columnar rows read back wrong: %d rows, sample %+v %+v", len(got), got[10], got[11])
	}
	if n := ch.QueryUint64(t, "SELECT n FROM "+db+".c WHERE env = 's'"); n != 7 {
		t.Fatalf("struct row: n = %d, want 7", n)
	}
}

func TestClickHouseKillAndRestartKeepsData(t *testing.T) {
	t.Parallel()
	ch := ClickHouse(t)
	addr := ch.Addr()
	ch.Exec(t, "CREATE TABLE default.kept (v UInt64) ENGINE = MergeTree ORDER BY v")
	ch.Exec(t, "INSERT INTO default.kept (v) SELECT number + 1 FROM system.numbers LIMIT 3")

	ch.Kill()
	if ch.Running() {
		t.Fatal("running after Kill")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ch.ping(ctx); err == nil {
		t.Fatal("ping succeeded while killed")
	}
	ch.Start()
	if ch.Addr() != addr {
		t.Fatalf("address changed across restart: %s → %s", addr, ch.Addr())
	}
	var n uint64
	if err := ch.Conn(t).QueryRow(ctx, "SELECT count() FROM default.kept").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("after kill and restart: %d rows, want 3", n)
	}
	ch.Stop()
	ch.Start()
	if err := ch.Conn(t).QueryRow(ctx, "SELECT count() FROM default.kept").Scan(&n); err != nil || n != 3 {
		t.Fatalf("after stop and start: %d rows, err %v", n, err)
	}
}
