package reconcile

import (
	"context"
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platform"
)

// The Metrics API's view of a bucket: requests_edge_total of
// edge_usage_by_country, summed over countries.
const (
	dataset = "edge_usage_by_country"
	metric  = "requests_edge_total"
)

// maxBucketsPerTick bounds the buckets of one environment decided per
// tick (a day's worth): a receiver that was down for long catches up over
// several ticks.
const maxBucketsPerTick = 288

// step is the width of a bucket.
const step = bucketSeconds * time.Second

// planned is one bucket of an environment's plan for a tick: skipped with
// a reason, or to be compared with a profile state.
type planned struct {
	start  int64
	reason string
	state  ProfileState
	// expected and records are filled in for buckets to compare.
	expected, records int64
}

// envPlan is what a tick decides for one environment, in time order.
type envPlan struct {
	env     string
	buckets []planned
}

// cut drops the bucket at i and every later one: it waits for the next
// tick, and so do those after it (an environment is decided in order).
func (p *envPlan) cut(i int) { p.buckets = p.buckets[:i] }

// due returns when the bucket starting at start (Unix seconds) is compared:
// Delay after it ended, and no sooner than Delay after the receiver
// started.
func (r *Reconciler) due(start int64) time.Time {
	end := time.Unix(start, 0).Add(step)
	if r.upSince.After(end) {
		end = r.upSince
	}
	return end.Add(r.cfg.Delay)
}

// tick decides every due bucket it can.
func (r *Reconciler) tick(ctx context.Context, sp Spool, rd SpoolReader) {
	now, ok := r.cfg.Clock.Now()
	if !ok {
		return
	}
	if r.upSince.IsZero() {
		r.upSince = now
		if r.lostAtOpen {
			r.store.markLost(now.Add(loseMargin))
		}
	}
	r.store.prune(now)
	plans := r.plan(now)
	r.fill(ctx, sp, rd, now, plans)
	if r.apply(plans) {
		if _, err := r.store.save(); err != nil {
			r.log.Error("reconcile: saving the decisions", "err", err)
		}
	}
	r.publishLate(ctx, now)
	if r.ch != nil {
		r.storeRows(ctx, now)
	}
}

// plan lists each environment's due buckets up to the first that must
// wait, deciding those the profile's history or lost counts rule out.
func (r *Reconciler) plan(now time.Time) []*envPlan {
	s := r.store
	s.mu.Lock()
	defer s.mu.Unlock()
	var plans []*envPlan
	for _, env := range r.cfg.EnvironmentIDs {
		e := s.envs[env]
		if e.watermark == 0 {
			first, ok := e.history.first()
			if !ok {
				continue
			}
			e.watermark = first.Unix() - first.Unix()%bucketSeconds
		}
		p := &envPlan{env: env}
		for b := e.watermark; len(p.buckets) < maxBucketsPerTick; b += bucketSeconds {
			due := r.due(b)
			if due.After(now) {
				break
			}
			if b < s.lostBefore {
				p.buckets = append(p.buckets, planned{start: b, reason: ReasonCountsLost})
				continue
			}
			v := e.history.coverage(time.Unix(b, 0), time.Unix(b, 0).Add(step))
			if v.wait && now.Before(due.Add(r.cfg.GiveUpAfter)) {
				break
			}
			p.buckets = append(p.buckets, planned{start: b, reason: v.reason, state: v.state})
		}
		if len(p.buckets) > 0 {
			plans = append(plans, p)
		}
	}
	return plans
}

// candidate points at a bucket to compare within the plans.
type candidate struct {
	plan *envPlan
	i    int
}

func (c candidate) bucket() *planned { return &c.plan.buckets[c.i] }

// candidates returns the buckets to compare, in plan order.
func candidates(plans []*envPlan) []candidate {
	var out []candidate
	for _, p := range plans {
		for i := range p.buckets {
			if p.buckets[i].reason == "" {
				out = append(out, candidate{p, i})
			}
		}
	}
	return out
}

// hold makes the buckets to compare for which held is true wait for the
// next tick, each with every later bucket of its environment (decided in
// order); one that has waited GiveUpAfter is skipped with reason instead.
func (r *Reconciler) hold(plans []*envPlan, now time.Time, reason string, held func(env string, start int64) bool) {
	for _, p := range plans {
		for i := 0; i < len(p.buckets); i++ {
			b := &p.buckets[i]
			if b.reason != "" || !held(p.env, b.start) {
				continue
			}
			if now.Before(r.due(b.start).Add(r.cfg.GiveUpAfter)) {
				p.cut(i)
				break
			}
			b.reason = reason
		}
	}
}

// fill finds the Metrics API's count and the records of every bucket to
// compare; those that cannot be had yet wait.
func (r *Reconciler) fill(ctx context.Context, sp Spool, rd SpoolReader, now time.Time, plans []*envPlan) {
	if len(candidates(plans)) == 0 {
		return
	}
	ready, reason := r.countsReady(ctx, sp, rd, now)
	r.hold(plans, now, reason, func(_ string, start int64) bool { return !ready(start, r.due(start)) })
	cands := candidates(plans)
	if len(cands) == 0 {
		return
	}
	api, err := r.fetch(ctx, cands)
	if err != nil {
		r.apiFailed(err, now, plans)
		return
	}
	r.hold(plans, now, ReasonAPIError, func(env string, start int64) bool {
		n, ok := api[env][start]
		return !ok || math.IsNaN(n)
	})
	cands = candidates(plans)
	counts, err := r.records(ctx, cands)
	if err != nil {
		r.log.Warn("reconcile: counting the records in ClickHouse failed; the buckets wait", "err", err)
		r.hold(plans, now, ReasonClickHouseError, func(string, int64) bool { return true })
		return
	}
	for _, c := range candidates(plans) {
		b := c.bucket()
		b.expected = accesslog.SampledCount(int64(api[c.plan.env][b.start]), b.state.Percent)
		b.records = counts[c.plan.env][b.start]
	}
}

// apiFailed holds (or, forbidden, skips) every bucket to compare.
func (r *Reconciler) apiFailed(err error, now time.Time, plans []*envPlan) {
	if isForbidden(err) {
		r.forbiddenSeen(err)
		for _, c := range candidates(plans) {
			c.bucket().reason = ReasonForbidden
		}
		return
	}
	r.log.Warn("reconcile: the Metrics API failed; the due buckets wait", "err", err)
	r.hold(plans, now, ReasonAPIError, func(string, int64) bool { return true })
}

// countsReady returns whether every record of a bucket (start, due) is
// counted, and the reason to skip a bucket with that waited too long.
func (r *Reconciler) countsReady(ctx context.Context, sp Spool, rd SpoolReader, now time.Time) (func(start int64, due time.Time) bool, string) {
	if r.CountsSpool() {
		ok := r.spoolCaughtUp(ctx, sp, rd, 5*time.Second)
		return func(int64, time.Time) bool { return ok }, ReasonCountsLost
	}
	prog, err := r.ch.progress(ctx)
	if err != nil {
		r.log.Warn("reconcile: reading the replicas' delivery progress from ClickHouse failed; the buckets wait", "err", err)
		return func(int64, time.Time) bool { return false }, ReasonClickHouseError
	}
	return func(start int64, due time.Time) bool {
		if who := prog.behind(time.Unix(start, 0), due, now); who != "" {
			r.log.Debug("reconcile: a replica has not delivered every record to ClickHouse yet", "replica", who, "bucket", time.Unix(start, 0).UTC())
			return false
		}
		return true
	}, ReasonReplicaBehind
}

// fetch asks the Metrics API for the candidates' buckets: one query over
// their environments (20 per request) and time range.
func (r *Reconciler) fetch(ctx context.Context, cands []candidate) (map[string]map[int64]float64, error) {
	envs, from, to := extent(cands)
	res, err := r.cfg.Metrics.Data(ctx, metricsapi.Query{
		Dataset: dataset, Environments: envs, Granularity: metricsapi.FiveMinutes,
		Start: time.Unix(from, 0).UTC(), End: time.Unix(to, 0).UTC(),
		Labels: []string{}, Metrics: []string{metric},
	})
	if err != nil {
		return nil, err
	}
	r.forbiddenGone()
	out := map[string]map[int64]float64{}
	for _, env := range envs {
		out[env] = map[int64]float64{}
		for b := from; b < to; b += bucketSeconds {
			out[env][b] = 0 // the API leaves buckets without traffic out
		}
	}
	for _, row := range res.Rows {
		m := out[row.Environment]
		if m == nil || len(row.Values) == 0 {
			continue
		}
		m[row.Time.Unix()] += row.Values[0] // NaN stays NaN: the bucket waits
	}
	return out, nil
}

// records returns the candidates' record counts (ClickHouse counts), or
// nil with spool counts, where apply reads them from the store.
func (r *Reconciler) records(ctx context.Context, cands []candidate) (map[string]map[int64]int64, error) {
	if r.CountsSpool() {
		return nil, nil
	}
	envs, from, to := extent(cands)
	return r.ch.counts(ctx, envs, from, to)
}

// extent returns the environments of the candidates, in order, and the time
// range their buckets cover (Unix seconds, end exclusive).
func extent(cands []candidate) (envs []string, from, to int64) {
	seen := map[string]bool{}
	from = math.MaxInt64
	for _, c := range cands {
		if !seen[c.plan.env] {
			seen[c.plan.env] = true
			envs = append(envs, c.plan.env)
		}
		from, to = min(from, c.bucket().start), max(to, c.bucket().start+bucketSeconds)
	}
	return envs, from, to
}

// apply records the decisions of the plans in the store and the metrics,
// and reports whether there were any.
func (r *Reconciler) apply(plans []*envPlan) bool {
	s := r.store
	s.mu.Lock()
	defer s.mu.Unlock()
	decided := false
	for _, p := range plans {
		e := s.envs[p.env]
		for _, pb := range p.buckets {
			b := e.buckets[pb.start]
			if b == nil {
				b = &bucketState{}
				e.buckets[pb.start] = b
			}
			if pb.reason != "" {
				b.Decision = skipped
				r.metrics.skip(p.env, pb.reason)
			} else {
				if !r.CountsSpool() {
					b.Records = pb.records
				}
				b.Decision, b.Expected, b.Share, b.Published, b.Stored = compared, pb.expected, pb.state.Share(), b.Records, false
				r.metrics.compare(p.env, b.Expected, b.Published)
				if b.Published < b.Expected {
					r.log.Warn("reconcile: fewer log records than the Metrics API's requests", "environment_id", p.env,
						"bucket", time.Unix(pb.start, 0).UTC(), "log_records", b.Published, "api_requests", b.Expected, "sampling", b.Share)
				}
			}
			e.watermark = pb.start + bucketSeconds
			decided = true
		}
	}
	return decided
}

// recountEvery is how often ClickHouse counts of compared buckets are
// taken again for records that arrived after the comparison.
const recountEvery = 30 * time.Minute

// publishLate adds the records counted for compared buckets since they
// were compared (late delivery) to the counters and the table.
func (r *Reconciler) publishLate(ctx context.Context, now time.Time) {
	if !r.CountsSpool() {
		if now.Sub(r.lastRecount) < recountEvery {
			return
		}
		r.lastRecount = now
		if err := r.recount(ctx, now); err != nil {
			r.log.Warn("reconcile: counting late records in ClickHouse failed", "err", err)
			return
		}
	}
	s := r.store
	s.mu.Lock()
	defer s.mu.Unlock()
	for env, e := range s.envs {
		for _, b := range e.buckets {
			if b.Decision == compared && b.Records > b.Published {
				r.metrics.late(env, b.Records-b.Published)
				b.Published, b.Stored = b.Records, false
			}
		}
	}
}

// recount takes the ClickHouse counts of the compared buckets kept again.
func (r *Reconciler) recount(ctx context.Context, now time.Time) error {
	from := now.Add(-keepBuckets).Unix()
	from -= from % bucketSeconds
	counts, err := r.ch.counts(ctx, r.cfg.EnvironmentIDs, from, now.Unix())
	if err != nil {
		return err
	}
	s := r.store
	s.mu.Lock()
	defer s.mu.Unlock()
	for env, e := range s.envs {
		for start, b := range e.buckets {
			if n := counts[env][start]; b.Decision == compared && n > b.Records {
				b.Records = n
			}
		}
	}
	return nil
}

// isForbidden reports whether err is the platform refusing the client's
// scope (the token endpoint's invalid_scope, or the API's 403).
func isForbidden(err error) bool {
	var e *platform.Error
	if !errors.As(err, &e) {
		return false
	}
	return e.Status == http.StatusForbidden || e.Code == "invalid_scope" || e.Code == "insufficient_scope"
}

// forbiddenSeen notes that the API refused the scope, saying so once.
func (r *Reconciler) forbiddenSeen(err error) {
	r.mu.Lock()
	first := !r.forbidden
	r.forbidden = true
	r.mu.Unlock()
	if first {
		r.log.Warn("reconcile: the API client lacks the app.metrics scope: log delivery cannot be checked against the Metrics API, every bucket is skipped with reason=forbidden; ingest is not affected",
			"err", err)
	}
}

// forbiddenGone notes that the API answered.
func (r *Reconciler) forbiddenGone() {
	r.mu.Lock()
	was := r.forbidden
	r.forbidden = false
	r.mu.Unlock()
	if was {
		r.log.Info("reconcile: the Metrics API answers now (app.metrics granted): buckets are compared again")
	}
}
