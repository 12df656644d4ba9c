// Package otlptest is an in-process OTLP metrics receiver for tests: a gRPC
// server implementing collector/metrics/v1 MetricsService and an HTTP
// /v1/metrics endpoint, both decoding the real protobuf from
// go.opentelemetry.io/proto/otlp.
package otlptest

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	colmetricspb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Receiver collects every export request it accepts. Set FailNext to make
// the next exports fail (gRPC Unavailable, HTTP 503).
type Receiver struct {
	colmetricspb.UnimplementedMetricsServiceServer

	mu       sync.Mutex
	requests []*colmetricspb.ExportMetricsServiceRequest
	failNext int
	failed   int
	changed  chan struct{}
}

// Point is one decoded data point with its metric's identity.
type Point struct {
	Metric      string
	Unit        string
	Sum         bool // false: gauge
	Monotonic   bool
	Temporality metricspb.AggregationTemporality
	Attributes  map[string]string
	Start, Time uint64 // Unix nanoseconds
	Value       float64
	Resource    map[string]string
}

func newReceiver() *Receiver { return &Receiver{changed: make(chan struct{})} }

// StartGRPC serves a Receiver over gRPC on a loopback port until the test
// ends and returns it with its address (host:port).
func StartGRPC(t testing.TB) (*Receiver, string) {
	t.Helper()
	r := newReceiver()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	colmetricspb.RegisterMetricsServiceServer(srv, r)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil { // nil after Stop
			t.Errorf("otlptest gRPC server: %v", err)
		}
	})
	return r, l.Addr().String()
}

// StartHTTP serves a Receiver over HTTP on a loopback port until the test
// ends and returns it with its base URL (http://host:port).
func StartHTTP(t testing.TB) (*Receiver, string) {
	t.Helper()
	r := newReceiver()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/metrics", r.serveHTTP)
	srv := &http.Server{Handler: mux}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("otlptest HTTP server: %v", err)
		}
	})
	return r, "http://" + l.Addr().String()
}

// FailNext makes the next n exports fail.
func (r *Receiver) FailNext(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failNext = n
}

// Failed returns how many exports were refused by FailNext.
func (r *Receiver) Failed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *Receiver) accept(req *colmetricspb.ExportMetricsServiceRequest) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failNext > 0 {
		r.failNext--
		r.failed++
		return false
	}
	r.requests = append(r.requests, req)
	close(r.changed)
	r.changed = make(chan struct{})
	return true
}

// Export implements the gRPC MetricsService.
func (r *Receiver) Export(_ context.Context, req *colmetricspb.ExportMetricsServiceRequest) (*colmetricspb.ExportMetricsServiceResponse, error) {
	if !r.accept(req) {
		return nil, status.Error(codes.Unavailable, "otlptest: failing on purpose")
	}
	return &colmetricspb.ExportMetricsServiceResponse{}, nil
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	msg := &colmetricspb.ExportMetricsServiceRequest{}
	if err := proto.Unmarshal(b, msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if !r.accept(msg) {
		http.Error(w, "otlptest: failing on purpose", http.StatusServiceUnavailable)
		return
	}
	out, _ := proto.Marshal(&colmetricspb.ExportMetricsServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// Requests returns how many export requests were accepted.
func (r *Receiver) Requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.requests)
}

// WaitPoints waits until at least n points arrived or ctx is done, and
// returns every point received.
func (r *Receiver) WaitPoints(ctx context.Context, n int) []Point {
	for {
		r.mu.Lock()
		pts := r.pointsLocked()
		ch := r.changed
		r.mu.Unlock()
		if len(pts) >= n {
			return pts
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return pts
		}
	}
}

// Points returns every point received so far.
func (r *Receiver) Points() []Point {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pointsLocked()
}

func (r *Receiver) pointsLocked() []Point {
	var out []Point
	for _, req := range r.requests {
		for _, rm := range req.ResourceMetrics {
			res := attrs(rm.GetResource().GetAttributes())
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					base := Point{Metric: m.Name, Unit: m.Unit, Resource: res}
					var dps []*metricspb.NumberDataPoint
					switch d := m.Data.(type) {
					case *metricspb.Metric_Sum:
						base.Sum, base.Monotonic, base.Temporality = true, d.Sum.IsMonotonic, d.Sum.AggregationTemporality
						dps = d.Sum.DataPoints
					case *metricspb.Metric_Gauge:
						dps = d.Gauge.DataPoints
					}
					for _, dp := range dps {
						p := base
						p.Attributes = attrs(dp.Attributes)
						p.Start, p.Time = dp.StartTimeUnixNano, dp.TimeUnixNano
						switch v := dp.Value.(type) {
						case *metricspb.NumberDataPoint_AsDouble:
							p.Value = v.AsDouble
						case *metricspb.NumberDataPoint_AsInt:
							p.Value = float64(v.AsInt)
						}
						out = append(out, p)
					}
				}
			}
		}
	}
	return out
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		out[kv.Key] = kv.GetValue().GetStringValue()
	}
	return out
}
