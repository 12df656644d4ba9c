package rtld

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/rtld/spool"
)

// discardSpool takes every batch and keeps nothing.
type discardSpool struct{}

func (discardSpool) AppendPayload(_ context.Context, p spool.Payload) error {
	_, err := p.WriteTo(io.Discard)
	return err
}

func (discardSpool) Full() bool { return false }

// BenchmarkIngestJSONBatch measures ingest's handling of one json batch of
// 100 records (gzip, about 30 KB decoded), spooled to nowhere: without a
// duplicate check, and with the gap tracker deciding (each batch new). The
// difference is what recognising resends costs on the hot path.
//
//	go test -run '^$' -bench BenchmarkIngestJSONBatch -benchmem ./internal/rtld/
func BenchmarkIngestJSONBatch(b *testing.B) {
	const distinct = 4096
	bodies := make([][]byte, distinct)
	rec := `{"uuid":"%d-%d","status_code":200,"cache_status":"TCP_HIT","pop":"FRA","path":"/a/b/c","user_agent":"` + strings.Repeat("x", 180) + `"}`
	for seq := range bodies {
		recs := make([]string, 100)
		for i := range recs {
			recs[i] = fmt.Sprintf(rec, seq, i)
		}
		bodies[seq] = gz(b, fmt.Sprintf(`{"account_number":"A","agent_id":"agent-1","datestamp":"20261123","platform":"p","profile_id":1,"seq_num":%d,"logs":[%s]}`,
			seq, strings.Join(recs, ",")))
	}
	for _, tc := range []struct {
		name    string
		tracker bool
	}{{"no duplicate check", false}, {"gap tracker", true}} {
		b.Run(tc.name, func(b *testing.B) {
			newHandler := func() http.Handler {
				var dups DuplicateChecker
				if tc.tracker {
					g, err := NewGapTracker(b.TempDir(), time.Minute, NewMetrics(prometheus.NewRegistry()), nil)
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { g.Close() })
					dups = g
				}
				in, err := NewIngest(IngestConfig{Username: "u", Password: "p"}, discardSpool{}, dups, NewMetrics(prometheus.NewRegistry()), nil)
				if err != nil {
					b.Fatal(err)
				}
				r := chi.NewRouter()
				in.Register(r)
				return r
			}
			var h http.Handler
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if i%distinct == 0 {
					// A new tracker, so that every batch is new to it.
					b.StopTimer()
					h = newHandler()
					b.StartTimer()
				}
				req := httptest.NewRequest(http.MethodPost, "/ingest/env", bytes.NewReader(bodies[i%distinct]))
				req.SetBasicAuth("u", "p")
				req.Header.Set("Content-Encoding", "gzip")
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), StatusAccepted) {
					b.Fatalf("batch %d: %d %s", i, w.Code, w.Body)
				}
				i++
			}
		})
	}
}

// BenchmarkGapTrackerClaim measures what recognising resends costs per
// batch, from concurrent requests: Claim and Release as stored on the
// request's side, and the tracker reading the batch (observe) 64 batches
// behind on the tracker's.
//
//	go test -run '^$' -bench BenchmarkGapTrackerClaim -benchmem ./internal/rtld/
func BenchmarkGapTrackerClaim(b *testing.B) {
	g, err := NewGapTracker(b.TempDir(), time.Minute, NewMetrics(prometheus.NewRegistry()), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	ctx := context.Background()
	var agents atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		id := fmt.Sprintf("agent-%d", agents.Add(1))
		var seq int64
		for pb.Next() {
			batch := idBatch(id, "20261123", seq)
			c, err := g.Claim(ctx, batch, time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			c.Release(true)
			if seq >= 64 { // the tracker reads 64 batches behind
				g.observe(idBatch(id, "20261123", seq-64), time.Now())
			}
			seq++
		}
	})
}
