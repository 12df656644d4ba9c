package rtld

import (
	"math"
	"testing"
	"time"
)

// TestIngestLoad: Busy follows the share of recent time ingest had a
// batch in progress, with time constant LoadWindow.
func TestIngestLoad(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := t0.Add
	var l IngestLoad
	l.advance(at(0))
	l.active = 1 // a batch in progress from t0
	l.advance(at(LoadWindow))
	if want := 1 - math.Exp(-1); math.Abs(l.avg-want) > 1e-9 {
		t.Fatalf("busy for one LoadWindow: avg %v, want %v", l.avg, want)
	}
	l.advance(at(20 * LoadWindow))
	if l.avg < 0.999 {
		t.Fatalf("busy for 20 windows: avg %v, want about 1", l.avg)
	}
	l.active = 0
	before := l.avg
	l.advance(at(21 * LoadWindow))
	if want := before * math.Exp(-1); math.Abs(l.avg-want) > 1e-9 {
		t.Fatalf("idle for one window: avg %v, want %v", l.avg, want)
	}
	l.advance(at(10 * LoadWindow)) // a clock that went back changes nothing
	if want := before * math.Exp(-1); math.Abs(l.avg-want) > 1e-9 {
		t.Fatalf("after a step back in time: avg %v, want %v", l.avg, want)
	}

	var live IngestLoad
	if b := live.Busy(); b != 0 {
		t.Fatalf("zero IngestLoad: Busy %v, want 0", b)
	}
	live.enter()
	live.enter()
	live.leave()
	if live.active != 1 {
		t.Fatalf("two batches entered, one left: active %d, want 1", live.active)
	}
	live.leave()
}
