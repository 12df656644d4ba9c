package backfill

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

func TestReporters(t *testing.T) {
	c := Chunk{Request: metricsapi.Request{Dataset: "edge_errors", Start: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}}
	for _, tc := range []struct {
		terminal bool
		err      error
		want     []string
	}{
		{terminal: false, want: []string{"backfill: 4 chunks (API requests), 1 already loaded", "2/4 chunks (50%)", "4/4 chunks (100%)", "backfill done: 3 chunks loaded now, 1 loaded earlier, 0 of 4 left, 30 rows"}},
		{terminal: true, want: []string{"backfill", "4/4", "backfill done"}},
		{terminal: false, err: errors.New("context canceled"), want: []string{"stopped (context canceled); run the same command again to resume"}},
	} {
		var b strings.Builder
		r := NewReporter(&b, tc.terminal)
		r.Start(4, 1)
		for range 3 {
			r.Chunk(c, 10)
		}
		// Lines are throttled to one per second: the first chunk and the
		// last are printed, the one between is not.
		r.Finish(Summary{Chunks: 4, Skipped: 1, Loaded: 3, Rows: 30}, tc.err)
		if !tc.terminal && strings.Contains(b.String(), "3/4 chunks") {
			t.Errorf("line reporter not throttled:\n%s", b.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("terminal=%v: output lacks %q:\n%s", tc.terminal, w, b.String())
			}
		}
	}
}
