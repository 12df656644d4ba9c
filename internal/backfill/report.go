package backfill

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// NewReporter returns a Reporter writing to w: a progress bar when w is a
// terminal, plain progress lines (at most one per second, and the last)
// otherwise, so logs of a Job stay readable.
func NewReporter(w io.Writer, terminal bool) Reporter {
	if terminal {
		return &barReporter{w: w}
	}
	return &lineReporter{w: w, every: time.Second}
}

type barReporter struct {
	w   io.Writer
	bar *progressbar.ProgressBar
}

func (r *barReporter) Start(total, already int) {
	r.bar = progressbar.NewOptions(total,
		progressbar.OptionSetWriter(r.w),
		progressbar.OptionSetDescription("backfill"),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionFullWidth(),
		progressbar.OptionShowDescriptionAtLineEnd(),
	)
	if already > 0 {
		_ = r.bar.Set(already)
	}
}

func (r *barReporter) Chunk(c Chunk, _ int) {
	r.bar.Describe(fmt.Sprintf("%s %s", c.Request.Dataset, c.Request.Start.UTC().Format("2006-01-02 15:04")))
	_ = r.bar.Add(1)
}

func (r *barReporter) Finish(s Summary, err error) {
	if err == nil {
		_ = r.bar.Finish()
	}
	fmt.Fprintln(r.w)
	fmt.Fprintln(r.w, summaryLine(s, err))
}

type lineReporter struct {
	w     io.Writer
	every time.Duration

	mu          sync.Mutex
	total, done int
	rows        int
	start, last time.Time
}

func (r *lineReporter) Start(total, already int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total, r.done, r.start = total, already, time.Now()
	fmt.Fprintf(r.w, "backfill: %d chunks (API requests), %d already loaded by an earlier run\n", total, already)
}

func (r *lineReporter) Chunk(c Chunk, rows int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done++
	r.rows += rows
	now := time.Now()
	if now.Sub(r.last) < r.every && r.done < r.total {
		return
	}
	r.last = now
	pct := 100.0
	if r.total > 0 {
		pct = 100 * float64(r.done) / float64(r.total)
	}
	fmt.Fprintf(r.w, "backfill: %d/%d chunks (%.0f%%), %d rows, at %s %s, elapsed %s\n",
		r.done, r.total, pct, r.rows, c.Request.Dataset, c.Request.Start.UTC().Format(time.RFC3339),
		now.Sub(r.start).Round(time.Second))
}

func (r *lineReporter) Finish(s Summary, err error) {
	fmt.Fprintln(r.w, summaryLine(s, err))
}

func summaryLine(s Summary, err error) string {
	status := "done"
	if err != nil {
		status = "stopped (" + err.Error() + "); run the same command again to resume"
	}
	incomplete := ""
	if s.Incomplete > 0 {
		incomplete = fmt.Sprintf(" (%d of them in part)", s.Incomplete)
	}
	return fmt.Sprintf("backfill %s: %d chunks loaded now%s, %d loaded earlier, %d of %d left, %d rows in %s",
		status, s.Loaded, incomplete, s.Skipped, s.Chunks-s.Loaded-s.Skipped, s.Chunks, s.Rows, s.Elapsed.Round(time.Millisecond))
}
