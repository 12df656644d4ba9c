package reference

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// repoRoot is the repository, from this package's directory.
const repoRoot = "../.."

// TestReferenceUpToDate generates the reference from the programs, built
// from this tree and started with a real ClickHouse and Kafka (kfake), and
// fails for every page under docs/reference that differs, naming it. With
// EDGEPIPE_UPDATE_REFERENCE=1 it writes the pages instead (what `make docs`
// does without a test).
func TestReferenceUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the programs")
	}
	ch := testenv.ClickHouse(t)
	kafka := testenv.Kafka(t)
	bins := map[string]string{}
	for _, p := range Programs {
		bins[p] = testenv.GoBuild(t, "github.com/edgepipe/edgepipe/cmd/"+p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pages, err := Generate(ctx, Config{Binaries: bins, ClickHouseDSN: ch.DSN("reference"), KafkaBrokers: kafka.Addr(), WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("EDGEPIPE_UPDATE_REFERENCE") == "1" {
		if err := Write(repoRoot, pages); err != nil {
			t.Fatal(err)
		}
		return
	}
	diffs, err := Compare(repoRoot, pages)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		t.Errorf("%s\nThe reference is generated from the code: run `make docs` and commit %s/.", d, Dir)
	}
}
