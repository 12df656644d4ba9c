package inventorytables_test

import (
	"strings"
	"testing"

	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/inventorytables"
)

// TestClusterStatements: on a cluster both tables are Replicated
// <table>_local tables and Distributed tables sharded by environment, as
// the metrics tables are (the schema manager is the same).
func TestClusterStatements(t *testing.T) {
	for _, tb := range []*clickhouse.Table{inventorytables.EnvironmentsTable(), inventorytables.CertificatesTable()} {
		stmts := strings.Join(clickhouse.CreateStatements("cdn", "prod", clickhouse.Version{Major: 18, Minor: 16}, tb), "\n")
		for _, want := range []string{
			"CREATE TABLE IF NOT EXISTS `cdn`.`" + tb.Name + "_local` ON CLUSTER `prod`",
			"ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/cdn/" + tb.Name + "_local', '{replica}', `version`)",
			"ENGINE = Distributed('prod', 'cdn', '" + tb.Name + "_local', cityHash64(`environment_id`))",
		} {
			if !strings.Contains(stmts, want) {
				t.Errorf("%s: no %q in\n%s", tb.Name, want, stmts)
			}
		}
	}
}
