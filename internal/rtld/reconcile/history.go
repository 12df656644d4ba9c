package reconcile

import (
	"slices"
	"time"
)

// ProfileState is what the reconciliation needs to know of an environment's
// profile: whether it delivers here, and with which share of the requests.
type ProfileState struct {
	// Delivering is set when the receiver's profile exists, is enabled and
	// posts to this receiver.
	Delivering bool `json:"delivering"`
	// Percent is its downsampling_percent, 100 when it has none.
	Percent float64 `json:"percent"`
	// Filtered is set when it has filters: they drop records the Metrics
	// API counts (the registrar removes them as drift).
	Filtered bool `json:"filtered,omitempty"`
}

// Share returns the sampling share, Percent/100.
func (s ProfileState) Share() float64 { return s.Percent / 100 }

// segment is a stretch of time over which the profile was seen in one
// state: it held at every moment in [From, To] (Unix seconds). From is no
// earlier than the first check that found the state (so the change to it
// happened before), To no later than the last one.
type segment struct {
	State ProfileState `json:"state"`
	From  int64        `json:"from"`
	To    int64        `json:"to"`
}

// history is an environment's profile as the receiver saw it, segments in
// time order, one per change. It assumes what two checks in a row both
// found held in between: a profile changed and changed back between two
// checks goes unnoticed (see docs/operations.md, Known limits).
type history []segment

// observe records a check that found state s at a moment between lo and
// hi (platform time; lo zero when unknown).
func (h *history) observe(s ProfileState, lo, hi time.Time) {
	var loS int64
	if !lo.IsZero() {
		loS = lo.Unix()
	}
	if n := len(*h); n > 0 && (*h)[n-1].State == s {
		last := &(*h)[n-1]
		last.To = max(last.To, loS)
		return
	}
	from := hi.Unix()
	if hi.After(time.Unix(from, 0)) {
		from++ // no earlier than hi
	}
	*h = append(*h, segment{State: s, From: from, To: loS})
}

// verdict is what the history says about a bucket.
type verdict struct {
	// wait: the profile has not been seen since the bucket ended.
	wait bool
	// reason, when not empty, is why the bucket cannot be compared.
	reason string
	// state is the profile's state through the bucket when it can be.
	state ProfileState
}

// Reasons a bucket is not compared (edgepipe_rtld_reconcile_skipped_buckets_total).
const (
	// ReasonForbidden: the API client lacks the app.metrics scope.
	ReasonForbidden = "forbidden"
	// ReasonAPIError: the Metrics API did not answer for GiveUpAfter.
	ReasonAPIError = "api_error"
	// ReasonCountsLost: the receiver's record counts for the bucket were
	// lost (its state file damaged or gone while the spool was not, or
	// spooled batches damaged on disk).
	ReasonCountsLost = "counts_lost"
	// ReasonProfileUnknown: the receiver did not see the profile before the
	// bucket began (its first check came later) or since it ended (checks
	// failing for GiveUpAfter).
	ReasonProfileUnknown = "profile_unknown"
	// ReasonProfileChanged: the profile was created, enabled, disabled,
	// pointed here or filtered within the bucket: the logs cover part of it.
	ReasonProfileChanged = "profile_changed"
	// ReasonSamplingChanged: downsampling_percent changed within the bucket.
	ReasonSamplingChanged = "sampling_changed"
	// ReasonProfileDisabled: no enabled profile delivered here through the
	// bucket.
	ReasonProfileDisabled = "profile_disabled"
	// ReasonProfileFiltered: the profile had filters through the bucket.
	ReasonProfileFiltered = "profile_filtered"
	// ReasonReplicaBehind: a receiver replica had not delivered its records
	// to ClickHouse for GiveUpAfter (ClickHouse counts).
	ReasonReplicaBehind = "replica_behind"
	// ReasonClickHouseError: counting in ClickHouse failed for GiveUpAfter.
	ReasonClickHouseError = "clickhouse_error"
)

// Reasons lists every reason, for the metric's label values.
var Reasons = []string{ReasonForbidden, ReasonAPIError, ReasonCountsLost, ReasonProfileUnknown, ReasonProfileChanged,
	ReasonSamplingChanged, ReasonProfileDisabled, ReasonProfileFiltered, ReasonReplicaBehind, ReasonClickHouseError}

// coverage says whether the profile held one state through [b, e).
func (h history) coverage(b, e time.Time) verdict {
	bs, es := b.Unix(), e.Unix()
	if h.seenUntil() < es {
		return verdict{wait: true, reason: ReasonProfileUnknown}
	}
	for _, s := range h {
		if s.From <= bs && s.To >= es {
			return s.State.verdict()
		}
	}
	// Not covered: the states around and within the bucket tell why.
	states := h.statesAround(bs, es)
	switch {
	case len(states) < 2:
		return verdict{reason: ReasonProfileUnknown}
	case onlySampling(states):
		return verdict{reason: ReasonSamplingChanged}
	}
	return verdict{reason: ReasonProfileChanged}
}

// seenUntil returns the latest moment (Unix seconds) the profile is known
// at, -1 when never.
func (h history) seenUntil() int64 {
	latest := int64(-1)
	for _, s := range h {
		latest = max(latest, s.To)
	}
	return latest
}

// verdict is the verdict on a bucket through which the profile held state s.
func (s ProfileState) verdict() verdict {
	switch {
	case !s.Delivering:
		return verdict{reason: ReasonProfileDisabled}
	case s.Filtered:
		return verdict{reason: ReasonProfileFiltered}
	}
	return verdict{state: s}
}

// statesAround returns the distinct states of the segments that overlap
// [bs, es] (Unix seconds), of the last to begin by bs and of the first to
// last until es, in that order.
func (h history) statesAround(bs, es int64) []ProfileState {
	var states []ProfileState
	add := func(s ProfileState) {
		if !slices.Contains(states, s) {
			states = append(states, s)
		}
	}
	before, after := -1, -1
	for i, s := range h {
		if s.From <= bs {
			before = i
		}
		if after < 0 && s.To >= es {
			after = i
		}
		if s.From <= es && s.To >= bs {
			add(s.State)
		}
	}
	if before >= 0 {
		add(h[before].State)
	}
	if after >= 0 {
		add(h[after].State)
	}
	return states
}

// onlySampling reports whether states differ in their share alone.
func onlySampling(states []ProfileState) bool {
	for _, s := range states {
		if !s.Delivering || s.Filtered != states[0].Filtered {
			return false
		}
	}
	return true
}

// first returns when the profile was first seen, and false when never.
func (h history) first() (time.Time, bool) {
	if len(h) == 0 {
		return time.Time{}, false
	}
	return time.Unix(h[0].From, 0), true
}

// prune forgets the segments that ended before cutoff, keeping the last.
func (h *history) prune(cutoff time.Time) {
	c := cutoff.Unix()
	i := 0
	for i < len(*h)-1 && (*h)[i].To < c && (*h)[i+1].From <= c {
		i++
	}
	*h = (*h)[i:]
}
