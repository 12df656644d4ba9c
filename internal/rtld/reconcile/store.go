package reconcile

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/statefile"
)

// StateFile is the reconciliation's state in the spool directory.
const StateFile = "reconcile.state"

// keepBuckets is how long a bucket's counts and decision are kept after it
// began: records that arrive later for a compared bucket are added to it
// (late delivery) within that time.
const keepBuckets = 24 * time.Hour

// keepDays and forgetAgents bound the batches remembered per agent: the
// platform keeps undeliverable batches for 3 days, seq_num restarts daily.
const (
	keepDays     = 4
	forgetAgents = 4 * 24 * time.Hour
)

// Decisions about a bucket.
const (
	pending  = 0
	compared = 1
	skipped  = 2
)

// bucketState is one environment's FIVE_MINUTES bucket.
type bucketState struct {
	// Records counts the accepted records whose timestamp falls in the
	// bucket, each batch once (spool counts).
	Records int64
	// Decision is pending, compared or skipped.
	Decision uint8
	// Expected is the records the Metrics API's count implies (compared).
	Expected int64
	// Share is the sampling share the bucket was compared with.
	Share float64
	// Published is the records reported so far (compared): the counters
	// and the table have it; Records beyond it are late arrivals to add.
	Published int64
	// Stored is set once the table holds the bucket's row as published;
	// At is the reconciled_at of the last row written (Unix seconds), the
	// row's version.
	Stored bool
	At     int64
}

// envState is one environment's state.
type envState struct {
	// watermark is the start of the next bucket to decide (Unix seconds),
	// 0 until the profile was first seen.
	watermark int64
	buckets   map[int64]*bucketState
	history   history
}

// agentKey names an agent's batch sequence: seq_num counts per profile
// and agent, and restarts each day.
type agentKey struct{ Env, Profile, Agent string }

type agentBatches struct {
	lastSeen int64 // Unix seconds, to the hour
	days     map[string]*seqSet
}

// store is the reconciliation's state, persisted in StateFile: per
// environment the records counted per bucket, the decisions and the
// profile's history, the batches counted (so a batch spooled twice counts
// once), the spool index counted up to, and since when counts are lost.
// Counts and the index are written together and the spool reader commits
// only what a written state covers, so after any crash every spooled batch
// is counted exactly once. It is safe for concurrent use.
type store struct {
	path string

	mu         sync.Mutex
	envs       map[string]*envState
	agents     map[agentKey]*agentBatches
	next       uint64 // spool index after the last entry counted
	lostBefore int64  // buckets starting before it lost counts (Unix seconds)
	untimed    int64  // records without a usable timestamp, since start

	saveMu sync.Mutex // one write at a time
	file   *statefile.File
}

// openStore opens the state in dir for envs. A state file that existed
// but cannot be read (both slots damaged, or undecodable) means the counts
// of every bucket so far are lost: lost reports it, and the caller marks
// them so once it knows the platform's time.
func openStore(dir string, envs []string) (s *store, lost bool, err error) {
	path := filepath.Join(dir, StateFile)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, false, fmt.Errorf("reconcile state: %w", err)
	}
	f, data, err := statefile.Open(path, statefile.Options{Capacity: 64 << 10})
	if err != nil {
		return nil, false, fmt.Errorf("opening the reconcile state: %w", err)
	}
	s = &store{path: path, file: f, envs: map[string]*envState{}, agents: map[agentKey]*agentBatches{}}
	for _, e := range envs {
		s.envs[e] = &envState{buckets: map[int64]*bucketState{}}
	}
	if data == nil {
		// Never saved (a replica killed before its first save, or one
		// that does not compare): nothing is lost. Damaged: all of it.
		return s, f.Damaged(), nil
	}
	if err := s.load(data); err != nil {
		s.envs = map[string]*envState{}
		for _, e := range envs {
			s.envs[e] = &envState{buckets: map[int64]*bucketState{}}
		}
		s.agents, s.next = map[agentKey]*agentBatches{}, 0
		return s, true, nil
	}
	return s, false, nil
}

// Close closes the state file.
func (s *store) Close() error { return s.file.Close() }

// savedState is the state file's JSON.
type savedState struct {
	Version    int                  `json:"version"`
	Next       uint64               `json:"next_index"`
	LostBefore int64                `json:"lost_before,omitempty"`
	Envs       map[string]*savedEnv `json:"environments"`
	Agents     []savedAgent         `json:"agents,omitempty"`
}

type savedEnv struct {
	Watermark int64         `json:"watermark,omitempty"`
	Buckets   []savedBucket `json:"buckets,omitempty"`
	Profile   history       `json:"profile,omitempty"`
}

// savedBucket is [start, records, decision, expected, share, published,
// stored (0 or 1), at].
type savedBucket struct {
	Start int64
	bucketState
}

func (b savedBucket) MarshalJSON() ([]byte, error) {
	stored := 0
	if b.Stored {
		stored = 1
	}
	return json.Marshal([]any{b.Start, b.Records, b.Decision, b.Expected, b.Share, b.Published, stored, b.At})
}

func (b *savedBucket) UnmarshalJSON(data []byte) error {
	var v [8]json.Number
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	var stored int64
	ints := []*int64{&b.Start, &b.Records, nil, &b.Expected, nil, &b.Published, &stored, &b.At}
	for i, p := range ints {
		if p == nil {
			continue
		}
		n, err := v[i].Int64()
		if err != nil {
			return fmt.Errorf("bucket field %d: %w", i, err)
		}
		*p = n
	}
	d, err := v[2].Int64()
	if err != nil || d < pending || d > skipped {
		return fmt.Errorf("bucket decision %q", v[2])
	}
	b.Decision = uint8(d)
	if b.Share, err = v[4].Float64(); err != nil {
		return fmt.Errorf("bucket share: %w", err)
	}
	b.Stored = stored == 1
	return nil
}

type savedAgent struct {
	Env      string             `json:"environment_id"`
	Profile  string             `json:"profile_id"`
	Agent    string             `json:"agent_id"`
	LastSeen int64              `json:"last_seen"`
	Days     map[string]*seqSet `json:"days"`
}

const stateVersion = 1

func (s *store) load(data []byte) error {
	var st savedState
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("reconcile state: %w", err)
	}
	if st.Version != stateVersion {
		return fmt.Errorf("reconcile state: version %d, want %d", st.Version, stateVersion)
	}
	s.next, s.lostBefore = st.Next, st.LostBefore
	for id, se := range st.Envs {
		e := s.envs[id]
		if e == nil {
			continue // no longer served
		}
		e.watermark, e.history = se.Watermark, se.Profile
		for _, b := range se.Buckets {
			bs := b.bucketState
			e.buckets[b.Start] = &bs
		}
	}
	for _, a := range st.Agents {
		if _, ok := s.envs[a.Env]; ok {
			s.agents[agentKey{a.Env, a.Profile, a.Agent}] = &agentBatches{lastSeen: a.LastSeen, days: a.Days}
		}
	}
	return nil
}

// save writes the state and returns the spool index it covers.
func (s *store) save() (uint64, error) {
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	s.mu.Lock()
	st := savedState{Version: stateVersion, Next: s.next, LostBefore: s.lostBefore, Envs: map[string]*savedEnv{}}
	for id, e := range s.envs {
		se := &savedEnv{Watermark: e.watermark, Profile: e.history}
		for start, b := range e.buckets {
			se.Buckets = append(se.Buckets, savedBucket{start, *b})
		}
		sort.Slice(se.Buckets, func(i, j int) bool { return se.Buckets[i].Start < se.Buckets[j].Start })
		st.Envs[id] = se
	}
	for k, a := range s.agents {
		st.Agents = append(st.Agents, savedAgent{Env: k.Env, Profile: k.Profile, Agent: k.Agent, LastSeen: a.lastSeen, Days: a.days})
	}
	slices.SortFunc(st.Agents, func(x, y savedAgent) int {
		return cmp.Or(strings.Compare(x.Env, y.Env), strings.Compare(x.Profile, y.Profile), strings.Compare(x.Agent, y.Agent))
	})
	data, err := json.Marshal(st)
	s.mu.Unlock()
	if err != nil {
		return 0, fmt.Errorf("encoding the reconcile state: %w", err)
	}
	if err := s.file.Write(data); err != nil {
		return 0, fmt.Errorf("saving the reconcile state: %w", err)
	}
	return st.Next, nil
}

// markLost marks the counts of every bucket starting before t as lost.
func (s *store) markLost(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lostBefore = max(s.lostBefore, t.Unix())
}

// countBatch counts a spooled batch (the entry at index) unless the batch
// was counted before, and returns the records it counted. Entries below the
// state's index were counted before a crash and are skipped; a jump over
// indexes (entries damaged on disk, skipped by the spool) loses counts.
func (s *store) countBatch(index uint64, b *accesslog.Batch, seen time.Time) (counted int64, gap bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if index < s.next {
		return 0, false
	}
	gap = s.next > 0 && index > s.next
	s.next = index + 1
	e := s.envs[b.EnvironmentID]
	if e == nil {
		return 0, gap
	}
	if b.HasIdentity() && !s.firstTime(b, seen) {
		return 0, gap
	}
	for _, rec := range b.Records {
		sec, ok := recordTime(rec)
		if !ok {
			s.untimed++
			continue
		}
		start := sec - sec%bucketSeconds
		bs := e.buckets[start]
		if bs == nil {
			if start < e.watermark {
				continue // decided and forgotten: too late to count
			}
			bs = &bucketState{}
			e.buckets[start] = bs
		}
		bs.Records++
		counted++
	}
	return counted, gap
}

// skipIndex moves the state's index past an entry that counted nothing.
func (s *store) skipIndex(index uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if index >= s.next {
		s.next = index + 1
	}
}

// firstTime records b's identity and reports whether it is new. s.mu is
// held.
func (s *store) firstTime(b *accesslog.Batch, seen time.Time) bool {
	k := agentKey{b.EnvironmentID, b.ProfileID, b.AgentID}
	a := s.agents[k]
	if a == nil {
		a = &agentBatches{days: map[string]*seqSet{}}
		s.agents[k] = a
	}
	a.lastSeen = max(a.lastSeen, seen.Truncate(time.Hour).Unix())
	d := a.days[b.Datestamp]
	if d == nil {
		d = &seqSet{}
		a.days[b.Datestamp] = d
		if len(a.days) > keepDays {
			days := make([]string, 0, len(a.days))
			for day := range a.days {
				days = append(days, day)
			}
			sort.Strings(days)
			for _, day := range days[:len(days)-keepDays] {
				delete(a.days, day)
			}
		}
	}
	return d.add(b.SeqNum)
}

// bucketSeconds is the width of a FIVE_MINUTES bucket.
const bucketSeconds = 300

// recordTime returns the whole Unix seconds of a record's timestamp field.
func recordTime(rec []byte) (int64, bool) {
	var sec int64
	found := false
	_ = accesslog.EachMember(rec, func(key []byte, escaped bool, value []byte) {
		if found || escaped || string(key) != "timestamp" {
			return
		}
		sec, found = parseSeconds(value)
	})
	return sec, found && sec > 0
}

// observe records a check of env's profile.
func (s *store) observe(env string, st ProfileState, lo, hi time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.envs[env]; e != nil {
		e.history.observe(st, lo, hi)
	}
}

// prune forgets buckets that began before now − keepBuckets, agents
// silent for forgetAgents, and profile history older than the oldest
// bucket kept.
func (s *store) prune(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cutoff := now.Add(-keepBuckets).Unix()
	for _, e := range s.envs {
		for start, b := range e.buckets {
			if start < cutoff && (b.Decision != pending || start < e.watermark) {
				delete(e.buckets, start)
			}
		}
		e.history.prune(time.Unix(min(cutoff, e.watermark), 0))
	}
	forget := now.Add(-forgetAgents).Unix()
	for k, a := range s.agents {
		if a.lastSeen < forget {
			delete(s.agents, k)
		}
	}
}

// parseSeconds reads the whole seconds of a timestamp value: Unix seconds
// with an optional fraction, as a JSON number or string ("1523916295.768957"),
// exactly (the floor, without a float's rounding).
func parseSeconds(v []byte) (int64, bool) {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	s := string(v)
	if strings.ContainsAny(s, "eE") {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || math.Abs(f) > 1<<40 {
			return 0, false
		}
		return int64(math.Floor(f)), true
	}
	whole, frac, _ := strings.Cut(s, ".")
	sec, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || whole == "" || whole[0] == '+' {
		return 0, false
	}
	if strings.HasPrefix(whole, "-") && strings.Trim(frac, "0") != "" {
		sec-- // the floor of a negative time with a fraction
	}
	return sec, true
}
