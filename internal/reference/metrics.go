package reference

import (
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/edgepipe/edgepipe/internal/cli"
)

// programMetrics is what one program exposes: the families of its registry
// as described at start-up, and those an exercised run's scrape adds.
type programMetrics struct {
	name string
	// families are the program's own metrics (registry and scrape-time
	// families that are not dataset metrics), by name.
	families []cli.MetricFamily
	// datasets are the exporter's dataset metrics by dataset (nil for the
	// receiver).
	datasets map[string][]cli.MetricFamily
}

// leftOut reports whether a family is one of client_golang's standard Go
// and process collectors, which the page mentions instead of listing
// (their set changes with the Go version and the operating system).
func leftOut(name string) bool {
	return strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_")
}

// merge builds a program's metrics from its start-up description and the
// scrape of an exercised run: a family only the scrape has
// is a dataset metric when its name is <prefix>_<dataset>_… for a dataset
// of datasets, and a program metric otherwise; a described family whose
// type nothing told at start-up takes the scrape's.
func merge(name string, described []cli.MetricFamily, scraped map[string]*dto.MetricFamily, prefix string, datasets []string) programMetrics {
	pm := programMetrics{name: name}
	known := map[string]bool{}
	for _, mf := range described {
		if leftOut(mf.Name) {
			continue
		}
		known[mf.Name] = true
		if mf.Type == "" {
			if s := scraped[mf.Name]; s != nil {
				mf.Type = familyType(s)
			}
		}
		pm.families = append(pm.families, mf)
	}
	names := make([]string, 0, len(scraped))
	for n := range scraped {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if known[n] || leftOut(n) {
			continue
		}
		mf := fromScrape(scraped[n])
		if ds := datasetOf(n, prefix, datasets); ds != "" {
			if pm.datasets == nil {
				pm.datasets = map[string][]cli.MetricFamily{}
			}
			pm.datasets[ds] = append(pm.datasets[ds], mf)
			continue
		}
		pm.families = append(pm.families, mf)
	}
	slices.SortFunc(pm.families, func(a, b cli.MetricFamily) int { return strings.Compare(a.Name, b.Name) })
	return pm
}

// datasetOf returns the dataset whose metric the family name is (the
// longest dataset name that fits), or "".
func datasetOf(name, prefix string, datasets []string) string {
	best := ""
	for _, ds := range datasets {
		if strings.HasPrefix(name, prefix+"_"+ds+"_") && len(ds) > len(best) {
			best = ds
		}
	}
	return best
}

// fromScrape describes a scraped family: a family that was not there at
// start-up.
func fromScrape(g *dto.MetricFamily) cli.MetricFamily {
	var labels []string
	for _, m := range g.GetMetric() {
		for _, l := range m.GetLabel() {
			if !slices.Contains(labels, l.GetName()) {
				labels = append(labels, l.GetName())
			}
		}
	}
	return cli.MetricFamily{Name: g.GetName(), Type: familyType(g), Help: g.GetHelp(), Labels: labels}
}

func familyType(g *dto.MetricFamily) string {
	return strings.ToLower(g.GetType().String())
}

// labelValues returns the values of label in family name's series.
func labelValues(scraped map[string]*dto.MetricFamily, name, label string) []string {
	var out []string
	for _, m := range scraped[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && !slices.Contains(out, l.GetValue()) {
				out = append(out, l.GetValue())
			}
		}
	}
	slices.Sort(out)
	return out
}

// metricsPage renders the metric reference of the programs.
func metricsPage(programs []programMetrics, prefix string) []byte {
	p := newPage("the collectors both programs register and the exporter's dataset metrics (`--web.describe-metrics`, `/metrics`)")
	p.para("# Metrics")
	p.para("Every metric the two programs serve on `/metrics`, with its type, labels and help, " +
		"as the programs themselves report them. `make docs` generates this page:")
	p.line("- **Program metrics**: each program is started with every sink on (ClickHouse, Kafka, OTLP) against the " +
		"built-in platform simulator, and once started up it describes its registry (the hidden flag " +
		"`--web.describe-metrics`) instead of serving: every registered collector's descriptors give the names, " +
		"help and labels; a family's series, or for a labelled metric without series yet its registered collector, " +
		"give the type, and where neither tells (a collector of its own without series yet), the program's " +
		"`/metrics` once it has run for a while.")
	p.line("- **Series**: *at start* means the metric has series as soon as the program has started; " +
		"*after an event* means it appears with the first event it counts or measures (a labelled counter gets " +
		"a series per label set the first time it counts one, e.g. `{dataset=\"…\"}` at a dataset's first poll). " +
		"Alerts and dashboards must expect these to be absent until then.")
	p.line("- **Dataset metrics** (`%s_<dataset>_…`): see [the exporter's dataset metrics](#dataset-metrics).", prefix)
	p.line("- The standard `go_*` and `process_*` metrics of client_golang's Go and process collectors, which " +
		"both programs serve, are left out.")
	p.line("")
	for _, pm := range programs {
		p.para("## %s", pm.name)
		p.para("### Program metrics")
		var rows [][]string
		for _, mf := range pm.families {
			when := "after an event"
			if mf.Series {
				when = "at start"
			}
			rows = append(rows, []string{code(mf.Name), typeName(mf.Type), codeList(mf.Labels), when, inline(mf.Help)})
		}
		p.table([]string{"metric", "type", "labels", "series", "description"}, rows)
		if pm.datasets != nil {
			datasetSection(p, pm.datasets, prefix)
		}
	}
	return p.bytes()
}

// datasetSection writes the exporter's dataset metrics, one table per
// dataset.
func datasetSection(p *page, datasets map[string][]cli.MetricFamily, prefix string) {
	p.para("### Dataset metrics")
	p.para("The exporter has no list of its own of these: at run time it turns every dataset the platform's " +
		"Metrics API lists (`GET /metrics/v1/datasets`) into metrics, from the dataset's descriptor: its dimensions " +
		"become labels and each of its metrics one family, whose help is the descriptor's description. A dataset or " +
		"metric the platform adds is exported without a new edgepipe release, and one it drops disappears. The families " +
		"below are those of the platform's datasets as the built-in simulator serves them (it serves the datasets of the " +
		"platform's API specification), scraped after the first poll of every dataset.")
	p.line("- Names: `%s_<dataset>_<metric>` (the prefix is the config file's `prefix`), labels `environment_id` "+
		"and the dataset's dimensions (those the config file keeps).", prefix)
	p.line("- API counts (`…_total`) are counters: the sum of every bucket value counted; a revised bucket adds its difference.")
	p.line("- A percentile (`…_ms_<P>_percentile`) becomes a gauge `…_seconds{percentile=\"<P>\"}` in seconds; " +
		"bits become bytes (`bits_per_second_…` → `bytes_per_second_…`); every other metric is a gauge of the newest bucket.")
	p.line("- Series appear after the dataset's first poll.")
	p.line("")
	names := make([]string, 0, len(datasets))
	for ds := range datasets {
		names = append(names, ds)
	}
	slices.Sort(names)
	for _, ds := range names {
		p.para("#### %s", code(ds))
		var rows [][]string
		for _, mf := range datasets[ds] {
			rows = append(rows, []string{code(mf.Name), typeName(mf.Type), codeList(mf.Labels), inline(mf.Help)})
		}
		p.table([]string{"metric", "type", "labels", "description"}, rows)
	}
}

// typeName is a family's type as the page shows it.
func typeName(t string) string {
	if t == "" {
		return "not reported until its first series"
	}
	return t
}
