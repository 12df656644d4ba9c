package rtld

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// spoolRecorder keeps the seq_num and record count of every batch it
// is told about.
type spoolRecorder struct {
	mu      sync.Mutex
	batches []string
}

func (o *spoolRecorder) ObserveSpooled(b *accesslog.Batch) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.batches = append(o.batches, fmt.Sprintf("%d:%d", b.SeqNum, len(b.Records)))
}

// TestObserverSeesFreshlySpooledBatchesOnly: the SpoolObserver is told
// about a batch once it is in the spool and only then; never about a
// duplicate acknowledged unstored, nor about a refused batch.
func TestObserverSeesFreshlySpooledBatchesOnly(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   []byte
		full   bool
		status int
		want   string
	}{
		{"accepted", gz(t, fmt.Sprintf(envelopeFmt, 1)), false, 200, "1:2"},
		{"duplicate", gz(t, fmt.Sprintf(envelopeFmt, 9)), false, 200, ""},
		{"malformed", gz(t, `[{"a":1},{"b":}]`), false, 400, ""},
		{"record too large", gz(t, `[{"a":"`+strings.Repeat("x", 600<<10)+`"}]`), false, 413, ""},
		{"spool full", gz(t, fmt.Sprintf(envelopeFmt, 2)), true, 503, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &spoolRecorder{}
			sp := &memSpool{}
			srv, _ := newTestIngest(t, IngestConfig{Observer: obs}, sp, seenSet{"envagent-1202611239": true})
			if tc.full {
				// Full between the early check and the write: the write fails.
				sp.block, sp.entered = make(chan struct{}), make(chan struct{})
				go func() {
					<-sp.entered
					sp.mu.Lock()
					sp.full = true
					sp.mu.Unlock()
					close(sp.block)
				}()
			}
			resp, body := post(t, srv.URL+"/ingest/env", "rtld", "s3cret", tc.body, true)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d (%v), want %d", resp.StatusCode, body, tc.status)
			}
			if got := strings.Join(obs.batches, ","); got != tc.want {
				t.Fatalf("observed %q, want %q", got, tc.want)
			}
		})
	}
}
