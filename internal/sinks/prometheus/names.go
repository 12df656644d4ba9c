package prometheus

import (
	"fmt"
	"strings"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

// DefaultPrefix starts every metric name built from the API's datasets
// unless Options.Prefix says otherwise.
const DefaultPrefix = "cdn"

// LabelEnvironment and LabelPercentile are the label names the collector adds
// to the dataset's dimensions.
const (
	LabelEnvironment = "environment_id"
	LabelPercentile  = "percentile"
)

// valueKind says how a metric's bucket values become a Prometheus value.
type valueKind uint8

const (
	kindCounter valueKind = iota // sum of bucket values (API counts)
	kindGauge                    // value of the newest bucket
)

// metricPlan is how one API metric of a dataset is exposed.
type metricPlan struct {
	api   string
	name  string // Prometheus metric name
	help  string // the same for every plan of a name
	kind  valueKind
	scale float64 // multiplies the API value (1/8 for bits, 1/1000 for ms)
	// percentile is the value of the percentile label ("" for none).
	percentile string
}

// Name returns the Prometheus metric name and the percentile label value
// ("" unless the metric is a percentile) of API metric metric of dataset, by
// the contract in DESIGN.md (with prefix cdn):
//
//	requests_edge_total          → cdn_<dataset>_requests_edge_total (counter)
//	ttfb_edge_ms_95_percentile   → cdn_<dataset>_ttfb_edge_seconds{percentile="95"}
//	bits_per_second_edge         → cdn_<dataset>_bytes_per_second_edge (÷8)
//	requests_cache_hit_ratio     → cdn_<dataset>_requests_cache_hit_ratio
func Name(prefix, dataset, metric string) (name, percentile string) {
	info := metricsapi.Classify(metric)
	base := metric
	switch info.Kind {
	case metricsapi.KindPercentile:
		base = info.Stem + "_seconds"
		percentile = info.Percentile
	case metricsapi.KindRate:
		if strings.HasPrefix(metric, "bits_") {
			base = "bytes_" + strings.TrimPrefix(metric, "bits_")
		}
	}
	return sanitize(prefix) + "_" + sanitize(dataset) + "_" + sanitize(base), percentile
}

// plan returns how metric of ds is exposed.
func plan(prefix string, ds *metricsapi.Dataset, metric string) *metricPlan {
	info := metricsapi.Classify(metric)
	name, pct := Name(prefix, ds.Name, metric)
	p := &metricPlan{api: metric, name: name, kind: kindGauge, scale: 1, percentile: pct}
	var help string
	desc := ""
	for _, m := range ds.Metrics {
		if m.Name == metric {
			desc = strings.TrimSpace(m.Description)
		}
	}
	if desc == "" {
		desc = strings.ReplaceAll(metric, "_", " ")
	}
	desc = strings.TrimSuffix(desc, ".")
	switch info.Kind {
	case metricsapi.KindCount:
		p.kind = kindCounter
		help = fmt.Sprintf("%s: sum of the bucket values of dataset %s counted since the series started, across restarts with --state.dir (API metric %s).", desc, ds.Name, metric)
	case metricsapi.KindPercentile:
		p.scale = 1.0 / 1000
		// One help text for every percentile of the stem: they form one family.
		help = fmt.Sprintf("Percentiles of %s in seconds, newest bucket of dataset %s (API metrics %s_ms_<percentile>_percentile).",
			strings.ReplaceAll(info.Stem, "_", " "), ds.Name, info.Stem)
	case metricsapi.KindRate:
		if strings.HasPrefix(metric, "bits_") {
			p.scale = 1.0 / 8
			help = fmt.Sprintf("%s, converted to bytes per second, newest bucket of dataset %s (API metric %s / 8).", desc, ds.Name, metric)
		} else {
			help = fmt.Sprintf("%s, newest bucket of dataset %s (API metric %s).", desc, ds.Name, metric)
		}
	default:
		help = fmt.Sprintf("%s, newest bucket of dataset %s (API metric %s).", desc, ds.Name, metric)
	}
	if len(ds.Aggregated) > 0 {
		help += fmt.Sprintf(" Over every %s (aggregated by the API: the exporter's selection leaves it out).", strings.Join(ds.Aggregated, " and "))
	}
	p.help = help
	return p
}

// labelNames returns the label names of a dataset's series: environment_id
// and the result's label dimensions, sanitised.
func labelNames(resultLabels []string) []string {
	out := make([]string, 0, len(resultLabels)+1)
	out = append(out, LabelEnvironment)
	for _, l := range resultLabels {
		out = append(out, sanitize(l))
	}
	return out
}

// sanitize maps a name onto the Prometheus name alphabet [a-zA-Z0-9_].
func sanitize(s string) string {
	ok := true
	for i := 0; i < len(s); i++ {
		if !validNameByte(s[i], i) {
			ok = false
			break
		}
	}
	if ok && s != "" {
		return s
	}
	b := []byte(s)
	for i := range b {
		if !validNameByte(b[i], i) {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "_"
	}
	return string(b)
}

func validNameByte(c byte, i int) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && c >= '0' && c <= '9')
}
