package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// DocSQL returns the statements of the first ```sql block that contains
// marker in the section under heading (a whole heading line, such as
// "## access_logs layout and migration") of the Markdown file doc (a path
// from the root of the module the test runs in, such as
// "docs/clickhouse.md"), comments removed, split at semicolons, for tests
// that run the documentation's recipes as written.
func DocSQL(t testing.TB, doc, heading, marker string) []string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(moduleRoot(t), doc))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	s := string(text)
	start := strings.Index(s, "\n"+heading+"\n")
	if start < 0 {
		t.Fatalf("testenv: %s has no heading %q", doc, heading)
	}
	s = s[start+len(heading)+2:]
	level := heading[:strings.IndexByte(heading, ' ')+1] // "### "
	if end := regexp.MustCompile(`(?m)^#{2,` + strconv.Itoa(len(level)-1) + `} `).FindStringIndex(s); end != nil {
		s = s[:end[0]]
	}
	for _, m := range regexp.MustCompile("(?s)```sql\n(.*?)```").FindAllStringSubmatch(s, -1) {
		if !strings.Contains(m[1], marker) {
			continue
		}
		var stmts []string
		for _, stmt := range strings.Split(regexp.MustCompile(`(?m)--.*$`).ReplaceAllString(m[1], ""), ";") {
			if stmt = strings.TrimSpace(stmt); stmt != "" {
				stmts = append(stmts, stmt)
			}
		}
		return stmts
	}
	t.Fatalf("testenv: %s section %q has no sql block with %q", doc, heading, marker)
	return nil
}

// moduleRoot returns the directory of the go.mod above the working
// directory.
func moduleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("testenv: no go.mod above the working directory")
		}
		dir = parent
	}
}

// setStatement matches "SET a = 1, b = 0" (integer values only).
var setStatement = regexp.MustCompile(`(?i)^SET\s+(\w+\s*=\s*\d+(?:\s*,\s*\w+\s*=\s*\d+)*)$`)

// ExecSession runs stmts on conn in order as clickhouse-client runs them
// in one session: a SET statement (integer values) applies to the
// statements after it, sent with each as query settings (a connection pool
// has no session).
func ExecSession(ctx context.Context, conn driver.Conn, stmts []string) error {
	settings := clickhouse.Settings{}
	for _, stmt := range stmts {
		if m := setStatement.FindStringSubmatch(stmt); m != nil {
			for _, kv := range strings.Split(m[1], ",") {
				var name string
				var value int
				if _, err := fmt.Sscanf(strings.ReplaceAll(kv, "=", " "), "%s %d", &name, &value); err != nil {
					return fmt.Errorf("%s: %w", stmt, err)
				}
				settings[name] = value
			}
			continue
		}
		if err := conn.Exec(clickhouse.Context(ctx, clickhouse.WithSettings(settings)), stmt); err != nil {
			return fmt.Errorf("%w\n%s", err, stmt)
		}
	}
	return nil
}
