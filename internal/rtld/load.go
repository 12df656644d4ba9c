package rtld

import (
	"math"
	"sync"
	"time"
)

// LoadWindow is the time constant of IngestLoad's average: a change in
// how busy ingest is shows within about this long.
const LoadWindow = 100 * time.Millisecond

// IngestLoad measures how busy ingest is, for the delivery workers, which
// let it go first while it is saturated (delivery.Worker.IngestBusy): an
// exponentially weighted average, with time constant LoadWindow, of
// whether at least one batch is being decompressed, decoded or spooled.
// Its zero value is ready to use; it is safe for concurrent use.
type IngestLoad struct {
	mu     sync.Mutex
	active int       // batches in progress
	last   time.Time // when avg was last brought up to date
	avg    float64
}

// advance brings the average up to now. Callers hold l.mu.
func (l *IngestLoad) advance(now time.Time) {
	dt := now.Sub(l.last)
	if l.last.IsZero() || dt <= 0 {
		if l.last.IsZero() {
			l.last = now
		}
		return
	}
	busy := 0.0
	if l.active > 0 {
		busy = 1
	}
	decay := math.Exp(-float64(dt) / float64(LoadWindow))
	l.avg = l.avg*decay + busy*(1-decay)
	l.last = now
}

// enter counts a batch whose processing starts.
func (l *IngestLoad) enter() {
	l.mu.Lock()
	l.advance(time.Now())
	l.active++
	l.mu.Unlock()
}

// leave counts a batch whose processing ended.
func (l *IngestLoad) leave() {
	l.mu.Lock()
	l.advance(time.Now())
	l.active--
	l.mu.Unlock()
}

// Busy returns the share of the recent past, about the last LoadWindow
// weighted toward now, during which ingest was working on at least one
// batch: 0 when idle, 1 when always busy.
func (l *IngestLoad) Busy() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.advance(time.Now())
	return l.avg
}
