package schedule

import (
	"fmt"
	"hash/fnv"
)

// Shard selects the environments one exporter instance serves when several
// instances split an organization between them (--shard.index,
// --shard.count). An environment belongs to shard FNV-1a-64(environment ID)
// mod Count: deterministic, the same on every instance and every version,
// and independent of the order in which environments are discovered.
type Shard struct {
	Index, Count int
}

// Validate reports whether the shard is usable.
func (s Shard) Validate() error {
	if s.Count < 1 {
		return fmt.Errorf("shard count %d: must be at least 1", s.Count)
	}
	if s.Index < 0 || s.Index >= s.Count {
		return fmt.Errorf("shard index %d: must be in [0, %d)", s.Index, s.Count)
	}
	return nil
}

// Owns reports whether the environment belongs to this shard. A zero Shard
// (Count 0) owns everything.
func (s Shard) Owns(environmentID string) bool {
	if s.Count <= 1 {
		return true
	}
	return ShardOf(environmentID, s.Count) == s.Index
}

// ShardOf returns the shard in [0, count) that environmentID belongs to.
func ShardOf(environmentID string, count int) int {
	if count <= 1 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(environmentID))
	return int(h.Sum64() % uint64(count))
}
