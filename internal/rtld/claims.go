package rtld

import (
	"encoding/binary"
	"errors"
	"sync"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// ErrDuplicate is returned by DuplicateChecker.Claim for a batch that is
// already spooled: ingest acknowledges it without storing it again.
var ErrDuplicate = errors.New("batch already spooled")

// errClaimsFull is returned by Claim when too many spooled batches wait for
// the gap tracker to read them: ingest answers 503 until it caught up.
var errClaimsFull = errors.New("too many spooled batches are waiting for the gap tracker")

// maxStoredClaims bounds the identities remembered between their spooling
// and the gap tracker reading them (about 100 bytes each). The tracker
// reads a few milliseconds behind ingest; reaching the bound means it has
// stalled, and ingest then refuses batches with identity (503) rather than
// forget one it stored.
const maxStoredClaims = 1 << 16

// claimTTL is how long a stored claim waits for the gap tracker: one it
// could not read (damaged on disk, or with more metadata than it reads)
// is dropped after it, at a sweep.
const claimTTL = time.Hour

// BatchClaim is ingest's hold on a batch identity while it spools the
// batch: another copy of the batch posted meanwhile waits for Release.
// A nil *BatchClaim (a batch without identity) holds nothing.
type BatchClaim struct {
	set *batchClaims
	key string
	// stored is set by Release(true); storedAt is when (unix seconds).
	stored   bool
	storedAt int64
	// observed is set when the gap tracker read a copy of the batch while
	// this claim was pending: it need not be kept once stored.
	observed bool
	// done is made by the first copy that waits, and closed by Release.
	done chan struct{}
}

// Release ends the claim: stored tells whether the batch was spooled.
// A stored batch stays claimed until the gap tracker has read it, so a
// copy arriving meanwhile is a duplicate; a batch not stored lets the next
// copy (one waiting, or the platform's resend) store it.
func (c *BatchClaim) Release(stored bool) {
	if c == nil {
		return
	}
	s := c.set
	s.mu.Lock()
	defer s.mu.Unlock()
	if stored && !c.observed {
		c.stored, c.storedAt = true, time.Now().Unix()
		s.stored++
	} else {
		delete(s.byKey, c.key)
	}
	if c.done != nil {
		close(c.done)
	}
}

// batchClaims holds the identities of the batches being spooled and of
// those spooled but not yet read by the gap tracker: what the tracker's
// state cannot answer yet. It is safe for concurrent use.
type batchClaims struct {
	mu     sync.Mutex
	byKey  map[string]*BatchClaim
	stored int // claims in byKey that are stored
}

// claim claims key: it returns the new claim, or (when another copy holds
// key and is being spooled) a channel closed when that copy's outcome is
// known, or ErrDuplicate when a copy was stored.
func (s *batchClaims) claim(key []byte) (*BatchClaim, <-chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.byKey[string(key)]; c != nil {
		if c.stored {
			return nil, nil, ErrDuplicate
		}
		if c.done == nil {
			c.done = make(chan struct{})
		}
		return nil, c.done, nil
	}
	if s.stored >= maxStoredClaims {
		return nil, nil, errClaimsFull
	}
	if s.byKey == nil {
		s.byKey = map[string]*BatchClaim{}
	}
	c := &BatchClaim{set: s, key: string(key)}
	s.byKey[c.key] = c
	return c, nil, nil
}

// observed is told that the gap tracker read a spooled batch with key: its
// state answers for it from now on.
func (s *batchClaims) observed(key []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.byKey[string(key)]
	switch {
	case c == nil:
	case c.stored:
		delete(s.byKey, c.key)
		s.stored--
	default:
		c.observed = true
	}
}

// expire drops the stored claims older than claimTTL.
func (s *batchClaims) expire(now time.Time) {
	cutoff := now.Add(-claimTTL).Unix()
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, c := range s.byKey {
		if c.stored && c.storedAt < cutoff {
			delete(s.byKey, k)
			s.stored--
		}
	}
}

// appendBatchKey appends b's identity (environment, profile, agent,
// datestamp, seq_num) to dst, each string prefixed by its length so that
// no two identities share a key.
func appendBatchKey(dst []byte, b *accesslog.Batch) []byte {
	for _, s := range [...]string{b.EnvironmentID, b.ProfileID, b.AgentID, b.Datestamp} {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	return binary.AppendVarint(dst, b.SeqNum)
}

// lazyTimer is a timer started when first waited on: most claims never
// wait.
type lazyTimer struct {
	d time.Duration
	t *time.Timer
}

func (l *lazyTimer) c() <-chan time.Time {
	if l.t == nil {
		l.t = time.NewTimer(l.d)
	}
	return l.t.C
}

func (l *lazyTimer) stop() {
	if l.t != nil {
		l.t.Stop()
	}
}
