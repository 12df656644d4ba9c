package logmetrics

import (
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// countedTTL is how long the seq_nums counted for an agent's datestamp are
// remembered after its last batch: longer than the platform keeps
// retrying an undeliverable batch (3 days).
const countedTTL = 96 * time.Hour

// maxSeqRanges bounds the ranges kept per agent and datestamp. Each hole
// (a batch not received yet, or lost) splits a range; beyond the bound the
// two lowest ranges merge, and a batch of the hole between them, should it
// arrive, is not counted (an undercount of a batch older than a thousand
// holes, never a double count).
const maxSeqRanges = 1024

// batchDay names the batches of one agent of one profile in one
// environment on one datestamp; seq_num numbers them.
type batchDay struct{ env, profile, agent, datestamp string }

// seqRange is an inclusive range of seq_nums.
type seqRange struct{ lo, hi int64 }

// seqSet is the seq_nums counted of one batchDay: sorted, disjoint,
// non-adjacent ranges (a run of consecutive batches is one range).
type seqSet struct {
	ranges  []seqRange
	touched int64 // unix seconds of the last batch
}

// add adds seq and reports whether it was not in the set.
func (s *seqSet) add(seq int64) bool {
	r := s.ranges
	i := sort.Search(len(r), func(i int) bool { return r[i].hi >= seq })
	if i < len(r) && r[i].lo <= seq {
		return false
	}
	left := i > 0 && r[i-1].hi == seq-1
	right := i < len(r) && r[i].lo == seq+1
	switch {
	case left && right:
		r[i-1].hi = r[i].hi
		r = slices.Delete(r, i, i+1)
	case left:
		r[i-1].hi = seq
	case right:
		r[i].lo = seq
	default:
		r = slices.Insert(r, i, seqRange{seq, seq})
	}
	if len(r) > maxSeqRanges {
		r[0].hi = r[1].hi
		r = slices.Delete(r, 1, 2)
	}
	s.ranges = r
	return true
}

// countedBatches remembers which batches with identity were counted, so a
// batch ingest spooled twice (a resend racing its first copy's
// acknowledgement, or two copies at once) is counted once. Batches without
// identity (json_array, json_lines) cannot be recognised: each delivery
// counts. Not safe for concurrent use.
type countedBatches struct {
	days map[batchDay]*seqSet
}

// add reports whether b is counted for the first time (always for a batch
// without identity) and remembers it.
func (c *countedBatches) add(b *accesslog.Batch, now time.Time) bool {
	if !b.HasIdentity() {
		return true
	}
	k := batchDay{b.EnvironmentID, b.ProfileID, b.AgentID, b.Datestamp}
	s := c.days[k]
	if s == nil {
		if c.days == nil {
			c.days = map[batchDay]*seqSet{}
		}
		// The strings may alias a request's buffers: keep copies.
		k = batchDay{strings.Clone(k.env), strings.Clone(k.profile), strings.Clone(k.agent), strings.Clone(k.datestamp)}
		s = &seqSet{}
		c.days[k] = s
	}
	s.touched = now.Unix()
	return s.add(b.SeqNum)
}

// forget drops what was counted for batch days without a batch since
// countedTTL.
func (c *countedBatches) forget(now time.Time) {
	cutoff := now.Add(-countedTTL).Unix()
	for k, s := range c.days {
		if s.touched < cutoff {
			delete(c.days, k)
		}
	}
}
