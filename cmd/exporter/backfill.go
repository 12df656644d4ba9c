package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/model"
	"golang.org/x/term"

	"github.com/edgepipe/edgepipe/internal/backfill"
	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/preflight"
	"github.com/edgepipe/edgepipe/internal/schedule"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/metrictables"
)

// backfillExtension is the `exporter backfill` command: it loads a range of
// history into ClickHouse.
type backfillExtension struct {
	cmd      *kingpin.CmdClause
	ch       *clickhouseFlags
	from, to string
	datasets []string
	fresh    bool
	progress string
}

func newBackfillExtension() extension { return &backfillExtension{} }

func (e *backfillExtension) register(app *kingpin.Application, _ *kingpin.CmdClause) {
	e.cmd = app.Command("backfill", "Load a range of history into ClickHouse (resumable: run the same command again after an interruption).")
	e.ch = addClickHouseFlags(e.cmd, true)
	e.cmd.Flag("from", "Start of the range: RFC 3339 (2026-11-01T00:00:00Z), a date (2026-11-01, UTC) or an age (7d = seven days ago). "+
		"Capped at each dataset's retention.").Required().StringVar(&e.from)
	e.cmd.Flag("to", "End of the range (exclusive), same forms as --from; capped at the current bucket.").Default("now").StringVar(&e.to)
	e.cmd.Flag("dataset", "Dataset to load (repeatable; default: every dataset offering --granularity).").StringsVar(&e.datasets)
	e.cmd.Flag("restart", "Ignore what earlier runs recorded as loaded and load the whole range again.").BoolVar(&e.fresh)
	e.cmd.Flag("progress", "Progress display: auto (a bar on a terminal, lines otherwise), bar, lines or none.").
		Default("auto").EnumVar(&e.progress, "auto", "bar", "lines", "none")
}

func (e *backfillExtension) setup(context.Context, *host) (parts, error) { return parts{}, nil }

func (e *backfillExtension) checks(*host, *checkState) ([]preflight.Check, error) { return nil, nil }

func (e *backfillExtension) command(ctx context.Context, cmd string, h *host) (bool, error) {
	if e.cmd == nil || cmd != e.cmd.FullCommand() {
		return false, nil
	}
	return true, e.run(ctx, h)
}

func (e *backfillExtension) run(ctx context.Context, h *host) error {
	if !e.ch.enabled() {
		return errors.New("backfill: --clickhouse.dsn (or EDGEPIPE_CLICKHOUSE_DSN) is required")
	}
	// --from, --to and the current bucket are read on the platform's
	// clock (the Date of its answers), so a machine whose clock runs ahead
	// does not record buckets the platform has not finished as loaded.
	clock := schedule.NewPlatformClock(nil)
	h.platformClock = clock
	g := h.common.granularity
	if _, _, err := e.span(g, clock.Now()); err != nil {
		return err // before contacting the platform
	}

	cl, err := h.clients(ctx)
	if err != nil {
		return err
	}
	envs, err := h.environments(cl).Environments(ctx)
	if err != nil {
		return fmt.Errorf("backfill: list environments: %w", err)
	}
	dss, err := e.selectDatasets(ctx, h, cl)
	if err != nil {
		return err
	}
	from, to, err := e.span(g, clock.Now())
	if err != nil {
		return err
	}
	if skew, ok := clock.Skew(); ok && skew.Abs() > time.Minute {
		h.log.Warn("the platform's clock and this machine's differ; the backfill follows the platform's", "skew", skew.Round(time.Second))
	}

	sink, err := e.ch.newSink(h, nil)
	if err != nil {
		return err
	}
	defer sink.Close(context.Background())
	progress, err := e.newProgress(ctx, sink)
	if err != nil {
		return err
	}
	h.log.Info("backfill starting", "from", from.Format(time.RFC3339), "to", to.Format(time.RFC3339),
		"granularity", g, "datasets", len(dss), "environments", len(envs), "clickhouse", clickhouse.RedactDSN(e.ch.dsn),
		"restart", e.fresh)
	sum, err := backfill.Run(ctx, backfill.Config{
		Datasets: dss, Environments: envs, Granularity: g, From: from, To: to,
		Fetcher: cl.Metrics, Writer: sink, Progress: progress, Reporter: e.reporter(),
		Logger: h.log.With("component", "backfill"), Now: clock.Now,
	})
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("backfill interrupted after %d of %d chunks; run the same command again to resume", sum.Loaded+sum.Skipped, sum.Chunks)
		}
		return err
	}
	h.log.Info("backfill finished", "chunks", sum.Chunks, "loaded", sum.Loaded, "skipped", sum.Skipped,
		"rows", sum.Rows, "took", sum.Elapsed.Round(time.Millisecond), "clamped_to_retention", strings.Join(sum.Clamped, ","))
	return nil
}

// span returns the range of --from and --to at the time now, in whole
// buckets of g: from its first bucket to the end of its last.
func (e *backfillExtension) span(g metricsapi.Granularity, now time.Time) (from, to time.Time, err error) {
	from, err = parseInstant(e.from, now)
	if err != nil {
		return from, from, fmt.Errorf("--from: %w", err)
	}
	to, err = parseInstant(e.to, now)
	if err != nil {
		return from, to, fmt.Errorf("--to: %w", err)
	}
	from, to = g.Truncate(from), g.Truncate(to.Add(g.Duration()-time.Nanosecond))
	if !from.Before(to) {
		return from, to, fmt.Errorf("backfill: --from %s is not before --to %s", from.Format(time.RFC3339), to.Format(time.RFC3339))
	}
	return from, to, nil
}

// selectDatasets returns the datasets to load: those of --dataset among
// the config file's selection of the datasets the API lists, so the rows
// land in the tables the exporter writes with the same file.
func (e *backfillExtension) selectDatasets(ctx context.Context, h *host, cl *apiClients) ([]metricsapi.Dataset, error) {
	all, err := cl.Metrics.Datasets(ctx)
	if err != nil {
		return nil, fmt.Errorf("backfill: list datasets: %w", err)
	}
	all, warnings, err := h.common.config.Select(all, true)
	if err != nil {
		return nil, fmt.Errorf("backfill: %w", err)
	}
	for _, w := range warnings {
		h.log.Warn("config file: "+w, "config_file", h.common.config.Source)
	}
	return pickDatasets(all, e.datasets)
}

// newProgress returns where the backfill reads and records what is loaded:
// the ClickHouse tables of sink, read as empty with --restart.
func (e *backfillExtension) newProgress(ctx context.Context, sink *metrictables.Sink) (backfill.Progress, error) {
	schema, err := sink.Schema(ctx)
	if err != nil {
		return nil, fmt.Errorf("backfill: %w", err)
	}
	progress, err := backfill.NewClickHouseProgress(ctx, schema)
	if err != nil {
		return nil, err
	}
	if e.fresh {
		return backfill.Fresh{Progress: progress}, nil
	}
	return progress, nil
}

// reporter returns the progress display of --progress, on the terminal's
// stderr (not the log); nil for none.
func (e *backfillExtension) reporter() backfill.Reporter {
	stderr := os.Stderr
	switch e.progress {
	case "bar":
		return backfill.NewReporter(stderr, true)
	case "lines":
		return backfill.NewReporter(stderr, false)
	case "auto":
		return backfill.NewReporter(stderr, term.IsTerminal(int(stderr.Fd())))
	}
	return nil
}

// pickDatasets returns the datasets named (all when names is empty), or an
// error naming an unknown one.
func pickDatasets(all []metricsapi.Dataset, names []string) ([]metricsapi.Dataset, error) {
	if len(names) == 0 {
		return all, nil
	}
	var out []metricsapi.Dataset
	for _, n := range names {
		for _, part := range strings.Split(n, ",") {
			part = strings.TrimSpace(part)
			i := slices.IndexFunc(all, func(d metricsapi.Dataset) bool { return d.Name == part })
			if i < 0 {
				known := make([]string, len(all))
				for j, d := range all {
					known[j] = d.Name
				}
				return nil, fmt.Errorf("--dataset %q: unknown (the API offers %s)", part, strings.Join(known, ", "))
			}
			out = append(out, all[i])
		}
	}
	return out, nil
}

// parseInstant parses an RFC 3339 time, a date (UTC midnight), "now", or an
// age such as 7d or 36h (that long before now).
func parseInstant(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "now" {
		return now.UTC(), nil
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	if d, err := model.ParseDuration(strings.TrimPrefix(s, "-")); err == nil {
		return now.Add(-time.Duration(d)).UTC(), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither a time (2026-11-01T00:00:00Z, 2026-11-01) nor an age (7d, 36h)", s)
}
