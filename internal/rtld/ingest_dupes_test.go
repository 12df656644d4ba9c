package rtld

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgepipe/edgepipe/internal/rtld/spool"
)

func newTestTracker(t *testing.T) *GapTracker {
	t.Helper()
	g, err := NewGapTracker(t.TempDir(), time.Minute, NewMetrics(prometheus.NewRegistry()), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// failingSpool fails its first append with spool.ErrFull once hold is
// closed (at once when it is nil), and stores the others.
type failingSpool struct {
	*memSpool
	hold   chan struct{}
	failed atomic.Bool
}

func (f *failingSpool) AppendPayload(ctx context.Context, p spool.Payload) error {
	if f.failed.CompareAndSwap(false, true) {
		if f.hold != nil {
			<-f.hold
		}
		return spool.ErrFull
	}
	return f.memSpool.AppendPayload(ctx, p)
}

// TestIngestStoresEachBatchOnce: copies of one json batch posted at once,
// or one after the other before the gap tracker has read the spool (it
// never runs here: the window a fast resend meets in production), are
// stored once and counted once as accepted; the others are acknowledged as
// duplicates. When the copy being stored fails, a waiting copy stores it.
func TestIngestStoresEachBatchOnce(t *testing.T) {
	const copies = 8
	body := gz(t, fmt.Sprintf(envelopeFmt, 5)) // 2 records
	for _, tc := range []struct {
		name       string
		firstFails bool
		sequential bool
	}{
		{name: "concurrent"},
		{name: "resent after the first answer", sequential: true},
		{name: "concurrent, the first copy fails", firstFails: true},
		{name: "resent after the first copy failed", firstFails: true, sequential: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := &memSpool{}
			var sp Spooler = mem
			fs := &failingSpool{memSpool: mem}
			if tc.firstFails {
				sp = fs
				if !tc.sequential {
					fs.hold = make(chan struct{})
				}
			}
			srv, m := newTestIngest(t, IngestConfig{MaxInFlight: copies}, sp, newTestTracker(t))
			codes := make([]int, copies)
			statuses := make([]string, copies)
			postCopy := func(i int) {
				resp, out := post(t, srv.URL+"/ingest/env", "rtld", "s3cret", body, true)
				codes[i], statuses[i] = resp.StatusCode, fmt.Sprint(out["status"])
			}
			if tc.sequential {
				for i := range copies {
					postCopy(i)
				}
			} else {
				var wg sync.WaitGroup
				for i := range copies {
					wg.Go(func() { postCopy(i) })
				}
				if fs.hold != nil {
					// Fail the first copy once every copy waits for it.
					all := eventually(func() bool { return testutil.ToFloat64(m.inFlight) == copies })
					close(fs.hold)
					if !all {
						wg.Wait()
						t.Fatalf("the copies did not wait for the one being spooled: %d spooled", mem.len())
					}
				}
				wg.Wait()
			}
			var accepted, dups, unavailable int
			for i, code := range codes {
				switch {
				case code == http.StatusOK && statuses[i] == StatusAccepted:
					accepted++
				case code == http.StatusOK && statuses[i] == StatusDuplicate:
					dups++
				case code == http.StatusServiceUnavailable:
					unavailable++
				default:
					t.Fatalf("copy %d: %d %s", i, code, statuses[i])
				}
			}
			wantFailed := 0
			if tc.firstFails {
				wantFailed = 1
			}
			if mem.len() != 1 || accepted != 1 || unavailable != wantFailed || dups != copies-1-wantFailed {
				t.Fatalf("%d copies: %d spooled, %d accepted, %d duplicates, %d unavailable; want 1 spooled and accepted, %d unavailable",
					copies, mem.len(), accepted, dups, unavailable, wantFailed)
			}
			if got := testutil.ToFloat64(m.records.WithLabelValues(StatusAccepted)); got != 2 {
				t.Fatalf("accepted records counted: %v, want 2", got)
			}
			if got := testutil.ToFloat64(m.records.WithLabelValues(StatusDuplicate)); got != float64(2*(copies-1-wantFailed)) {
				t.Fatalf("duplicate records counted: %v", got)
			}
		})
	}
}

// eventually reports whether cond holds within 5 seconds.
func eventually(cond func() bool) bool {
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}
