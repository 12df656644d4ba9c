package rtld

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/spool"
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

// GapTracker follows seq_num per (environment, profile, agent, datestamp)
// (the platform counts seq_num per profile and agent): it counts
// duplicates and, once a missing seq_num has stayed missing for the grace
// period, a gap (a batch lost upstream). It also answers whether a batch was
// already spooled, so ingest can acknowledge a platform retry without
// storing it again. Run it with Run; it is safe for concurrent use.
type GapTracker struct {
	grace   time.Duration
	path    string
	metrics *Metrics
	log     *slog.Logger

	mu     sync.Mutex
	agents map[agentKey]*agentState
	next   uint64 // spool index after the last observed entry
}

type agentKey struct{ Env, Profile, Agent string }

type agentState struct {
	days map[string]*dayState
}

type dayState struct {
	Max int64 `json:"max"`
	// Floor is the lowest seq_num the state knows about: after a reset
	// (a jump of more than maxJump) nothing below it counts as seen.
	Floor   int64           `json:"floor,omitempty"`
	Missing map[int64]int64 `json:"missing,omitempty"` // seq → unix seconds noticed
	Lost    map[int64]bool  `json:"lost,omitempty"`    // counted as gaps
}

// NewGapTracker returns a tracker that keeps its state in dir and counts a
// missing seq_num as a gap after grace.
func NewGapTracker(dir string, grace time.Duration, m *Metrics, log *slog.Logger) (*GapTracker, error) {
	if log == nil {
		log = slog.Default()
	}
	g := &GapTracker{grace: grace, path: filepath.Join(dir, "gaps.json"), metrics: m, log: log, agents: map[agentKey]*agentState{}}
	if err := g.load(); err != nil {
		return nil, err
	}
	return g, nil
}

type savedState struct {
	Next   uint64       `json:"next_index"`
	Agents []savedAgent `json:"agents"`
}

type savedAgent struct {
	Env     string               `json:"environment_id"`
	Profile string               `json:"profile_id"`
	Agent   string               `json:"agent_id"`
	Days    map[string]*dayState `json:"days"`
}

func (g *GapTracker) load() error {
	data, err := os.ReadFile(g.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading gap state: %w", err)
	}
	var st savedState
	if err := json.Unmarshal(data, &st); err != nil {
		g.log.Warn("rtld: unreadable gap state, starting afresh", "path", g.path, "err", err)
		return nil
	}
	g.next = st.Next
	for _, a := range st.Agents {
		g.agents[agentKey{a.Env, a.Profile, a.Agent}] = &agentState{days: a.Days}
	}
	return nil
}

func (g *GapTracker) save() (uint64, error) {
	g.mu.Lock()
	st := savedState{Next: g.next}
	for k, a := range g.agents {
		st.Agents = append(st.Agents, savedAgent{Env: k.Env, Profile: k.Profile, Agent: k.Agent, Days: a.days})
	}
	sort.Slice(st.Agents, func(i, j int) bool {
		x, y := st.Agents[i], st.Agents[j]
		if x.Env != y.Env {
			return x.Env < y.Env
		}
		if x.Profile != y.Profile {
			return x.Profile < y.Profile
		}
		return x.Agent < y.Agent
	})
	data, err := json.Marshal(st)
	g.mu.Unlock()
	if err != nil {
		return 0, fmt.Errorf("encoding gap state: %w", err)
	}
	tmp := g.path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o640); err != nil {
		return 0, fmt.Errorf("writing gap state: %w", err)
	}
	f, err := os.Open(tmp)
	if err == nil {
		err = f.Sync()
		f.Close()
	}
	if err != nil {
		return 0, fmt.Errorf("syncing gap state: %w", err)
	}
	if err := os.Rename(tmp, g.path); err != nil {
		return 0, fmt.Errorf("replacing gap state: %w", err)
	}
	return st.Next, nil
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
	_, missing := d.Missing[seq]
	return !missing && !d.Lost[seq]
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
	k := agentKey{b.EnvironmentID, b.ProfileID, b.AgentID}
	a := g.agents[k]
	if a == nil {
		a = &agentState{days: map[string]*dayState{}}
		g.agents[k] = a
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
		} else {
			for s := d.Max + 1; s < seq; s++ {
				if d.Missing == nil {
					d.Missing = map[int64]int64{}
				}
				d.Missing[s] = now.Unix()
			}
		}
		d.Max = seq
	case seq < d.Floor:
		// Below a reset: unknown territory, neither a gap nor a duplicate.
	case d.Lost[seq]:
		delete(d.Lost, seq)
		g.metrics.late.WithLabelValues(k.Env, k.Agent).Inc()
	default:
		if _, ok := d.Missing[seq]; ok {
			delete(d.Missing, seq)
		} else {
			g.metrics.duplicates.WithLabelValues(k.Env, k.Agent).Inc()
		}
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

// sweep turns seq_nums missing for longer than the grace period into gaps
// and updates the missing gauge.
func (g *GapTracker) sweep(now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	pending := 0
	cutoff := now.Add(-g.grace).Unix()
	for k, a := range g.agents {
		for _, d := range a.days {
			for seq, since := range d.Missing {
				if since > cutoff {
					pending++
					continue
				}
				delete(d.Missing, seq)
				if d.Lost == nil {
					d.Lost = map[int64]bool{}
				}
				d.Lost[seq] = true
				g.metrics.gaps.WithLabelValues(k.Env, k.Agent).Inc()
			}
		}
	}
	g.metrics.missing.Set(float64(pending))
}

// SpoolReader is what the gap tracker needs from its spool cursor.
type SpoolReader interface {
	Next(ctx context.Context, maxEntries int, maxBytes int64) ([]spool.Entry, error)
	Commit(p spool.Position) error
}

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
		for {
			e, err := r.Next(readCtx, 1024, 64<<20)
			if err != nil {
				readErr <- err
				return
			}
			select {
			case entries <- e:
			case <-readCtx.Done():
				readErr <- readCtx.Err()
				return
			}
		}
	}()
	defer func() { cancel(); wg.Wait() }()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var last *spool.Position
	persist := func() error {
		g.sweep(time.Now())
		if _, err := g.save(); err != nil {
			return err
		}
		if last != nil {
			if err := r.Commit(*last); err != nil {
				return fmt.Errorf("committing gap tracker position: %w", err)
			}
			last = nil
		}
		return nil
	}
	for {
		select {
		case es := <-entries:
			now := time.Now()
			for _, e := range es {
				g.mu.Lock()
				skip := e.Index < g.next
				g.mu.Unlock()
				if skip {
					continue // already in the saved state (a crash between save and commit)
				}
				if b, err := accesslog.UnmarshalHeader(e.Data); err == nil {
					g.observe(b, now)
				} else {
					g.log.Error("rtld: unreadable spool entry", "index", e.Index, "err", err)
				}
				g.mu.Lock()
				g.next = e.Index + 1
				g.mu.Unlock()
				p := e.Next
				last = &p
			}
		case <-tick.C:
			if err := persist(); err != nil {
				g.log.Error("rtld: saving gap state", "err", err)
			}
		case err := <-readErr:
			if ctx.Err() != nil || errors.Is(err, spool.ErrClosed) {
				if perr := persist(); perr != nil {
					g.log.Error("rtld: saving gap state", "err", perr)
				}
				return nil
			}
			return fmt.Errorf("gap tracker reading the spool: %w", err)
		}
	}
}
