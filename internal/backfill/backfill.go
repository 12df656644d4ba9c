// Package backfill loads a range of history from the Metrics API into a
// durable sink (ClickHouse) for `exporter backfill`.
//
// The range is split the way the API demands (metricsapi.Plan: at most 20
// environments and at most Granularity.MaxRange of time per request) into
// chunks. Chunks run one after the other: each is fetched, written and
// recorded as done before the next is fetched, so memory holds one
// response at a time and an interrupted run (Ctrl-C, a crash, ClickHouse
// going away) resumes where it stopped when started again with the same
// arguments. Rate limits and 429s are handled by the platform client the
// Fetcher wraps.
package backfill

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/schedule"
)

// Fetcher sends one planned data request; *metricsapi.Client implements it.
// Values that are not values read NaN; the Problems count them and the
// malformed rows left out.
type Fetcher interface {
	Fetch(ctx context.Context, r metricsapi.Request) ([]metricsapi.Row, metricsapi.Problems, error)
}

// Writer stores a batch before returning; *clickhouse.Sink implements it.
type Writer interface {
	Write(ctx context.Context, b *schedule.Batch) (int, error)
}

// Progress remembers which chunks are loaded.
type Progress interface {
	// Completed returns the IDs of the chunks recorded as done.
	Completed(ctx context.Context) (map[string]bool, error)
	// MarkDone records a chunk as done, after its rows are written.
	MarkDone(ctx context.Context, c Chunk, rows int) error
}

// Reporter shows progress; see NewReporter.
type Reporter interface {
	// Start is called once with the number of chunks and how many of them
	// an earlier run already loaded.
	Start(total, already int)
	// Chunk is called after each chunk this run loads.
	Chunk(c Chunk, rows int)
	// Finish is called at the end, with the run's error (nil on success).
	Finish(s Summary, err error)
}

// Chunk is one API request of the backfill.
type Chunk struct {
	// ID names the chunk across runs: a hash of everything that shapes the
	// request (dataset, granularity, range, environments, labels, metrics).
	ID string
	// Dataset is the dataset the request reads.
	Dataset *metricsapi.Dataset
	// Request is the data request itself.
	Request metricsapi.Request
}

// Config configures Run. Datasets, Environments, From, To, Fetcher, Writer
// and Progress are required.
type Config struct {
	// Datasets to load; each is loaded only as far back as its retention
	// for Granularity allows.
	Datasets []metricsapi.Dataset
	// Environments are the environment IDs to load.
	Environments []string
	Granularity  metricsapi.Granularity // default FIVE_MINUTES
	// From is inclusive and To exclusive; both are aligned to Granularity
	// (From down, To up). To is capped at the start of the current bucket.
	From, To time.Time

	// Fetcher sends the data requests.
	Fetcher Fetcher
	// Writer stores the rows of each chunk.
	Writer Writer
	// Progress records loaded chunks, so a later run skips them.
	Progress Progress
	Reporter Reporter     // optional
	Logger   *slog.Logger // default slog.Default()
	// Now is the clock that decides the current bucket (default time.Now).
	Now func() time.Time
	// MaxTries bounds the attempts to write one chunk or record it
	// (default DefaultMaxTries); the Fetcher retries requests itself.
	MaxTries uint
}

// DefaultMaxTries is the default of Config.MaxTries.
const DefaultMaxTries = 5

// withDefaults returns c with every unset field set to its default.
func (c Config) withDefaults() Config {
	if c.Granularity == "" {
		c.Granularity = metricsapi.FiveMinutes
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxTries == 0 {
		c.MaxTries = DefaultMaxTries
	}
	return c
}

// validate reports every setting of c (with defaults applied) that cannot
// make a plan. Run needs Fetcher, Writer and Progress besides.
func (c Config) validate() error {
	var errs []error
	if c.Granularity.Duration() == 0 {
		errs = append(errs, fmt.Errorf("unknown granularity %q", c.Granularity))
	}
	if c.From.IsZero() || c.To.IsZero() || !c.From.Before(c.To) {
		errs = append(errs, fmt.Errorf("need --from before --to (got %s .. %s)", c.From.Format(time.RFC3339), c.To.Format(time.RFC3339)))
	}
	if len(c.Environments) == 0 {
		errs = append(errs, errors.New("no environments"))
	}
	return errors.Join(errs...)
}

// Summary is what a run did.
type Summary struct {
	// Chunks planned, Skipped because an earlier run loaded them, Loaded by
	// this run.
	Chunks, Skipped, Loaded int
	// Rows written by this run.
	Rows int
	// Incomplete counts the chunks this run loaded only in part: their
	// answers held malformed rows, or rows without a value for every
	// count. Their good rows were written but the chunks are not recorded
	// as done, so running again loads them whole once the platform's
	// answers are sound.
	Incomplete int
	// Elapsed is how long the run took.
	Elapsed time.Duration
	// Clamped lists datasets whose range was shortened to their retention.
	Clamped []string
}

// Plan splits the backfill into chunks, in dataset and then time order.
func Plan(cfg Config) ([]Chunk, []string, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, nil, fmt.Errorf("backfill: %w", err)
	}
	g := cfg.Granularity
	t := cfg.Now()
	to := cfg.To
	if cur := g.Truncate(t); to.After(cur) {
		to = cur // the bucket in progress is not final yet
	}
	envs := slices.Clone(cfg.Environments)
	slices.Sort(envs)
	var chunks []Chunk
	var clamped []string
	for i := range cfg.Datasets {
		ds := &cfg.Datasets[i]
		if !ds.Supports(g) {
			continue
		}
		from := cfg.From
		if ret := ds.Retention.For(g); ret > 0 {
			// One bucket of margin keeps the oldest request clear of the
			// retention boundary, which moves while the backfill runs.
			oldest := g.Truncate(t.Add(-ret)).Add(g.Duration())
			if from.Before(oldest) {
				from = oldest
				clamped = append(clamped, ds.Name)
			}
		}
		if !from.Before(to) {
			continue
		}
		labels := []string{}
		for _, l := range ds.Labels() {
			labels = append(labels, l.Name)
		}
		// Windows aligned to multiples of the longest legal range since the
		// Unix epoch (UTC midnights for FIVE_MINUTES), so that a run with a
		// slightly different --from or --to (7d, a minute later) plans the
		// same chunks for the same windows and resumes instead of starting
		// over.
		span := g.MaxRange()
		for ws := from; ws.Before(to); {
			we := time.Unix(0, 0).UTC().Add(ws.Sub(time.Unix(0, 0)).Truncate(span)).Add(span)
			if we.After(to) {
				we = to
			}
			reqs, err := metricsapi.Plan(metricsapi.Query{
				Dataset: ds.Name, Environments: envs, Granularity: g,
				Start: ws, End: we, Labels: labels, Metrics: ds.MetricNames(),
			})
			if err != nil {
				return nil, nil, fmt.Errorf("backfill %s: %w", ds.Name, err)
			}
			for _, r := range reqs {
				chunks = append(chunks, Chunk{ID: chunkID(r), Dataset: ds, Request: r})
			}
			ws = we
		}
	}
	return chunks, clamped, nil
}

func chunkID(r metricsapi.Request) string {
	h := sha256.New()
	envs := slices.Clone(r.Environments)
	slices.Sort(envs)
	fmt.Fprintf(h, "%s\x00%s\x00%d\x00%d\x00%s\x00%s\x00%s",
		r.Dataset, r.Granularity, r.Start.Unix(), r.End.Unix(),
		strings.Join(envs, ","), strings.Join(r.Labels, ","), strings.Join(r.Metrics, ","))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Run loads every chunk not yet recorded as done. On ctx cancellation it
// stops after recording the chunks already written and returns ctx's error;
// running again with the same arguments continues from there.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	start := time.Now()
	cfg = cfg.withDefaults()
	log := cfg.Logger
	if cfg.Fetcher == nil || cfg.Writer == nil || cfg.Progress == nil {
		return Summary{}, errors.New("backfill: Fetcher, Writer and Progress are required")
	}
	chunks, clamped, err := Plan(cfg)
	if err != nil {
		return Summary{}, err
	}
	sum := Summary{Chunks: len(chunks), Clamped: clamped}
	for _, name := range clamped {
		log.Warn("backfill range starts before the dataset's retention; starting at the oldest bucket the API keeps", "dataset", name)
	}
	done, err := cfg.Progress.Completed(ctx)
	if err != nil {
		return sum, fmt.Errorf("backfill: read progress: %w", err)
	}
	for _, c := range chunks {
		if done[c.ID] {
			sum.Skipped++
		}
	}
	if cfg.Reporter != nil {
		cfg.Reporter.Start(len(chunks), sum.Skipped)
	}
	err = func() error {
		for _, c := range chunks {
			if done[c.ID] {
				continue
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			rows, complete, err := loadChunk(ctx, cfg, c, log)
			if err != nil {
				return err
			}
			sum.Loaded++
			sum.Rows += rows
			if !complete {
				sum.Incomplete++
			}
			if cfg.Reporter != nil {
				cfg.Reporter.Chunk(c, rows)
			}
		}
		return nil
	}()
	if err == nil && sum.Incomplete > 0 {
		err = fmt.Errorf("backfill: %d chunks held values that are not numbers or malformed rows; their other rows are loaded, "+
			"run the same command again to load the rest", sum.Incomplete)
	}
	sum.Elapsed = time.Since(start)
	if cfg.Reporter != nil {
		cfg.Reporter.Finish(sum, err)
	}
	return sum, err
}

// loadChunk fetches, writes and records one chunk. A row without a value
// for every count is not written (the table would read 0 there, and replace
// a good row an earlier load wrote); a chunk with such rows, or with
// malformed ones, is written but not recorded as done (complete is false).
func loadChunk(ctx context.Context, cfg Config, c Chunk, log *slog.Logger) (n int, complete bool, err error) {
	r := c.Request
	where := fmt.Sprintf("%s %s..%s (%d environments)", r.Dataset,
		r.Start.UTC().Format(time.RFC3339), r.End.UTC().Format(time.RFC3339), len(r.Environments))
	rows, probs, err := cfg.Fetcher.Fetch(ctx, r)
	if err != nil {
		return 0, false, fmt.Errorf("backfill: fetch %s: %w", where, err)
	}
	isCount := make([]bool, len(r.Metrics))
	for i, m := range r.Metrics {
		isCount[i] = metricsapi.Classify(m).Kind == metricsapi.KindCount
	}
	b := &schedule.Batch{Dataset: c.Dataset, Granularity: r.Granularity, Labels: r.Labels, Metrics: r.Metrics,
		Updates: make([]schedule.Update, 0, len(rows))}
	left := 0
	for i := range rows {
		if !countsComplete(rows[i].Values, isCount) {
			left++
			continue
		}
		b.Updates = append(b.Updates, schedule.Update{Row: rows[i]})
	}
	complete = left == 0 && probs.InvalidRows() == 0
	if !probs.Empty() {
		log.Warn("backfill: the platform sent values that are not numbers or malformed rows",
			"chunk", where, "invalid_values", probs.Values, "value_example", probs.ValueExample,
			"invalid_rows", probs.Rows, "row_example", probs.RowExample, "rows_left_out", left+probs.InvalidRows())
	}
	notify := backoff.WithNotify(func(err error, d time.Duration) {
		log.Warn("backfill: write failed, retrying", "chunk", where, "err", err, "retry_in", d)
	})
	n, err = backoff.Retry(ctx, func() (int, error) { return cfg.Writer.Write(ctx, b) },
		backoff.WithMaxTries(cfg.MaxTries), notify, backoff.WithMaxElapsedTime(5*time.Minute))
	if err != nil {
		return 0, false, fmt.Errorf("backfill: write %s: %w", where, err)
	}
	if !complete {
		return n, false, nil
	}
	_, err = backoff.Retry(ctx, func() (struct{}, error) { return struct{}{}, cfg.Progress.MarkDone(ctx, c, n) },
		backoff.WithMaxTries(cfg.MaxTries), notify, backoff.WithMaxElapsedTime(5*time.Minute))
	if err != nil {
		return 0, false, fmt.Errorf("backfill: record progress of %s: %w", where, err)
	}
	return n, true, nil
}

// countsComplete reports whether vals has a value (not NaN) for every count.
func countsComplete(vals []float64, isCount []bool) bool {
	for i, v := range vals {
		if isCount[i] && math.IsNaN(v) {
			return false
		}
	}
	return true
}
