package clickhouse

import "github.com/prometheus/client_golang/prometheus"

// incompleteNodesDesc describes the gauge of NewSchemaCollector.
var incompleteNodesDesc = prometheus.NewDesc("edgepipe_clickhouse_incomplete_nodes",
	"ClickHouse nodes on which a table the program keeps (writes, or makes for the dashboards) is missing, lacks columns or could not be checked at the last check (0: complete on every node; rechecked every 15s while above 0).",
	[]string{"table"}, nil)

// schemaCollector is the prometheus.Collector of NewSchemaCollector.
type schemaCollector struct {
	current func() *Schema
}

// NewSchemaCollector returns a collector of
// edgepipe_clickhouse_incomplete_nodes{table}, read at scrape time from the
// Schema that current returns (nil while there is none: nothing is
// reported).
func NewSchemaCollector(current func() *Schema) prometheus.Collector {
	return &schemaCollector{current: current}
}

// Describe implements prometheus.Collector.
func (c *schemaCollector) Describe(ch chan<- *prometheus.Desc) { ch <- incompleteNodesDesc }

// Collect implements prometheus.Collector.
func (c *schemaCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.current()
	if s == nil {
		return
	}
	for table, n := range s.Incomplete() {
		ch <- prometheus.MustNewConstMetric(incompleteNodesDesc, prometheus.GaugeValue, float64(n), table)
	}
}
