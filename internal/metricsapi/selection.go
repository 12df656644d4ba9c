package metricsapi

import (
	"fmt"
	"slices"
	"strings"
)

// Selection says what of a dataset is exported: the label dimensions kept and
// the metrics. The API aggregates every dimension a query leaves out, exactly
// (counts summed, ratios and rates recomputed, percentiles weighted by
// traffic), so a selection with fewer dimensions costs no more requests and
// yields fewer, exact series. time and environment_id are always kept: one
// request still covers MaxFilterValues environments.
type Selection struct {
	// Dimensions are the label dimensions to keep; nil keeps every one and
	// an empty slice none (one series per environment).
	Dimensions []string
	// Metric reports whether a metric is exported; nil exports every one.
	Metric func(name string) bool
}

// Select returns the view of d that sel keeps: a copy of the descriptor with
// the kept dimensions and the chosen metrics, both in descriptor order, and
// Aggregated listing the label dimensions left to the API. It fails on a
// dimension d does not have (naming those it has) and when sel leaves no
// metric.
func (d *Dataset) Select(sel Selection) (*Dataset, error) {
	out := *d
	out.Aggregated = slices.Clone(d.Aggregated)
	if sel.Dimensions != nil {
		labels := d.LabelNames()
		for _, name := range sel.Dimensions {
			switch {
			case name == DimensionTime || name == DimensionEnvironment:
				return nil, fmt.Errorf("dimension %q is always kept; list only the others (%s)", name, orNone(labels))
			case !slices.Contains(labels, name):
				return nil, fmt.Errorf("unknown dimension %q (dataset %s has %s)", name, d.Name, orNone(labels))
			}
		}
		out.Dimensions = make([]Dimension, 0, len(d.Dimensions))
		for _, dim := range d.Dimensions {
			if dim.Name == DimensionTime || dim.Name == DimensionEnvironment || slices.Contains(sel.Dimensions, dim.Name) {
				out.Dimensions = append(out.Dimensions, dim)
			} else {
				out.Aggregated = append(out.Aggregated, dim.Name)
			}
		}
	} else {
		out.Dimensions = slices.Clone(d.Dimensions)
	}
	if sel.Metric != nil {
		out.Metrics = make([]Metric, 0, len(d.Metrics))
		for _, m := range d.Metrics {
			if sel.Metric(m.Name) {
				out.Metrics = append(out.Metrics, m)
			}
		}
	} else {
		out.Metrics = slices.Clone(d.Metrics)
	}
	if len(out.Metrics) == 0 {
		return nil, fmt.Errorf("no metric of dataset %s is selected", d.Name)
	}
	out.TimeGranularities = slices.Clone(d.TimeGranularities)
	out.Filters = slices.Clone(d.Filters)
	return &out, nil
}

func orNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
