package reconcile

import (
	"testing"
	"time"
)

func TestHistoryCoverage(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	at := func(m, s int) time.Time { return t0.Add(time.Duration(m)*time.Minute + time.Duration(s)*time.Second) }
	full := ProfileState{Delivering: true, Percent: 100}
	quarter := ProfileState{Delivering: true, Percent: 25}
	absent := ProfileState{Percent: 100}
	filtered := ProfileState{Delivering: true, Percent: 100, Filtered: true}
	type obs struct {
		s      ProfileState
		lo, hi time.Time
	}
	// check observes state s every minute from minute from to minute to.
	checks := func(s ProfileState, from, to int) []obs {
		var out []obs
		for m := from; m <= to; m++ {
			out = append(out, obs{s, at(m, 0), at(m, 1)})
		}
		return out
	}
	cat := func(parts ...[]obs) []obs {
		var out []obs
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	tests := []struct {
		name   string
		obs    []obs
		bucket int // minute the bucket starts at
		want   verdict
	}{
		{"steady", checks(full, 0, 20), 5, verdict{state: full}},
		{"steady, sampled", checks(quarter, 0, 20), 10, verdict{state: quarter}},
		{"not seen since the bucket ended", checks(full, 0, 9), 5, verdict{wait: true, reason: ReasonProfileUnknown}},
		{"first seen within the bucket", checks(full, 7, 20), 5, verdict{reason: ReasonProfileUnknown}},
		{"created within the bucket", cat(checks(absent, 0, 6), []obs{{full, at(6, 30), at(6, 31)}}, checks(full, 7, 20)), 5,
			verdict{reason: ReasonProfileChanged}},
		{"the bucket after the creation", cat(checks(absent, 0, 6), []obs{{full, at(6, 30), at(6, 31)}}, checks(full, 7, 20)), 10,
			verdict{state: full}},
		{"created a second before the bucket", cat(checks(absent, 0, 4), []obs{{full, at(4, 58), at(4, 59)}}, checks(full, 5, 20)), 5,
			verdict{state: full}},
		{"sampling changed within", cat(checks(full, 0, 7), checks(quarter, 8, 20)), 5, verdict{reason: ReasonSamplingChanged}},
		{"sampling changed between two checks around the boundary", cat(checks(full, 0, 9), checks(quarter, 10, 20)), 5,
			verdict{reason: ReasonSamplingChanged}},
		{"the next bucket with the new share", cat(checks(full, 0, 9), checks(quarter, 10, 20)), 10, verdict{reason: ReasonSamplingChanged}},
		{"two buckets on", cat(checks(full, 0, 9), checks(quarter, 10, 20)), 15, verdict{state: quarter}},
		{"disabled throughout", checks(absent, 0, 20), 5, verdict{reason: ReasonProfileDisabled}},
		{"filtered throughout", checks(filtered, 0, 20), 5, verdict{reason: ReasonProfileFiltered}},
		{"filtered for a while", cat(checks(full, 0, 6), checks(filtered, 7, 8), checks(full, 9, 20)), 5, verdict{reason: ReasonProfileChanged}},
		{"disabled and enabled again between checks", cat(checks(full, 0, 6), checks(absent, 7, 7), checks(full, 8, 20)), 5,
			verdict{reason: ReasonProfileChanged}},
		{"a long silence with the same state on both sides", cat(checks(full, 0, 2), checks(full, 40, 41)), 20, verdict{state: full}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h history
			for _, o := range tt.obs {
				h.observe(o.s, o.lo, o.hi)
			}
			got := h.coverage(at(tt.bucket, 0), at(tt.bucket+5, 0))
			if got != tt.want {
				t.Errorf("coverage of the bucket at minute %d = %+v, want %+v (history %+v)", tt.bucket, got, tt.want, h)
			}
		})
	}
}

func TestHistoryObserveWithoutALowerBound(t *testing.T) {
	var h history
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	s := ProfileState{Delivering: true, Percent: 100}
	h.observe(s, time.Time{}, t0)
	if v := h.coverage(t0, t0.Add(5*time.Minute)); !v.wait {
		t.Fatalf("one check without a known time covers %+v", v)
	}
	h.observe(s, t0.Add(6*time.Minute), t0.Add(6*time.Minute+time.Second))
	if v := h.coverage(t0, t0.Add(5*time.Minute)); v.state != s {
		t.Fatalf("coverage after the second check: %+v", v)
	}
	h.prune(t0.Add(time.Hour))
	if len(h) != 1 {
		t.Fatalf("prune left %d segments, want the last one", len(h))
	}
}
