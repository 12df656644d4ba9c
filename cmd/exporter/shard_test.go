package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platformsim"
)

// TestShardsSplitEnvironmentsAndRequests runs three exporters with
// --shard.count 3 against simulators of the same world (100 environments)
// and checks, at each simulator, that the shards' environment sets are
// disjoint and cover every environment, and that each shard's poll cycle
// takes datasets × ceil(its environments / 20) data requests.
func TestShardsSplitEnvironmentsAndRequests(t *testing.T) {
	const shards = 3
	owner := map[string]int{}
	var all []string
	for idx := range shards {
		te := startExporter(t, testOptions{
			sim:    platformsim.Config{Properties: 4, Environments: 100},
			common: func(c *commonFlags) { c.shardIndex, c.shardCount = idx, shards },
		})
		all = te.sim.EnvironmentIDs()
		datasets := te.sim.DatasetNames()

		te.sim.ResetStats()
		te.advance(2*time.Minute + 30*time.Second) // one poll cycle
		st := te.sim.Stats()
		served := map[string]bool{}
		for _, d := range st.Data {
			if d.Status != http.StatusOK {
				t.Errorf("shard %d: data request answered %d", idx, d.Status)
			}
			for _, env := range d.Environments {
				served[env] = true
			}
		}
		for env := range served {
			if prev, ok := owner[env]; ok {
				t.Errorf("environment %s polled by shards %d and %d", env, prev, idx)
			}
			owner[env] = idx
		}
		want := len(datasets) * ceilDiv(len(served), metricsapi.MaxFilterValues)
		if len(st.Data) != want {
			t.Errorf("shard %d serves %d environments with %d data requests per cycle, want %d",
				idx, len(served), len(st.Data), want)
		}
		t.Logf("shard %d/%d: %d environments, %d data requests per cycle", idx, shards, len(served), len(st.Data))
		te.stop()
	}
	if len(all) != 100 {
		t.Fatalf("world has %d environments", len(all))
	}
	for _, env := range all {
		if _, ok := owner[env]; !ok {
			t.Errorf("environment %s polled by no shard", env)
		}
	}
	if len(owner) != len(all) {
		t.Errorf("shards polled %d distinct environments, the world has %d", len(owner), len(all))
	}
}
