package exportconfig

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

// Select applies the configuration to the descriptors the platform lists and
// returns them as exported: a configured dataset with only the dimensions,
// metrics and percentiles kept (see metricsapi.Dataset.Select), the others
// unchanged, in the order of all.
//
// With strict (the first discovery), every dataset, dimension and
// percentile the file names must exist and every configured dataset must
// keep a metric; the error names the key of each problem. Without strict
// (later discoveries: the platform may withdraw something), a dimension or
// percentile that is gone is left out of the selection (the API aggregates
// the dimension), a dataset left without metrics is left out, and each of
// these is a warning. Warnings also name patterns that match no metric.
func (c *Config) Select(all []metricsapi.Dataset, strict bool) ([]metricsapi.Dataset, []string, error) {
	byName := make(map[string]*Dataset, len(c.Datasets))
	for i := range c.Datasets {
		byName[c.Datasets[i].Name] = &c.Datasets[i]
	}
	var errs []error
	var warnings []string
	// problem reports a fatal problem (an error when strict, else a
	// warning ending in what the exporter does about it) or a warning.
	problem := func(fatal bool, key, instead, format string, a ...any) {
		msg := fmt.Sprintf("%s: %s", key, fmt.Sprintf(format, a...))
		switch {
		case fatal && strict:
			errs = append(errs, errors.New(msg))
		case instead != "":
			warnings = append(warnings, msg+"; "+instead)
		default:
			warnings = append(warnings, msg)
		}
	}
	offered := make([]string, len(all))
	for i, ds := range all {
		offered[i] = ds.Name
	}
	for _, d := range c.Datasets {
		if !slices.Contains(offered, d.Name) {
			problem(true, d.Key, "", "unknown dataset (the platform offers %s)", strings.Join(offered, ", "))
		}
	}
	out := make([]metricsapi.Dataset, 0, len(all))
	for i := range all {
		ds := &all[i]
		d := byName[ds.Name]
		if d == nil {
			out = append(out, *ds)
			continue
		}
		chosen, err := ds.Select(d.selection(ds, problem))
		if err != nil {
			problem(true, d.Key, "the dataset is not exported", "%v", err)
			continue
		}
		out = append(out, *chosen)
	}
	if len(errs) > 0 {
		return nil, warnings, fmt.Errorf("config file %s does not fit the platform's datasets: %w", c.Source, errors.Join(errs...))
	}
	return out, warnings, nil
}

// selection builds the metricsapi.Selection of d for descriptor ds, leaving
// out (and reporting) dimensions and percentiles ds does not have.
func (d *Dataset) selection(ds *metricsapi.Dataset, problem func(fatal bool, key, instead, format string, a ...any)) metricsapi.Selection {
	var sel metricsapi.Selection
	if d.Dimensions != nil {
		labels := ds.LabelNames()
		sel.Dimensions = []string{}
		for i, dim := range d.Dimensions {
			if !slices.Contains(labels, dim) {
				problem(true, fmt.Sprintf("%s.dimensions[%d]", d.Key, i), "aggregated", "unknown dimension %q of dataset %s (it has %s)",
					dim, ds.Name, listOrNone(labels))
				continue
			}
			sel.Dimensions = append(sel.Dimensions, dim)
		}
	}
	names := ds.MetricNames()
	for _, pats := range []struct {
		key  string
		list []*Pattern
	}{{"include", d.MetricsInclude}, {"exclude", d.MetricsExclude}} {
		for i, p := range pats.list {
			if !slices.ContainsFunc(names, p.MatchString) {
				problem(false, fmt.Sprintf("%s.metrics.%s[%d]", d.Key, pats.key, i), "", "%q matches no metric of dataset %s", p.Text, ds.Name)
			}
		}
	}
	var percentiles []float64
	if d.Percentiles != nil {
		var have []string
		for _, m := range names {
			if info := metricsapi.Classify(m); info.Kind == metricsapi.KindPercentile && !slices.Contains(have, info.Percentile) {
				have = append(have, info.Percentile)
			}
		}
		if len(have) == 0 && len(d.Percentiles) > 0 {
			problem(true, d.Key+".percentiles", "ignored", "dataset %s has no percentile metrics", ds.Name)
		}
		for i, p := range d.Percentiles {
			if len(have) > 0 && !slices.ContainsFunc(have, func(h string) bool { return samePercentile(h, p) }) {
				problem(true, fmt.Sprintf("%s.percentiles[%d]", d.Key, i), "ignored", "dataset %s has no percentile %s (it has %s)",
					ds.Name, strconv.FormatFloat(p, 'f', -1, 64), strings.Join(have, ", "))
				continue
			}
			percentiles = append(percentiles, p)
		}
	}
	keepPercentiles := d.Percentiles != nil
	sel.Metric = func(name string) bool {
		if len(d.MetricsInclude) > 0 && !slices.ContainsFunc(d.MetricsInclude, func(p *Pattern) bool { return p.MatchString(name) }) {
			return false
		}
		if slices.ContainsFunc(d.MetricsExclude, func(p *Pattern) bool { return p.MatchString(name) }) {
			return false
		}
		if info := metricsapi.Classify(name); keepPercentiles && info.Kind == metricsapi.KindPercentile {
			return slices.ContainsFunc(percentiles, func(p float64) bool { return samePercentile(info.Percentile, p) })
		}
		return true
	}
	return sel
}

// samePercentile reports whether the API's percentile text (such as "95")
// is p.
func samePercentile(api string, p float64) bool {
	f, err := strconv.ParseFloat(api, 64)
	return err == nil && f == p
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "no other dimension"
	}
	return strings.Join(names, ", ")
}
