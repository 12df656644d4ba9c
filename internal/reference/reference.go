// Package reference generates the reference pages under docs/reference/
// from the programs themselves, so that they cannot drift from the code, as
// Vector generates its components' reference from their definitions:
//
//   - <program>-flags.md for exporter, rtld-receiver and platform-sim: every
//     command and flag with its value, default, environment variable and
//     help, and where each secret comes from, from the kingpin model each
//     program prints with the hidden --help-json (internal/cli);
//   - metrics.md: every metric family of both programs with its type,
//     labels, help and whether it has series at start, from the registry
//     each program describes once started with every sink on (the hidden
//     --web.describe-metrics), and the exporter's dataset metrics from its
//     /metrics after the first poll of every dataset of the built-in
//     simulator;
//   - README.md: the index of these pages.
//
// The generator runs the built binaries (`make docs` builds them; the test
// of this package builds them with internal/testenv), so a flag or a metric
// added anywhere in the programs is in the next `make docs` without an edit
// here. TestReferenceUpToDate fails when a checked-in page differs from what
// the code generates.
package reference

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/edgepipe/edgepipe/internal/cli"
)

// Dir is where the pages go, relative to the repository's root.
const Dir = "docs/reference"

// Programs are the project's programs, in the order the index lists them.
var Programs = []string{"exporter", "rtld-receiver", "platform-sim"}

// datasetPrefix is the exporter's default prefix of dataset metrics
// (internal/sinks/prometheus.DefaultPrefix).
const datasetPrefix = "cdn"

// Config is what the generator needs.
type Config struct {
	// Binaries are the programs' executables by name (see Programs).
	Binaries map[string]string
	// ClickHouseDSN is a ClickHouse server the programs' ClickHouse sinks
	// use while they start (they create their database and tables), e.g.
	// clickhouse://127.0.0.1:9000/reference.
	ClickHouseDSN string
	// KafkaBrokers are the Kafka brokers (comma-separated) of the
	// receiver's Kafka sink.
	KafkaBrokers string
	// WorkDir holds the programs' state and spool directories.
	WorkDir string
}

// Generate runs the programs and returns the pages by slash path relative
// to the repository's root.
func Generate(ctx context.Context, cfg Config) (map[string][]byte, error) {
	for _, name := range Programs {
		if cfg.Binaries[name] == "" {
			return nil, fmt.Errorf("reference: no executable for %s", name)
		}
	}
	pages := map[string][]byte{}
	for _, name := range Programs {
		cl, err := helpJSON(ctx, cfg.Binaries[name])
		if err != nil {
			return nil, err
		}
		pages[path.Join(Dir, name+"-flags.md")] = flagsPage(cl)
	}
	metrics, err := programsMetrics(ctx, cfg)
	if err != nil {
		return nil, err
	}
	pages[path.Join(Dir, "metrics.md")] = metricsPage(metrics, datasetPrefix)
	pages[path.Join(Dir, "README.md")] = indexPage(pages)
	return pages, nil
}

// programsMetrics describes the metrics of the exporter and the receiver.
func programsMetrics(ctx context.Context, cfg Config) ([]programMetrics, error) {
	dir := func(name string) string { return filepath.Join(cfg.WorkDir, name) }
	// Every sink on; the simulator in-process (--simulate). The OTLP sink
	// exports to nothing: only its metrics matter.
	exporter, exporterRun, err := describeAndRun(ctx, cfg.Binaries["exporter"], cfg.WorkDir, func(run string) []string {
		return []string{"--simulate", "--state.dir=" + dir("exporter-"+run), "--clickhouse.dsn=" + cfg.ClickHouseDSN,
			"--otlp.endpoint=http://127.0.0.1:4317", "--otlp.protocol=http/protobuf"}
	})
	if err != nil {
		return nil, err
	}
	datasets := labelValues(exporterRun, "edgepipe_dataset_up", "dataset")
	if len(datasets) == 0 {
		return nil, errors.New("reference: the exporter's /metrics has no edgepipe_dataset_up{dataset} after the first poll: cannot tell its datasets")
	}
	receiver, receiverRun, err := describeAndRun(ctx, cfg.Binaries["rtld-receiver"], cfg.WorkDir, func(run string) []string {
		return []string{"--simulate", "--spool.dir=" + dir("spool-"+run),
			"--kafka.brokers=" + cfg.KafkaBrokers, "--clickhouse.dsn=" + cfg.ClickHouseDSN}
	})
	if err != nil {
		return nil, err
	}
	return []programMetrics{
		merge("exporter", exporter, exporterRun, datasetPrefix, datasets),
		merge("rtld-receiver", receiver, receiverRun, datasetPrefix, nil),
	}, nil
}

// describeAndRun describes the metrics of bin started with args("describe"),
// then runs it with args("run") until it is ready and, for a while, until
// the families described without a type have series, and returns the
// description and that run's /metrics: the exporter's dataset metrics are
// there, and the types a start-up could not tell.
func describeAndRun(ctx context.Context, bin, workDir string, args func(run string) []string) ([]cli.MetricFamily, map[string]*dto.MetricFamily, error) {
	described, err := describeMetrics(ctx, bin, workDir, nil, args("describe")...)
	if err != nil {
		return nil, nil, err
	}
	var untyped []string
	for _, mf := range described {
		if mf.Type == "" {
			untyped = append(untyped, mf.Name)
		}
	}
	scraped, err := scrapeWhenReady(ctx, bin, nil, untyped, args("run")...)
	if err != nil {
		return nil, nil, err
	}
	return described, scraped, nil
}

// indexPage lists the pages.
func indexPage(pages map[string][]byte) []byte {
	p := newPage("the list of generated pages")
	p.para("# Reference")
	p.para("Generated from the code by `make docs`; the guides in [docs/](..) explain when and why to use what these pages list.")
	var names []string
	for name := range pages {
		names = append(names, path.Base(name))
	}
	slices.Sort(names)
	for _, name := range names {
		p.line("- [%s](%s)", title(pages[path.Join(Dir, name)]), name)
	}
	return p.bytes()
}

// Write writes pages under root and removes the generated pages of Dir that
// pages no longer has.
func Write(root string, pages map[string][]byte) error {
	stale, err := generatedFiles(root)
	if err != nil {
		return err
	}
	for name, b := range pages {
		f := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(f, b, 0o644); err != nil {
			return err
		}
		delete(stale, name)
	}
	for name := range stale {
		if err := os.Remove(filepath.Join(root, filepath.FromSlash(name))); err != nil {
			return err
		}
	}
	return nil
}

// Compare returns, for every page under root that differs from pages (or
// is missing, or generated but no longer generated), what differs.
func Compare(root string, pages map[string][]byte) ([]string, error) {
	stale, err := generatedFiles(root)
	if err != nil {
		return nil, err
	}
	var diffs []string
	names := make([]string, 0, len(pages))
	for name := range pages {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		delete(stale, name)
		have, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
		switch {
		case os.IsNotExist(err):
			diffs = append(diffs, name+" is missing")
		case err != nil:
			return nil, err
		case !bytes.Equal(have, pages[name]):
			diffs = append(diffs, fmt.Sprintf("%s differs from what the code generates: %s", name, firstDifference(have, pages[name])))
		}
	}
	for name := range stale {
		diffs = append(diffs, name+" is no longer generated")
	}
	slices.Sort(diffs)
	return diffs, nil
}

// generatedFiles returns the files of Dir under root that carry the
// generated note.
func generatedFiles(root string) (map[string]bool, error) {
	entries, err := os.ReadDir(filepath.Join(root, filepath.FromSlash(Dir)))
	if os.IsNotExist(err) {
		return map[string]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	files := map[string]bool{}
	note, _, _ := strings.Cut(generatedNote, "%s")
	for _, e := range entries {
		name := path.Join(Dir, e.Name())
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
		if err == nil && bytes.HasPrefix(b, []byte(note)) {
			files[name] = true
		}
	}
	return files, nil
}

// firstDifference shows the first line where have and want differ.
func firstDifference(have, want []byte) string {
	h, w := strings.Split(string(have), "\n"), strings.Split(string(want), "\n")
	for i := 0; i < max(len(h), len(w)); i++ {
		var hl, wl string
		if i < len(h) {
			hl = h[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if hl != wl {
			return fmt.Sprintf("line %d is\n\t%s\nbut the code generates\n\t%s", i+1, shorten(hl), shorten(wl))
		}
	}
	return "(identical lines, different bytes)"
}

func shorten(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}
