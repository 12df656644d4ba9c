package deploytest

import (
	"os/exec"
	"strings"
	"testing"
)

// TestBinariesLinkOnlyTheirOwnCode checks the package boundaries: the
// exporter links no receiver code, the receiver none of the exporter's
// sinks, and no sink imports the receiver's HTTP ingest (internal/rtld).
// A forbidden entry ending in "/..." forbids the whole tree.
func TestBinariesLinkOnlyTheirOwnCode(t *testing.T) {
	const mod = "github.com/edgepipe/edgepipe/"
	for _, tc := range []struct {
		pkg       string
		forbidden []string
	}{
		{"./cmd/exporter", []string{"internal/rtld/...", "internal/sinks/kafka/...", "internal/sinks/clickhouse/logtable/..."}},
		// The receiver makes the exporter's environments table (the Access
		// logs dashboard joins it) from its definition alone
		// (inventorytables), without the inventory or its writer.
		{"./cmd/rtld-receiver", []string{"internal/schedule/...", "internal/backfill/...", "internal/sinks/prometheus/...",
			"internal/sinks/otel/...", "internal/sinks/clickhouse/metrictables/...", "internal/inventory/...",
			"internal/sinks/clickhouse/inventorysink/..."}},
		{"./internal/sinks/...", []string{"internal/rtld"}},
		{"./internal/accesslog", []string{"..."}}, // a leaf: nothing of edgepipe
	} {
		t.Run(tc.pkg, func(t *testing.T) {
			out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "../../"+strings.TrimPrefix(tc.pkg, "./")).CombinedOutput()
			if err != nil {
				t.Fatalf("go list -deps %s: %v\n%s", tc.pkg, err, out)
			}
			self := mod + strings.TrimSuffix(strings.TrimPrefix(tc.pkg, "./"), "/...")
			for _, dep := range strings.Fields(string(out)) {
				// chdb-go loads libchdb.so at init and panics without it:
				// only internal/testenv/cmd/chdb-server may link it.
				if strings.HasPrefix(dep, "github.com/chdb-io/") {
					t.Errorf("%s links %s", tc.pkg, dep)
				}
				rel, ok := strings.CutPrefix(dep, mod)
				if !ok || strings.HasPrefix(dep, self) {
					continue
				}
				for _, f := range tc.forbidden {
					tree, isTree := strings.CutSuffix(f, "...")
					if rel == f || isTree && (tree == "" || rel+"/" == tree || strings.HasPrefix(rel, tree)) {
						t.Errorf("%s links %s", tc.pkg, dep)
					}
				}
			}
		})
	}
}
