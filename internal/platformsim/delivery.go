package platformsim

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"
)

// DeliveryConfig configures the simulator's RTLD delivery engine, which
// POSTs log batches to every enabled http_post profile as the platform does.
// The records are the requests of the traffic model (logmodel.go): those the
// Metrics API counts. The zero value delivers nothing on its own (Live
// false) but serves DeliverRecords with the defaults below.
type DeliveryConfig struct {
	// Live delivers every enabled profile's records as the simulated clock
	// passes their timestamps: from the moment the profile is created or
	// enabled, every request of its environment (downsampled as the profile
	// says, through its filters). Without it records are delivered only when
	// DeliverRecords is called.
	Live bool
	// BatchSize is the most records in one batch (default DefaultBatchSize).
	BatchSize int
	// FlushInterval is how long live records wait for a full batch before a
	// partial one is sent (default DefaultFlushInterval).
	FlushInterval time.Duration
	// AgentsPerEnvironment is the number of edge agents sending each
	// environment's batches, each with its own seq_num (default
	// DefaultAgentsPerEnvironment).
	AgentsPerEnvironment int
	// RetryInterval is the wait before a batch whose POST failed (non-2xx,
	// network error, lost acknowledgement) is sent again, byte for byte
	// (default DefaultRetryInterval; tests use a few milliseconds).
	RetryInterval time.Duration
	// Retention is how long an undeliverable batch is retried before it is
	// dropped, measured on the simulated clock (default
	// DefaultDeliveryRetention, as the platform).
	Retention time.Duration
	// RequestTimeout bounds one POST (default DefaultRequestTimeout).
	RequestTimeout time.Duration
	// TLSConfig is the client TLS configuration for destination endpoints,
	// for example RootCAs holding a receiver's self-signed certificate. Nil
	// means the system roots.
	TLSConfig *tls.Config
	// DevInsecureSkipVerify accepts any server certificate. For local demos
	// only; prefer TLSConfig with RootCAs.
	DevInsecureSkipVerify bool
	// Transport, when set, replaces the engine's HTTP transport (TLSConfig
	// and DevInsecureSkipVerify are then ignored).
	Transport http.RoundTripper
	// MaxTrackedUUIDs bounds how many generated record UUIDs GeneratedUUIDs
	// keeps (default DefaultMaxTrackedUUIDs, about 60 MB); records beyond
	// it are counted in DeliveryStats.UntrackedRecords. Negative keeps
	// none.
	MaxTrackedUUIDs int
	// Faults injected into deliveries from the start; see SetDeliveryFaults.
	Faults DeliveryFaults
	// Logger receives delivery failures and drops (default: discard).
	Logger *slog.Logger
}

// Defaults of DeliveryConfig.
const (
	DefaultBatchSize            = 500
	DefaultFlushInterval        = time.Second
	DefaultAgentsPerEnvironment = 3
	DefaultRetryInterval        = 10 * time.Second
	DefaultDeliveryRetention    = 72 * time.Hour
	DefaultRequestTimeout       = 30 * time.Second
	DefaultMaxTrackedUUIDs      = 1_000_000
)

// withDefaults returns c with every unset field set to its default.
func (c DeliveryConfig) withDefaults() DeliveryConfig {
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = DefaultFlushInterval
	}
	if c.AgentsPerEnvironment == 0 {
		c.AgentsPerEnvironment = DefaultAgentsPerEnvironment
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = DefaultRetryInterval
	}
	if c.Retention == 0 {
		c.Retention = DefaultDeliveryRetention
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.MaxTrackedUUIDs == 0 {
		c.MaxTrackedUUIDs = DefaultMaxTrackedUUIDs
	}
	return c
}

// validate reports every setting of c (with defaults applied) that cannot
// work.
func (c DeliveryConfig) validate() error {
	var errs []error
	if c.BatchSize < 0 || c.AgentsPerEnvironment < 0 {
		errs = append(errs, fmt.Errorf("BatchSize %d and AgentsPerEnvironment %d: must be positive", c.BatchSize, c.AgentsPerEnvironment))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"FlushInterval", c.FlushInterval}, {"RetryInterval", c.RetryInterval}, {"Retention", c.Retention}, {"RequestTimeout", c.RequestTimeout}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %s: must be positive", d.name, d.v))
		}
	}
	if err := c.Faults.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// DeliveryFaults make the engine misbehave the way a real network and a
// real platform do.
type DeliveryFaults struct {
	// DropAckPercent (0 to 100) is the share of 2xx answers the engine
	// treats as lost: the receiver has the batch, yet the engine sends the
	// same bytes again after RetryInterval, so the receiver sees a duplicate.
	DropAckPercent float64
	// Environments holds the faults of single environments' log streams,
	// by environment ID.
	Environments map[string]EnvironmentFaults
}

// EnvironmentFaults make the platform lose or delay one environment's logs.
// Which batches and records are dropped is a pure function of the seed and
// their place in the stream.
type EnvironmentFaults struct {
	// DropBatchPercent (0 to 100) is the share of the environment's batches
	// the platform loses after numbering them: they are never sent, so the
	// receiver sees a gap in the agent's seq_num.
	DropBatchPercent float64
	// DropRecordPercent (0 to 100) is the share of the environment's records
	// dropped before they are batched: batches arrive with fewer records and
	// seq_nums without gaps, so only a comparison with the Metrics API
	// notices.
	DropRecordPercent float64
	// Late holds each bucket's records back until Late after the bucket's
	// end, then delivers them together (live delivery; DeliverRecords does
	// not wait).
	Late time.Duration
}

// validate reports every setting of f that cannot work.
func (f DeliveryFaults) validate() error {
	var errs []error
	if p := f.DropAckPercent; !(p >= 0 && p <= 100) {
		errs = append(errs, fmt.Errorf("DropAckPercent %v: want 0 to 100", p))
	}
	for _, env := range slices.Sorted(maps.Keys(f.Environments)) {
		ef := f.Environments[env]
		for _, p := range []struct {
			name string
			v    float64
		}{{"DropBatchPercent", ef.DropBatchPercent}, {"DropRecordPercent", ef.DropRecordPercent}} {
			if !(p.v >= 0 && p.v <= 100) {
				errs = append(errs, fmt.Errorf("environment %s: %s %v: want 0 to 100", env, p.name, p.v))
			}
		}
		if ef.Late < 0 {
			errs = append(errs, fmt.Errorf("environment %s: Late %s: must not be negative", env, ef.Late))
		}
	}
	return errors.Join(errs...)
}

// clone returns a copy of f that shares no map with it.
func (f DeliveryFaults) clone() DeliveryFaults {
	f.Environments = maps.Clone(f.Environments)
	return f
}

// DeliveryStats counts what the delivery engine did since the Server started.
type DeliveryStats struct {
	// RecordsGenerated is the number of records put into batches queued
	// for sending (batches lost by DropBatchPercent are not).
	RecordsGenerated int64
	// RecordsAcknowledged is the number of records in acknowledged batches.
	RecordsAcknowledged int64
	// RecordsDropped is the number of records given up on (retention
	// exceeded, or the profile was deleted or disabled).
	RecordsDropped int64
	// Batches is the number of batches queued for sending.
	Batches int64
	// BatchesAcknowledged is the number of batches a destination accepted
	// (and whose acknowledgement was not dropped by a fault).
	BatchesAcknowledged int64
	// BatchesDropped is the number of batches given up on.
	BatchesDropped int64
	// Attempts is the number of POSTs made.
	Attempts int64
	// Retries is the number of POSTs that resent a batch already sent.
	Retries int64
	// Failures is the number of POSTs that got a non-2xx answer or none.
	Failures int64
	// AcksDropped is the number of 2xx answers discarded by
	// DeliveryFaults.DropAckPercent.
	AcksDropped int64
	// PendingBatches is the number of batches waiting for acknowledgement.
	PendingBatches int64
	// UntrackedRecords is the number of generated records whose UUID
	// GeneratedUUIDs does not hold (beyond DeliveryConfig.MaxTrackedUUIDs).
	UntrackedRecords int64
	// BatchesLost and RecordsLost count the batches (numbered, never sent)
	// and their records that EnvironmentFaults.DropBatchPercent lost.
	BatchesLost, RecordsLost int64
	// RecordsSkipped counts the records EnvironmentFaults.DropRecordPercent
	// dropped before batching.
	RecordsSkipped int64
}

// Settled reports whether every generated record has been acknowledged or
// dropped.
func (st DeliveryStats) Settled() bool {
	return st.PendingBatches == 0 && st.RecordsGenerated == st.RecordsAcknowledged+st.RecordsDropped
}

// deliveryTarget is an enabled http_post profile with what the engine needs
// of its environment.
type deliveryTarget struct {
	profile rtldProfile
	ctx     recordContext
}

// deliveryBatch is a sealed batch: its body never changes between attempts.
type deliveryBatch struct {
	profileID   int64
	agentID     string
	datestamp   string
	seq         int64
	body        []byte
	contentType string
	records     int
	sealed      time.Time // simulated clock
	attempts    int
}

type laneKey struct {
	profileID int64
	agentID   string
}

// lane is the ordered queue of one agent's batches for one profile, drained
// by one sender goroutine.
type lane struct {
	key    laneKey
	mu     sync.Mutex
	queue  []*deliveryBatch
	notify chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

func (l *lane) push(b *deliveryBatch) {
	l.mu.Lock()
	l.queue = append(l.queue, b)
	l.mu.Unlock()
	select {
	case l.notify <- struct{}{}:
	default:
	}
}

func (l *lane) front() *deliveryBatch {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.queue) == 0 {
		return nil
	}
	return l.queue[0]
}

func (l *lane) pop() {
	l.mu.Lock()
	l.queue = l.queue[1:]
	l.mu.Unlock()
}

// profileState is the engine's per-profile state.
type profileState struct {
	mu      sync.Mutex
	next    int                   // round-robin agent index
	seq     map[string]seqCounter // by agent ID
	stream  *logStream            // nil while the profile is not delivered to
	pending []logRecord           // live records not yet batched
	since   time.Time             // when pending got its first record (wall clock)
	shape   recordShape           // of pending
	buckets map[int64]*LogBucket  // by bucket start, Unix seconds
}

type seqCounter struct {
	datestamp string
	next      int64
}

// deliveryEngine sends batches to enabled http_post profiles. Its goroutines
// are owned by the Server (started with spawn, stopped by Close).
type deliveryEngine struct {
	cfg     DeliveryConfig
	now     func() time.Time
	seed    int64
	targets func() []deliveryTarget
	target  func(id int64) (deliveryTarget, bool)
	plan    planner
	spawn   func(func(context.Context)) bool
	client  *http.Client
	log     *slog.Logger
	runID   string

	mu       sync.Mutex
	faults   DeliveryFaults
	faultRNG *mrand.Rand
	stats    DeliveryStats
	uuids    []string
	profiles map[int64]*profileState
	agents   map[string][]string // by environment ID
	lanes    map[laneKey]*lane
}

// planner returns the plan of an environment's bucket for a downsampling
// percent (Server.logPlan); false when the environment is gone.
type planner func(envID string, start time.Time, percent float64) (*bucketPlan, bool)

func newDeliveryEngine(cfg DeliveryConfig, seed int64, now func() time.Time,
	targets func() []deliveryTarget, target func(int64) (deliveryTarget, bool), plan planner,
	spawn func(func(context.Context)) bool) *deliveryEngine {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rt := cfg.Transport
	if rt == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.TLSConfig != nil {
			tc = cfg.TLSConfig.Clone()
		}
		if cfg.DevInsecureSkipVerify {
			tc.InsecureSkipVerify = true // explicitly requested for local demos
		}
		tr.TLSClientConfig = tc
		tr.MaxIdleConnsPerHost = 32
		rt = tr
	}
	var nonce [3]byte
	_, _ = rand.Read(nonce[:])
	return &deliveryEngine{
		cfg:      cfg,
		now:      now,
		seed:     seed,
		targets:  targets,
		target:   target,
		plan:     plan,
		spawn:    spawn,
		client:   &http.Client{Transport: rt, Timeout: cfg.RequestTimeout},
		log:      log,
		runID:    hex.EncodeToString(nonce[:]),
		faults:   cfg.Faults.clone(),
		faultRNG: mrand.New(mrand.NewPCG(uint64(seed), 0xac4)),
		profiles: map[int64]*profileState{},
		agents:   map[string][]string{},
		lanes:    map[laneKey]*lane{},
	}
}

// agentsFor returns the agent IDs of an environment. IDs carry a per-run
// nonce: a restarted simulator starts its seq_nums at 0 again, and fresh
// agent IDs keep its batches from looking like replays of the old ones.
func (e *deliveryEngine) agentsFor(envID string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if a, ok := e.agents[envID]; ok {
		return a
	}
	h := seedHash(e.seed).s("agents").s(envID)
	a := make([]string, e.cfg.AgentsPerEnvironment)
	for i := range a {
		pop := simPops[int(h.i(int64(i)).u()*float64(len(simPops)))].code
		a[i] = fmt.Sprintf("%s-edge%02d-%s%x", pop, i+1, e.runID, i)
	}
	e.agents[envID] = a
	return a
}

func (e *deliveryEngine) state(id int64) *profileState {
	e.mu.Lock()
	defer e.mu.Unlock()
	ps, ok := e.profiles[id]
	if !ok {
		ps = &profileState{seq: map[string]seqCounter{}, buckets: map[int64]*LogBucket{}}
		e.profiles[id] = ps
	}
	return ps
}

// envFaults returns the faults of an environment's stream.
func (e *deliveryEngine) envFaults(envID string) EnvironmentFaults {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.faults.Environments[envID]
}

// run is the engine's control loop: it draws live records, flushes partial
// batches and stops the senders of profiles that are gone.
func (e *deliveryEngine) run(ctx context.Context) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			e.stopLanes(func(laneKey) bool { return true })
			e.client.CloseIdleConnections()
			return
		case t := <-tick.C:
			e.step(ctx, t)
		}
	}
}

// step is one tick of the control loop at wall-clock time wall.
func (e *deliveryEngine) step(ctx context.Context, wall time.Time) {
	targets := e.targets()
	live := map[int64]bool{}
	for _, tg := range targets {
		live[tg.profile.ID] = true
	}
	e.stopLanes(func(k laneKey) bool { return !live[k.profileID] })
	e.forgetStreams(live)
	for _, tg := range targets {
		e.stepProfile(ctx, tg, wall)
	}
}

// forgetStreams ends the streams of profiles that are no longer delivered
// to (deleted, disabled, no longer http_post): their records meanwhile are
// never logged, and a profile enabled again starts from then.
func (e *deliveryEngine) forgetStreams(live map[int64]bool) {
	e.mu.Lock()
	var gone []*profileState
	for id, ps := range e.profiles {
		if !live[id] {
			gone = append(gone, ps)
		}
	}
	e.mu.Unlock()
	for _, ps := range gone {
		ps.mu.Lock()
		ps.stream, ps.pending = nil, nil
		ps.mu.Unlock()
	}
}

// stepProfile draws the profile's records that are due, batches them, and
// flushes a partial batch that waited FlushInterval.
func (e *deliveryEngine) stepProfile(ctx context.Context, tg deliveryTarget, wall time.Time) {
	ps := e.state(tg.profile.ID)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	now := e.now()
	ps.prune(now.Add(-e.cfg.Retention - time.Hour))
	if e.cfg.Live {
		if ps.stream == nil {
			// From the moment the profile was created or enabled.
			ps.stream = newLogStream(tg.profile.UpdatedAt)
		}
		// A bounded draw per tick: a clock that jumps ahead is caught up
		// over several ticks instead of in one long pause.
		reqs, err := e.draw(tg, ps, drawLimit{live: true, now: now, records: 4 * e.cfg.BatchSize, scan: 40 * e.cfg.BatchSize})
		if err != nil {
			e.log.Error("rtld delivery: drawing records failed", "profile_id", tg.profile.ID, "err", err)
		}
		e.batchLive(ctx, tg, ps, reqs, wall)
	}
	if len(ps.pending) > 0 && wall.Sub(ps.since) >= e.cfg.FlushInterval {
		e.flushLocked(ctx, tg, ps)
	}
}

// batchLive adds live records to the pending batch, sealing every full one.
func (e *deliveryEngine) batchLive(ctx context.Context, tg deliveryTarget, ps *profileState, reqs []*logRequest, wall time.Time) {
	if len(reqs) == 0 {
		return
	}
	shape := shapeOf(tg.profile)
	if len(ps.pending) > 0 && !slices.Equal(ps.shape.keys, shape.keys) {
		// The profile's fields or custom headers changed: ship what was
		// made the old way first.
		e.flushLocked(ctx, tg, ps)
	}
	if len(ps.pending) == 0 {
		ps.since = wall
	}
	ps.shape = shape
	for _, r := range reqs {
		ps.pending = append(ps.pending, r.record(shape))
		if len(ps.pending) >= e.cfg.BatchSize {
			e.flushLocked(ctx, tg, ps)
			ps.since = wall
		}
	}
}

// flushLocked seals ps.pending into a batch. ps.mu must be held.
func (e *deliveryEngine) flushLocked(ctx context.Context, tg deliveryTarget, ps *profileState) {
	if len(ps.pending) == 0 {
		return
	}
	recs := ps.pending
	ps.pending = nil
	if err := e.sealLocked(ctx, tg, ps, ps.shape.keys, recs); err != nil {
		e.log.Error("rtld delivery: sealing a batch failed", "profile_id", tg.profile.ID, "err", err)
	}
}

// nextSeq assigns the next agent and its seq_num. ps.mu must be held, which
// keeps each agent's seq_nums in queue order.
func (e *deliveryEngine) nextSeq(tg deliveryTarget, ps *profileState, now time.Time) (agent, day string, seq int64) {
	agents := e.agentsFor(tg.profile.EnvironmentID)
	agent = agents[ps.next%len(agents)]
	ps.next++
	day = now.Format("20060102")
	c := ps.seq[agent]
	if c.datestamp != day {
		c = seqCounter{datestamp: day}
	}
	seq = c.next
	c.next++
	ps.seq[agent] = c
	return agent, day, seq
}

// sealLocked numbers a batch, encodes and queues it, or loses it when the
// environment's DropBatchPercent says so. ps.mu must be held.
func (e *deliveryEngine) sealLocked(ctx context.Context, tg deliveryTarget, ps *profileState, keys []string, recs []logRecord) error {
	now := e.now().UTC()
	agent, day, seq := e.nextSeq(tg, ps, now)
	if e.loseBatch(tg.profile, agent, day, seq) {
		e.mu.Lock()
		e.stats.BatchesLost++
		e.stats.RecordsLost += int64(len(recs))
		e.mu.Unlock()
		ps.count(recs, func(b *LogBucket) *int64 { return &b.Lost })
		e.log.Debug("rtld delivery: batch lost (fault)", "profile_id", tg.profile.ID, "agent_id", agent, "seq_num", seq, "records", len(recs))
		return nil
	}
	body, ctype, err := encodeBatch(tg.profile.Delivery.LogFormat, batchHeader{
		AccountNumber: tg.ctx.accountNumber, AgentID: agent, Datestamp: day,
		ProfileID: tg.profile.ID, SeqNum: seq,
	}, keys, recs)
	if err != nil {
		return err
	}
	b := &deliveryBatch{profileID: tg.profile.ID, agentID: agent, datestamp: day, seq: seq,
		body: body, contentType: ctype, records: len(recs), sealed: now}
	e.mu.Lock()
	e.stats.RecordsGenerated += int64(len(recs))
	e.stats.Batches++
	e.stats.PendingBatches++
	for _, r := range recs {
		if len(e.uuids) < e.cfg.MaxTrackedUUIDs {
			e.uuids = append(e.uuids, r.uuid)
		} else {
			e.stats.UntrackedRecords++
		}
	}
	e.mu.Unlock()
	ps.count(recs, func(b *LogBucket) *int64 { return &b.Queued })
	e.laneFor(ctx, laneKey{tg.profile.ID, agent}).push(b)
	return nil
}

// loseBatch decides whether DropBatchPercent loses a batch, by its
// identity.
func (e *deliveryEngine) loseBatch(p rtldProfile, agent, day string, seq int64) bool {
	pct := e.envFaults(p.EnvironmentID).DropBatchPercent
	return pct > 0 && seedHash(e.seed).s("lose-batch").i(p.ID).s(agent).s(day).i(seq).u()*100 < pct
}

// laneFor returns the lane of key, starting its sender when it is new.
func (e *deliveryEngine) laneFor(_ context.Context, key laneKey) *lane {
	e.mu.Lock()
	l, ok := e.lanes[key]
	if ok {
		e.mu.Unlock()
		return l
	}
	l = &lane{key: key, notify: make(chan struct{}, 1), done: make(chan struct{})}
	e.lanes[key] = l
	e.mu.Unlock()
	started := e.spawn(func(ctx context.Context) {
		ctx, cancel := context.WithCancel(ctx)
		l.mu.Lock()
		l.cancel = cancel
		l.mu.Unlock()
		defer close(l.done)
		defer cancel()
		e.send(ctx, l)
	})
	if !started {
		close(l.done)
	}
	return l
}

// stopLanes stops and forgets the lanes matching drop, counting their
// unacknowledged batches as dropped.
func (e *deliveryEngine) stopLanes(drop func(laneKey) bool) {
	e.mu.Lock()
	var stopped []*lane
	for k, l := range e.lanes {
		if drop(k) {
			stopped = append(stopped, l)
			delete(e.lanes, k)
		}
	}
	e.mu.Unlock()
	for _, l := range stopped {
		l.mu.Lock()
		if l.cancel != nil {
			l.cancel()
		}
		l.mu.Unlock()
	}
	for _, l := range stopped {
		// The sender may not have set cancel yet: keep cancelling until done.
		for {
			select {
			case <-l.done:
			case <-time.After(10 * time.Millisecond):
				l.mu.Lock()
				if l.cancel != nil {
					l.cancel()
				}
				l.mu.Unlock()
				continue
			}
			break
		}
		l.mu.Lock()
		q := l.queue
		l.queue = nil
		l.mu.Unlock()
		if len(q) == 0 {
			continue
		}
		e.mu.Lock()
		for _, b := range q {
			e.stats.BatchesDropped++
			e.stats.RecordsDropped += int64(b.records)
			e.stats.PendingBatches--
		}
		e.mu.Unlock()
	}
}

// send drains a lane in order: each batch is POSTed until it is
// acknowledged or older than the retention.
func (e *deliveryEngine) send(ctx context.Context, l *lane) {
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	for {
		b := l.front()
		if b == nil {
			select {
			case <-ctx.Done():
				return
			case <-l.notify:
				continue
			}
		}
		if age := e.now().Sub(b.sealed); age > e.cfg.Retention {
			l.pop()
			e.mu.Lock()
			e.stats.BatchesDropped++
			e.stats.RecordsDropped += int64(b.records)
			e.stats.PendingBatches--
			e.mu.Unlock()
			e.log.Warn("rtld delivery: batch dropped after retention", "profile_id", b.profileID,
				"agent_id", b.agentID, "seq_num", b.seq, "records", b.records, "age", age)
			continue
		}
		if tg, ok := e.target(b.profileID); ok && e.post(ctx, tg, b) {
			l.pop()
			continue
		}
		if ctx.Err() != nil {
			return
		}
		timer.Reset(e.cfg.RetryInterval)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
	}
}

// post sends b once and reports whether it is acknowledged. The destination
// and credentials are read from the profile at each attempt, so a repaired
// profile takes effect on the next retry; the body never changes.
func (e *deliveryEngine) post(ctx context.Context, tg deliveryTarget, b *deliveryBatch) bool {
	b.attempts++
	e.mu.Lock()
	e.stats.Attempts++
	if b.attempts > 1 {
		e.stats.Retries++
	}
	e.mu.Unlock()
	err := e.do(ctx, tg, b)
	if err == nil {
		e.mu.Lock()
		drop := e.faults.DropAckPercent > 0 && e.faultRNG.Float64()*100 < e.faults.DropAckPercent
		if drop {
			e.stats.AcksDropped++
		} else {
			e.stats.BatchesAcknowledged++
			e.stats.RecordsAcknowledged += int64(b.records)
			e.stats.PendingBatches--
		}
		e.mu.Unlock()
		return !drop
	}
	if ctx.Err() != nil {
		return false
	}
	e.mu.Lock()
	e.stats.Failures++
	e.mu.Unlock()
	// Say so on the first failure of a batch and then every 20th attempt,
	// so a wrong password or an unreachable receiver shows in the log
	// without one line per retry.
	level := slog.LevelDebug
	if b.attempts == 1 || b.attempts%20 == 0 {
		level = slog.LevelWarn
	}
	e.log.Log(ctx, level, "rtld delivery: attempt failed, will retry", "profile_id", b.profileID, "agent_id", b.agentID,
		"seq_num", b.seq, "attempt", b.attempts, "retry_in", e.cfg.RetryInterval,
		"destination", tg.profile.Delivery.DestinationEndpoint, "err", err)
	return false
}

func (e *deliveryEngine) do(ctx context.Context, tg deliveryTarget, b *deliveryBatch) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tg.profile.Delivery.DestinationEndpoint, nil)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	body := b.body
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Type", b.contentType)
	req.Header.Set("Content-Encoding", "gzip")
	req.Header.Set("User-Agent", "edgepipe-platform-sim/rtld")
	switch d := tg.profile.Delivery; d.AuthType {
	case authHTTPBasic:
		req.SetBasicAuth(d.Username, d.Password)
	case authCustomAuthentication:
		req.Header.Set("Authorization", d.Token)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return fmt.Errorf("post batch: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("post batch: %w", &deliveryStatusError{status: resp.StatusCode})
	}
	return nil
}

type deliveryStatusError struct{ status int }

func (e *deliveryStatusError) Error() string { return fmt.Sprintf("destination answered %d", e.status) }

// deliverRecords seals the next n records of the profile's stream into
// batches of BatchSize and queues them, whatever the clock. Without live
// delivery the stream first moves on to the present.
func (e *deliveryEngine) deliverRecords(ctx context.Context, tg deliveryTarget, n int) error {
	ps := e.state(tg.profile.ID)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	now := e.now()
	if ps.stream == nil {
		ps.stream = newLogStream(tg.profile.UpdatedAt)
	}
	if !e.cfg.Live {
		ps.skipTo(now)
	}
	shape := shapeOf(tg.profile)
	for n > 0 {
		k := min(n, e.cfg.BatchSize)
		reqs, err := e.draw(tg, ps, drawLimit{records: k, scan: maxDrawScan, horizon: now.Add(maxDrawAhead)})
		if err != nil {
			return err
		}
		recs := make([]logRecord, len(reqs))
		for i, r := range reqs {
			recs[i] = r.record(shape)
		}
		if err := e.sealLocked(ctx, tg, ps, shape.keys, recs); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

func (e *deliveryEngine) snapshot() DeliveryStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stats
}

func (e *deliveryEngine) generatedUUIDs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.uuids)
}

func (e *deliveryEngine) setFaults(f DeliveryFaults) {
	e.mu.Lock()
	e.faults = f.clone()
	e.mu.Unlock()
}

// errNoTarget is returned by DeliverRecords for a profile that is missing,
// disabled or not http_post.
var errNoTarget = errors.New("no enabled http_post profile with that ID")
