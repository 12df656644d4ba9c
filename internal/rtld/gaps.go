package rtld

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/spool"
	"github.com/edgepipe/edgepipe/internal/rtld/statefile"
)

// GapReader is the spool reader name of the gap tracker. The tracker is a
// reader like the sinks: the spool keeps a segment until the tracker has
// persisted the state covering it, so after a crash the tracker replays
// exactly what its saved state lacks.
const GapReader = "gaps"

// keepDays is how many datestamps per agent the tracker remembers; the
// platform keeps undeliverable data for 3 days.
const keepDays = 4

// maxJump bounds how many seq_nums one batch may mark missing; a larger jump
// (a reset upstream) restarts the agent's sequence instead.
const maxJump = 100_000

// forgetAfter is how long after the grace period an agent that sends
// nothing is forgotten: longer than the platform resends a batch (it keeps
// undeliverable data for 3 days), so that Seen recognises every resend.
const forgetAfter = keepDays * 24 * time.Hour

// stateFile is the gap tracker's state in the spool directory; legacyStateFile
// is where releases before it kept the state (read once, then removed).
const (
	stateFile       = "gaps.state"
	legacyStateFile = "gaps.json"
)

// GapTracker follows seq_num per (environment, profile, agent, datestamp)
// (the platform counts seq_num per profile and agent): it counts
// duplicates and, once a missing seq_num has stayed missing for the grace
// period, a gap (a batch lost upstream). It also decides, for ingest,
// whether a batch is already spooled (Claim), so that a platform retry is
// acknowledged without being stored again: from its state, which follows
// the spool a moment behind, and from the batches ingest is spooling or
// has spooled since the tracker last read the spool.
//
// Its memory and state file stay small whatever agents send: missing and
// lost seq_nums are kept as ranges, agents silent for longer than the grace
// period plus 4 days are forgotten, the batches spooled but not read yet
// are bounded (maxStoredClaims), and the state is written (in place, so a
// full disk does not stop it) only when it changed. Run it with Run and
// Close it afterwards; it is safe for concurrent use.
type GapTracker struct {
	grace   time.Duration
	dir     string
	file    *statefile.File
	metrics *Metrics
	log     *slog.Logger

	mu     sync.Mutex
	agents map[agentKey]*agentState
	next   uint64 // spool index after the last observed entry
	dirty  bool   // the state changed since it was saved
	legacy bool   // the state came from legacyStateFile
	// recovered is closed once next reaches recoverEnd (see Recover).
	recovered  chan struct{}
	recoverEnd uint64

	claims batchClaims
}

type agentKey struct{ Env, Profile, Agent string }

type agentState struct {
	days map[string]*dayState
	// lastSeen is when the agent last sent a batch (unix seconds, to the
	// hour, so it changes the state at most hourly).
	lastSeen int64
}

type dayState struct {
	Max int64 `json:"max"`
	// Floor is the lowest seq_num the state knows about: after a reset
	// (a jump of more than maxJump) nothing below it counts as seen.
	Floor   int64     `json:"floor,omitempty"`
	Missing seqRanges `json:"missing,omitempty"` // Since: when noticed
	Lost    seqRanges `json:"lost,omitempty"`    // counted as gaps
}

// NewGapTracker returns a tracker that keeps its state in dir and counts a
// missing seq_num as a gap after grace.
func NewGapTracker(dir string, grace time.Duration, m *Metrics, log *slog.Logger) (*GapTracker, error) {
	if log == nil {
		log = slog.Default()
	}
	g := &GapTracker{grace: grace, dir: dir, metrics: m, log: log, agents: map[agentKey]*agentState{}, recovered: make(chan struct{})}
	close(g.recovered)
	f, data, err := statefile.Open(filepath.Join(dir, stateFile), statefile.Options{Capacity: 32 << 10})
	if err != nil {
		return nil, fmt.Errorf("opening gap state: %w", err)
	}
	g.file = f
	if data == nil {
		data, err = os.ReadFile(filepath.Join(dir, legacyStateFile))
		switch {
		case errors.Is(err, os.ErrNotExist):
			return g, nil
		case err != nil:
			f.Close()
			return nil, fmt.Errorf("reading gap state: %w", err)
		}
		g.legacy, g.dirty = true, true
	}
	g.load(data, time.Now())
	return g, nil
}

// Close closes the state file. Call it after Run returned.
func (g *GapTracker) Close() error { return g.file.Close() }

type savedState struct {
	Next   uint64       `json:"next_index"`
	Agents []savedAgent `json:"agents"`
}

type savedAgent struct {
	Env      string               `json:"environment_id"`
	Profile  string               `json:"profile_id"`
	Agent    string               `json:"agent_id"`
	LastSeen int64                `json:"last_seen,omitempty"`
	Days     map[string]*dayState `json:"days"`
}

func (g *GapTracker) load(data []byte, now time.Time) {
	var st savedState
	if err := json.Unmarshal(data, &st); err != nil {
		g.log.Warn("rtld: unreadable gap state, starting afresh", "dir", g.dir, "err", err)
		return
	}
	g.next = st.Next
	for _, a := range st.Agents {
		if a.LastSeen == 0 {
			// State from before last_seen: count from now.
			a.LastSeen = now.Truncate(time.Hour).Unix()
		}
		g.agents[agentKey{a.Env, a.Profile, a.Agent}] = &agentState{days: a.Days, lastSeen: a.LastSeen}
	}
}

// save writes the state if it changed since the last save.
func (g *GapTracker) save() error {
	g.mu.Lock()
	if !g.dirty {
		g.mu.Unlock()
		return nil
	}
	st := savedState{Next: g.next}
	for k, a := range g.agents {
		st.Agents = append(st.Agents, savedAgent{Env: k.Env, Profile: k.Profile, Agent: k.Agent, LastSeen: a.lastSeen, Days: a.days})
	}
	slices.SortFunc(st.Agents, func(x, y savedAgent) int {
		return cmp.Or(strings.Compare(x.Env, y.Env), strings.Compare(x.Profile, y.Profile), strings.Compare(x.Agent, y.Agent))
	})
	data, err := json.Marshal(st)
	g.dirty = false
	g.mu.Unlock()
	if err == nil {
		err = g.file.Write(data)
	}
	if err != nil {
		g.mu.Lock()
		g.dirty = true
		g.mu.Unlock()
		return fmt.Errorf("saving gap state: %w", err)
	}
	if g.legacy {
		g.legacy = false
		if err := os.Remove(filepath.Join(g.dir, legacyStateFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
			g.log.Warn("rtld: cannot remove the converted legacy gap state", "err", err)
		}
	}
	return nil
}

// Seen reports whether the batch b (with identity) was already observed in
// the spool. Batches without identity are never seen.
func (g *GapTracker) Seen(b *accesslog.Batch) bool {
	if !b.HasIdentity() {
		return false
	}
	datestamp, seq := b.Datestamp, b.SeqNum
	g.mu.Lock()
	defer g.mu.Unlock()
	a := g.agents[agentKey{b.EnvironmentID, b.ProfileID, b.AgentID}]
	if a == nil {
		return false
	}
	d := a.days[datestamp]
	if d == nil || seq > d.Max || seq < d.Floor {
		return false
	}
	return !d.Missing.contains(seq) && !d.Lost.contains(seq)
}

// Recover makes Claim wait until the tracker has read the spool up to
// index end, the end of the spool as the receiver found it at start: until
// then its state lacks what the previous run spooled after its last save,
// and a resend of such a batch (stored, but its acknowledgement lost in the
// crash) would be stored again. Call it before ingest is served.
func (g *GapTracker) Recover(end uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.next < end {
		g.recovered, g.recoverEnd = make(chan struct{}), end
	}
}

// Claim claims batch b for spooling. It returns ErrDuplicate when b is
// already spooled, by an earlier request or by a copy spooled concurrently
// (Claim waits for that copy's outcome, at most wait and until ctx ends).
// Otherwise the caller spools b and calls Release on the claim with the
// outcome. Batches without identity cannot be recognised: Claim returns a
// nil claim for them.
func (g *GapTracker) Claim(ctx context.Context, b *accesslog.Batch, wait time.Duration) (*BatchClaim, error) {
	if !b.HasIdentity() {
		return nil, nil
	}
	timer := lazyTimer{d: wait}
	defer timer.stop()
	g.mu.Lock()
	recovered := g.recovered
	g.mu.Unlock()
	select {
	case <-recovered:
	default:
		select {
		case <-recovered:
		case <-timer.c():
			return nil, fmt.Errorf("waited %s for the gap tracker to read the spool after the restart", wait)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var buf [128]byte
	key := appendBatchKey(buf[:0], b)
	for {
		c, other, err := g.claims.claim(key)
		if err != nil {
			return nil, err
		}
		if other != nil {
			select {
			case <-other:
				continue // the other copy's outcome is known: claim again
			case <-timer.c():
				return nil, fmt.Errorf("waited %s for another copy of the batch being spooled", wait)
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		// Checked after claiming: the tracker forgets a claim only after
		// its state holds the batch.
		if g.Seen(b) {
			c.Release(false)
			return nil, ErrDuplicate
		}
		return c, nil
	}
}

// CountDuplicate records a duplicate that ingest acknowledged without
// spooling it.
func (g *GapTracker) CountDuplicate(env, agent string) {
	g.metrics.duplicates.WithLabelValues(env, agent).Inc()
}

// observe records one spooled batch.
func (g *GapTracker) observe(b *accesslog.Batch, now time.Time) {
	if !b.HasIdentity() {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var buf [128]byte
	g.claims.observed(appendBatchKey(buf[:0], b))
	k := agentKey{b.EnvironmentID, b.ProfileID, b.AgentID}
	a := g.agents[k]
	if a == nil {
		a = &agentState{days: map[string]*dayState{}}
		g.agents[k] = a
	}
	if seen := now.Truncate(time.Hour).Unix(); seen > a.lastSeen {
		a.lastSeen, g.dirty = seen, true
	}
	d := a.days[b.Datestamp]
	if d == nil {
		d = &dayState{Max: -1}
		a.days[b.Datestamp] = d
		g.forgetOldDays(a)
	}
	seq := b.SeqNum
	switch {
	case seq > d.Max:
		if seq-d.Max-1 > maxJump {
			g.log.Warn("rtld: seq_num jumped, restarting the agent's sequence", "environment_id", k.Env, "agent_id", k.Agent,
				"datestamp", b.Datestamp, "from", d.Max, "to", seq)
			d.Missing, d.Lost, d.Floor = nil, nil, seq
		} else if seq > d.Max+1 {
			d.Missing.add(seqRange{Lo: d.Max + 1, Hi: seq - 1, Since: now.Unix()})
		}
		d.Max, g.dirty = seq, true
	case seq < d.Floor:
		// Below a reset: unknown territory, neither a gap nor a duplicate.
	case d.Lost.remove(seq):
		g.dirty = true
		g.metrics.late.WithLabelValues(k.Env, k.Agent).Inc()
	case d.Missing.remove(seq):
		g.dirty = true
	default:
		g.metrics.duplicates.WithLabelValues(k.Env, k.Agent).Inc()
	}
}

func (g *GapTracker) forgetOldDays(a *agentState) {
	if len(a.days) <= keepDays {
		return
	}
	days := make([]string, 0, len(a.days))
	for d := range a.days {
		days = append(days, d)
	}
	sort.Strings(days)
	for _, d := range days[:len(days)-keepDays] {
		delete(a.days, d)
	}
}

// sweep turns seq_nums missing for longer than the grace period into gaps,
// forgets agents silent for longer than the grace period plus 4 days and
// claims the tracker could not read within claimTTL, and updates the
// missing gauge.
func (g *GapTracker) sweep(now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.claims.expire(now)
	var pending int64
	cutoff := now.Add(-g.grace).Unix()
	forget := now.Add(-g.grace - forgetAfter).Unix()
	for k, a := range g.agents {
		if a.lastSeen < forget {
			delete(g.agents, k)
			g.dirty = true
			continue
		}
		for _, d := range a.days {
			kept := d.Missing[:0]
			for _, r := range d.Missing {
				if r.Since > cutoff {
					pending += r.Hi - r.Lo + 1
					kept = append(kept, r)
					continue
				}
				d.Lost.add(seqRange{Lo: r.Lo, Hi: r.Hi})
				g.metrics.gaps.WithLabelValues(k.Env, k.Agent).Add(float64(r.Hi - r.Lo + 1))
				g.dirty = true
			}
			d.Missing = kept
			if len(d.Missing) == 0 {
				d.Missing = nil
			}
		}
	}
	g.metrics.missing.Set(float64(pending))
}

// advance records that the tracker read the spool up to index next.
func (g *GapTracker) advance(next uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.next = next
	if g.recoverEnd > 0 && next >= g.recoverEnd {
		close(g.recovered)
		g.recoverEnd = 0
	}
}

// SpoolReader is what the gap tracker needs from its spool cursor.
type SpoolReader interface {
	NextPrefixes(ctx context.Context, maxEntries, prefix int) ([]spool.Entry, error)
	Commit(p spool.Position) error
}

// gapPrefixBytes is how much of each spooled batch the tracker reads: its
// metadata comes first (a batch with longer metadata is not tracked).
const gapPrefixBytes = 16 << 10

// Run observes every spooled batch from r until ctx ends, sweeping for gaps
// and saving its state (then committing r) every interval. It returns nil
// when ctx ends, after a last save.
func (g *GapTracker) Run(ctx context.Context, r SpoolReader, interval time.Duration) error {
	entries := make(chan []spool.Entry)
	readErr := make(chan error, 1)
	readCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		readSpoolPrefixes(readCtx, r, entries, readErr)
	}()
	defer func() { cancel(); wg.Wait() }()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var last *spool.Position // after the last entry observed, until committed
	for {
		select {
		case es := <-entries:
			if p := g.observeEntries(es); p != nil {
				last = p
			}
		case <-tick.C:
			var err error
			if last, err = g.persist(r, last); err != nil {
				g.log.Error("rtld: saving gap state", "err", err)
			}
		case err := <-readErr:
			if ctx.Err() != nil || errors.Is(err, spool.ErrClosed) {
				if _, perr := g.persist(r, last); perr != nil {
					g.log.Error("rtld: saving gap state", "err", perr)
				}
				return nil
			}
			return fmt.Errorf("gap tracker reading the spool: %w", err)
		}
	}
}

// readSpoolPrefixes sends the entries of r, in slices, to entries until
// reading fails or ctx ends, and then sends the error to readErr.
func readSpoolPrefixes(ctx context.Context, r SpoolReader, entries chan<- []spool.Entry, readErr chan<- error) {
	for {
		// The tracker needs only each entry's metadata, at its start.
		e, err := r.NextPrefixes(ctx, 1024, gapPrefixBytes)
		if err != nil {
			readErr <- err
			return
		}
		select {
		case entries <- e:
		case <-ctx.Done():
			readErr <- ctx.Err()
			return
		}
	}
}

// observeEntries observes the batches of the spool entries es not in the
// state yet and returns the position after the last of them (nil: none).
func (g *GapTracker) observeEntries(es []spool.Entry) *spool.Position {
	now := time.Now()
	var last *spool.Position
	for _, e := range es {
		if g.hasRead(e.Index) {
			continue // already in the saved state (a crash between save and commit)
		}
		if b, err := accesslog.UnmarshalHeader(e.Data); err == nil {
			g.observe(b, now)
		} else {
			g.log.Error("rtld: unreadable spool entry", "index", e.Index, "err", err)
		}
		g.advance(e.Index + 1)
		p := e.Next
		last = &p
	}
	return last
}

// hasRead reports whether the tracker read the spool entry index already.
func (g *GapTracker) hasRead(index uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return index < g.next
}

// persist sweeps for gaps, saves the state and then commits r up to last
// (when set). It returns the position still to commit: nil once committed,
// last when saving or committing failed.
func (g *GapTracker) persist(r SpoolReader, last *spool.Position) (*spool.Position, error) {
	g.sweep(time.Now())
	if err := g.save(); err != nil {
		return last, err
	}
	if last == nil {
		return nil, nil
	}
	if err := r.Commit(*last); err != nil {
		return last, fmt.Errorf("committing gap tracker position: %w", err)
	}
	return nil, nil
}
