package testenv

import (
	"fmt"
	"os"
	"testing"
	"time"
)

func TestZZScratchCluster(t *testing.T) {
	if os.Getenv("ZZ_SCRATCH") == "" {
		t.Skip()
	}
	c := ClickHouseCluster(t, ClusterOptions{Shards: 2, Replicas: 2})
	single := ClickHouse(t)
	f, _ := os.Create("/tmp/rollupx/ports")
	for _, n := range c.Nodes {
		fmt.Fprintf(f, "%s %s\n", n.ReplicaName, n.Addr())
	}
	fmt.Fprintf(f, "single %s\n", single.Addr())
	f.Close()
	for i := 0; i < 3600; i++ {
		if _, err := os.Stat("/tmp/rollupx/stop"); err == nil {
			return
		}
		time.Sleep(time.Second)
	}
}

func TestZZScratchChDB(t *testing.T) {
	if os.Getenv("ZZ_SCRATCH") == "" {
		t.Skip()
	}
	s := ChDB(t)
	os.WriteFile("/tmp/rollupx/chdb", []byte(s.HTTPAddr()), 0o644)
	for i := 0; i < 3600; i++ {
		if _, err := os.Stat("/tmp/rollupx/stopchdb"); err == nil {
			return
		}
		time.Sleep(time.Second)
	}
}
