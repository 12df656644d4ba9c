package rtld

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// claimAsync claims b in a goroutine and returns where its outcome arrives.
func claimAsync(ctx context.Context, g *GapTracker, b *accesslog.Batch) <-chan error {
	out := make(chan error, 1)
	go func() {
		c, err := g.Claim(ctx, b, time.Minute)
		if err == nil {
			c.Release(true)
		}
		out <- err
	}()
	return out
}

// waitWaiting waits until another copy waits for c's outcome.
func waitWaiting(t *testing.T, c *BatchClaim) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.set.mu.Lock()
		waiting := c.done != nil
		c.set.mu.Unlock()
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no copy waits for the claim")
		}
		time.Sleep(time.Millisecond)
	}
}

func (s *batchClaims) size() (all, stored int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byKey), s.stored
}

// TestGapTrackerClaim: a batch being spooled makes its copies wait for the
// outcome (a duplicate once stored, theirs to store once it failed); a
// stored batch is a duplicate until and after the tracker read it; the
// claims are forgotten once the tracker's state answers for them.
func TestGapTrackerClaim(t *testing.T) {
	ctx := t.Context()
	g := newTestTracker(t)
	b := idBatch("a", "20261123", 0)

	if c, err := g.Claim(ctx, &accesslog.Batch{Format: accesslog.FormatJSONArray, SeqNum: accesslog.NoSeqNum}, time.Minute); c != nil || err != nil {
		t.Fatalf("a batch without identity: %v, %v; want no claim", c, err)
	}

	// The first copy fails: the waiting copy gets the claim.
	c1, err := g.Claim(ctx, b, time.Minute)
	if err != nil || c1 == nil {
		t.Fatalf("first claim: %v, %v", c1, err)
	}
	second := claimAsync(ctx, g, b)
	waitWaiting(t, c1)
	c1.Release(false)
	if err := <-second; err != nil {
		t.Fatalf("the copy waiting for a failed one: %v, want the claim", err)
	}
	// It stored the batch (claimAsync released it as stored): a duplicate.
	if _, err := g.Claim(ctx, b, time.Minute); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("a copy of a stored batch the tracker has not read: %v, want ErrDuplicate", err)
	}

	// The first copy is stored: the waiting copy is a duplicate.
	b1 := idBatch("a", "20261123", 1)
	c2, err := g.Claim(ctx, b1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	third := claimAsync(ctx, g, b1)
	waitWaiting(t, c2)
	c2.Release(true)
	if err := <-third; !errors.Is(err, ErrDuplicate) {
		t.Fatalf("the copy waiting for a stored one: %v, want ErrDuplicate", err)
	}

	// A copy waits no longer than it may, nor than its context.
	b2 := idBatch("a", "20261123", 2)
	c3, err := g.Claim(ctx, b2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Claim(ctx, b2, 20*time.Millisecond); err == nil || errors.Is(err, ErrDuplicate) {
		t.Fatalf("a copy that waited its time: %v, want an error that is not ErrDuplicate", err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	if _, err := g.Claim(short, b2, time.Minute); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a copy whose context ended while waiting: %v, want its context's error", err)
	}
	cancel()
	c3.Release(false)

	// Once the tracker has read the stored batches it answers for them.
	if all, stored := g.claims.size(); all != 2 || stored != 2 {
		t.Fatalf("claims before the tracker read the spool: %d (%d stored), want 2 stored", all, stored)
	}
	g.observe(b, time.Now())
	g.observe(b1, time.Now())
	if all, stored := g.claims.size(); all != 0 || stored != 0 {
		t.Fatalf("claims after the tracker read them: %d (%d stored), want none", all, stored)
	}
	for _, x := range []*accesslog.Batch{b, b1} {
		if _, err := g.Claim(ctx, x, time.Minute); !errors.Is(err, ErrDuplicate) {
			t.Fatalf("seq %d after the tracker read it: %v, want ErrDuplicate", x.SeqNum, err)
		}
	}

	// The tracker reads the entry before the claim is released: nothing
	// is kept.
	b3 := idBatch("a", "20261123", 3)
	c4, err := g.Claim(ctx, b3, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	g.observe(b3, time.Now())
	c4.Release(true)
	if all, _ := g.claims.size(); all != 0 {
		t.Fatalf("%d claims kept for a batch the tracker already read", all)
	}
	if _, err := g.Claim(ctx, b3, time.Minute); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("seq 3: %v, want ErrDuplicate", err)
	}

	// A stored claim the tracker never reads (an entry it cannot read) is
	// dropped after claimTTL.
	c5, err := g.Claim(ctx, idBatch("a", "20261123", 4), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c5.Release(true)
	g.sweep(time.Now().Add(claimTTL - time.Minute))
	if _, stored := g.claims.size(); stored != 1 {
		t.Fatalf("%d stored claims before claimTTL, want 1", stored)
	}
	g.sweep(time.Now().Add(claimTTL + time.Minute))
	if all, stored := g.claims.size(); all != 0 || stored != 0 {
		t.Fatalf("%d claims (%d stored) after claimTTL, want none", all, stored)
	}
}

// TestGapTrackerClaimBounds: claims wait for the tracker to read what the
// previous run spooled (Recover), and stop at maxStoredClaims.
func TestGapTrackerClaimBounds(t *testing.T) {
	ctx := t.Context()
	g := newTestTracker(t)
	g.Recover(3)
	if _, err := g.Claim(ctx, idBatch("a", "20261123", 0), 20*time.Millisecond); err == nil || errors.Is(err, ErrDuplicate) {
		t.Fatalf("a claim before the tracker read the spool: %v, want an error", err)
	}
	pending := claimAsync(ctx, g, idBatch("a", "20261123", 0))
	g.advance(2)
	select {
	case err := <-pending:
		t.Fatalf("claimed (%v) before the tracker read the whole spool", err)
	case <-time.After(20 * time.Millisecond):
	}
	g.advance(3)
	if err := <-pending; err != nil {
		t.Fatalf("claim once the tracker read the spool: %v", err)
	}
	g.Recover(2) // already read: no wait
	g.claims.mu.Lock()
	g.claims.stored = maxStoredClaims
	g.claims.mu.Unlock()
	if _, err := g.Claim(ctx, idBatch("a", "20261123", 1), time.Minute); !errors.Is(err, errClaimsFull) {
		t.Fatalf("claim beyond the bound: %v, want errClaimsFull", err)
	}
}

func TestBatchKeysAreDistinct(t *testing.T) {
	base := accesslog.Batch{EnvironmentID: "env", ProfileID: "1", AgentID: "a", Datestamp: "20261123", SeqNum: 7}
	keys := map[string]string{}
	for name, mod := range map[string]func(*accesslog.Batch){
		"base":            func(*accesslog.Batch) {},
		"environment":     func(b *accesslog.Batch) { b.EnvironmentID = "env2" },
		"profile":         func(b *accesslog.Batch) { b.ProfileID = "2" },
		"agent":           func(b *accesslog.Batch) { b.AgentID = "b" },
		"datestamp":       func(b *accesslog.Batch) { b.Datestamp = "20261124" },
		"seq_num":         func(b *accesslog.Batch) { b.SeqNum = 8 },
		"shifted letters": func(b *accesslog.Batch) { b.EnvironmentID, b.ProfileID = "env1", "" },
	} {
		b := base
		mod(&b)
		k := string(appendBatchKey(nil, &b))
		if other, dup := keys[k]; dup {
			t.Fatalf("%s and %s share a key", name, other)
		}
		keys[k] = name
	}
}
