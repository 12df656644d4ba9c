package platformsim

import "fmt"

// Dataset names of spec 2.8.
const (
	DatasetEdgeUsageByCountry   = "edge_usage_by_country"
	DatasetEdgeErrors           = "edge_errors"
	DatasetOriginUsageByCountry = "origin_usage_by_country"
	DatasetOriginUsage          = "origin_usage"
	DatasetOriginErrors         = "origin_errors"
	DatasetOriginOffload        = "origin_offload"
)

// Retention of every dataset in seconds (spec 2.8 / notes).
const (
	retentionFiveMinutes = 2764800
	retentionHour        = 8208000
	retentionDay         = 69120000
)

var percentiles = []string{"5", "25", "50", "75", "95", "99"}

type dimensionDesc struct {
	Name        string `json:"name"`
	Type        string `json:"type"`
	Description string `json:"description"`
}

type metricDesc struct {
	Name        string `json:"name"`
	Type        string `json:"type"`
	Description string `json:"description"`
	CreatedAt   string `json:"created_at,omitempty"`
}

type filterDesc struct {
	Name        string `json:"name"`
	Type        string `json:"type"`
	Required    bool   `json:"required"`
	Description string `json:"description"`
}

// datasetDesc is a dataset descriptor with its wire form.
type datasetDesc struct {
	ID                string           `json:"@id"`
	Type              string           `json:"@type"`
	Name              string           `json:"name"`
	Description       string           `json:"description"`
	CreatedAt         string           `json:"created_at"`
	TimeGranularities []string         `json:"time_granularities"`
	Retention         map[string]int64 `json:"data_retention_policy"`
	Dimensions        []dimensionDesc  `json:"dimensions"`
	Metrics           []metricDesc     `json:"metrics"`
	Filters           []filterDesc     `json:"filters"`

	labels  []string // dimensions besides time and environment_id
	metricI map[string]int
	dimI    map[string]int
	filterI map[string]int
}

var dimDescs = map[string]dimensionDesc{
	"time":             {"time", "DATE", "Start of the time bucket (UTC)."},
	"environment_id":   {"environment_id", "STRING", "ID of the environment."},
	"country_code":     {"country_code", "STRING", "Two-letter lowercase country code of the client, or - when unknown."},
	"http_status_code": {"http_status_code", "NUMBER", "HTTP status code of the response."},
	"origin_name":      {"origin_name", "STRING", "Name of the origin in the CDN configuration."},
	"http_method":      {"http_method", "STRING", "HTTP method of the request."},
	"content_type":     {"content_type", "STRING", "Value of the Content-Type response header."},
}

func edgeMetrics() []metricDesc {
	m := []metricDesc{
		{Name: "requests_edge_total", Description: "Requests served by the edge."},
		{Name: "requests_per_second_edge", Description: "Edge requests per second over the bucket."},
		{Name: "requests_hit_total", Description: "Requests served from cache."},
		{Name: "requests_cache_hit_ratio", Description: "Cache hits plus stale hits over all edge requests."},
		{Name: "requests_miss_total", Description: "Requests not served from cache."},
		{Name: "requests_stale_total", Description: "Requests served with stale content."},
		{Name: "requests_prefetch_total", Description: "Prefetch requests."},
		{Name: "requests_prefetch_cache_hit_ratio", Description: "Cache hit ratio of prefetch requests."},
		{Name: "requests_cachable_total", Description: "Requests for cachable content."},
		{Name: "requests_2xx_total", Description: "Edge responses with a 2xx status."},
		{Name: "requests_3xx_total", Description: "Edge responses with a 3xx status."},
		{Name: "requests_4xx_total", Description: "Edge responses with a 4xx status."},
		{Name: "requests_5xx_total", Description: "Edge responses with a 5xx status."},
		{Name: "requests_error_ratio", Description: "5xx responses over all edge requests."},
		{Name: "bytes_edge_total", Description: "Bytes sent by the edge."},
		{Name: "bytes_hit_total", Description: "Bytes sent for cache hits."},
		{Name: "bytes_miss_total", Description: "Bytes sent for cache misses."},
		{Name: "bytes_stale_total", Description: "Bytes sent for stale hits."},
		{Name: "bits_per_second_edge", Description: "Edge bits per second over the bucket."},
	}
	for _, p := range percentiles {
		m = append(m, metricDesc{Name: "ttfb_edge_ms_" + p + "_percentile", Description: "Edge time to first byte, " + p + "th percentile, milliseconds."})
	}
	for _, p := range percentiles {
		m = append(m, metricDesc{Name: "response_time_edge_ms_" + p + "_percentile", Description: "Edge response time, " + p + "th percentile, milliseconds."})
	}
	return m
}

func originMetrics() []metricDesc {
	m := []metricDesc{
		{Name: "requests_origin_total", Description: "Requests sent to the origin."},
		{Name: "bytes_origin_total", Description: "Bytes received from the origin."},
	}
	for _, p := range percentiles {
		m = append(m, metricDesc{Name: "ttfb_origin_ms_" + p + "_percentile", Description: "Origin time to first byte, " + p + "th percentile, milliseconds."})
	}
	for _, p := range percentiles {
		m = append(m, metricDesc{Name: "response_time_origin_ms_" + p + "_percentile", Description: "Origin response time, " + p + "th percentile, milliseconds."})
	}
	return m
}

func byName(all []metricDesc, names ...string) []metricDesc {
	var out []metricDesc
	for _, n := range names {
		for _, m := range all {
			if m.Name == n {
				out = append(out, m)
			}
		}
	}
	return out
}

func newDataset(name, description string, labels []string, metrics []metricDesc) *datasetDesc {
	d := &datasetDesc{
		ID:                "/metrics/v1/datasets/" + name,
		Type:              "MetricsDataset",
		Name:              name,
		Description:       description,
		CreatedAt:         "2023-06-01T00:00:00Z",
		TimeGranularities: []string{"FIVE_MINUTES", "HOUR", "DAY"},
		Retention:         map[string]int64{"five_minutes": retentionFiveMinutes, "hour": retentionHour, "day": retentionDay},
		labels:            labels,
		metricI:           map[string]int{},
		dimI:              map[string]int{},
		filterI:           map[string]int{},
	}
	dims := append([]string{"time", "environment_id"}, labels...)
	for i, n := range dims {
		d.Dimensions = append(d.Dimensions, dimDescs[n])
		d.dimI[n] = i
	}
	for i := range metrics {
		metrics[i].Type = "NUMBER"
		metrics[i].CreatedAt = "2023-06-01T00:00:00Z"
		d.metricI[metrics[i].Name] = i
	}
	d.Metrics = metrics
	d.Filters = append(d.Filters, filterDesc{"environment_id", "array", true, "Environment IDs; required; at most 20 values."})
	d.filterI["environment_id"] = 0
	for _, n := range labels {
		d.filterI[n] = len(d.Filters)
		d.Filters = append(d.Filters, filterDesc{n, "array", false, fmt.Sprintf("Values of %s to keep; at most 20 values.", n)})
	}
	return d
}

// datasets returns the six datasets of spec 2.8 in a fixed order.
func buildDatasets() []*datasetDesc {
	return []*datasetDesc{
		newDataset(DatasetEdgeUsageByCountry, "Edge traffic, cache and latency by client country.",
			[]string{"country_code"}, edgeMetrics()),
		newDataset(DatasetEdgeErrors, "Edge 5xx responses by client country and status code.",
			[]string{"country_code", "http_status_code"}, byName(edgeMetrics(), "requests_edge_total")),
		newDataset(DatasetOriginUsageByCountry, "Origin traffic and latency by client country and origin.",
			[]string{"country_code", "origin_name"}, originMetrics()),
		newDataset(DatasetOriginUsage, "Origin traffic and latency by origin, method and content type.",
			[]string{"origin_name", "http_method", "content_type"}, originMetrics()),
		newDataset(DatasetOriginErrors, "Origin 4xx and 5xx responses by origin, method, content type and status code.",
			[]string{"origin_name", "http_method", "content_type", "http_status_code"}, byName(originMetrics(), "requests_origin_total")),
		newDataset(DatasetOriginOffload, "Edge versus origin traffic by method and content type.",
			[]string{"http_method", "content_type"},
			append(byName(edgeMetrics(), "requests_edge_total"), append(byName(originMetrics(), "requests_origin_total"),
				append(byName(edgeMetrics(), "bytes_edge_total"), byName(originMetrics(), "bytes_origin_total")...)...)...)),
	}
}
