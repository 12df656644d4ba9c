package reconcile

import (
	"testing"
	"time"
)

func TestProgressBehind(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	start := now.Add(-40 * time.Minute) // a bucket 11:20-11:25, due at 11:55
	due := now.Add(-5 * time.Minute)
	for _, tc := range []struct {
		name string
		r    replicaProgress
		want bool // behind
	}{
		{"caught up", replicaProgress{through: now.Add(-2 * time.Second), reported: now}, false},
		{"behind", replicaProgress{through: due.Add(-time.Second), reported: now}, true},
		{"stopped with everything delivered", replicaProgress{through: now.Add(-3 * time.Hour), reported: now.Add(-3 * time.Hour), stopped: true}, false},
		{"stopped within the bucket with records pending", replicaProgress{through: start.Add(-time.Hour), reported: start.Add(time.Minute), stopped: true}, true},
		{"stopped with records pending before the bucket", replicaProgress{through: now.Add(-4 * time.Hour), reported: now.Add(-3 * time.Hour), stopped: true}, false},
		{"silent for long, gone before the bucket began", replicaProgress{through: now.Add(-3 * time.Hour), reported: now.Add(-2 * time.Hour)}, false},
		{"silent for long, gone within the bucket", replicaProgress{through: start, reported: start.Add(time.Minute)}, true},
		{"silent for a short while", replicaProgress{through: due.Add(-time.Minute), reported: now.Add(-2 * time.Minute)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.r.replica = "rx-1"
			got := progressReport{{replica: "rx-0", through: now, reported: now}, tc.r}.behind(start, due, now)
			if (got != "") != tc.want {
				t.Fatalf("behind = %q, want behind %v", got, tc.want)
			}
		})
	}
}
