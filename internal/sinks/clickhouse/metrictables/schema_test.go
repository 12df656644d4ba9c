package metrictables

import (
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
)

// testDataset is edge_errors with one gauge added, so every column kind
// shows up: STRING and NUMBER dimensions, a count and a ratio.
func testDataset() *metricsapi.Dataset {
	return &metricsapi.Dataset{
		Name: "edge_errors",
		Dimensions: []metricsapi.Dimension{
			{Name: "time", Type: metricsapi.TypeDate},
			{Name: "environment_id", Type: metricsapi.TypeString},
			{Name: "country_code", Type: metricsapi.TypeString},
			{Name: "http_status_code", Type: metricsapi.TypeNumber},
		},
		Metrics: []metricsapi.Metric{
			{Name: "requests_edge_total", Type: metricsapi.TypeNumber},
			{Name: "requests_error_ratio", Type: metricsapi.TypeNumber},
		},
	}
}

func TestCreateTableDDL(t *testing.T) {
	ds := testDataset()
	cols := MetricsColumns(ds, nil, nil)
	for _, tc := range []struct {
		name      string
		version   string
		cluster   string
		retention time.Duration
		want      []string
	}{
		{
			name:    "18.16 single server, retention ignored (no TTL)",
			version: "18.16.1", retention: 32 * 24 * time.Hour,
			want: []string{"CREATE DATABASE IF NOT EXISTS `cdn`", "CREATE TABLE IF NOT EXISTS `cdn`.`edge_errors`\n(\n" +
				"    `time` DateTime('UTC'),\n" +
				"    `granularity` String,\n" +
				"    `environment_id` String,\n" +
				"    `country_code` String,\n" +
				"    `http_status_code` Int64,\n" +
				"    `requests_edge_total` UInt64,\n" +
				"    `requests_error_ratio` Float64,\n" +
				"    `version` UInt64\n" +
				")\n" +
				"ENGINE = ReplacingMergeTree(`version`)\n" +
				"PARTITION BY toYYYYMM(`time`)\n" +
				"ORDER BY (`granularity`, `environment_id`, `country_code`, `http_status_code`, `time`)"},
		},
		{
			name:    "24.8 single server with retention",
			version: "24.8.4.13", retention: 32 * 24 * time.Hour,
			want: []string{"CREATE DATABASE IF NOT EXISTS `cdn`", "CREATE TABLE IF NOT EXISTS `cdn`.`edge_errors`\n(\n" +
				"    `time` DateTime('UTC'),\n" +
				"    `granularity` LowCardinality(String),\n" +
				"    `environment_id` LowCardinality(String),\n" +
				"    `country_code` LowCardinality(String),\n" +
				"    `http_status_code` Int64,\n" +
				"    `requests_edge_total` UInt64 CODEC(T64, ZSTD(1)),\n" +
				"    `requests_error_ratio` Float64 CODEC(Gorilla, ZSTD(1)),\n" +
				"    `version` UInt64 CODEC(T64, ZSTD(1))\n" +
				")\n" +
				"ENGINE = ReplacingMergeTree(`version`)\n" +
				"PARTITION BY toYYYYMM(`time`)\n" +
				"ORDER BY (`granularity`, `environment_id`, `country_code`, `http_status_code`, `time`)\n" +
				"TTL `time` + INTERVAL 2764800 SECOND\n" +
				"SETTINGS non_replicated_deduplication_window = 1000"},
		},
		{
			name:    "24.8 cluster without retention",
			version: "24.8.4.13", cluster: "prod",
			want: []string{"CREATE DATABASE IF NOT EXISTS `cdn` ON CLUSTER `prod`", "CREATE TABLE IF NOT EXISTS `cdn`.`edge_errors_local` ON CLUSTER `prod`\n(\n" +
				"    `time` DateTime('UTC'),\n" +
				"    `granularity` LowCardinality(String),\n" +
				"    `environment_id` LowCardinality(String),\n" +
				"    `country_code` LowCardinality(String),\n" +
				"    `http_status_code` Int64,\n" +
				"    `requests_edge_total` UInt64 CODEC(T64, ZSTD(1)),\n" +
				"    `requests_error_ratio` Float64 CODEC(Gorilla, ZSTD(1)),\n" +
				"    `version` UInt64 CODEC(T64, ZSTD(1))\n" +
				")\n" +
				"ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/cdn/edge_errors_local', '{replica}', `version`)\n" +
				"PARTITION BY toYYYYMM(`time`)\n" +
				"ORDER BY (`granularity`, `environment_id`, `country_code`, `http_status_code`, `time`)",
				"CREATE TABLE IF NOT EXISTS `cdn`.`edge_errors` ON CLUSTER `prod` AS `cdn`.`edge_errors_local`\n" +
					"ENGINE = Distributed('prod', 'cdn', 'edge_errors_local', cityHash64(`environment_id`))"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := clickhouse.ParseVersion(tc.version)
			if err != nil {
				t.Fatal(err)
			}
			got := clickhouse.CreateStatements("cdn", tc.cluster, v, TableSpec(ds.Name, cols, v, tc.retention))
			if strings.Join(got, "\n;\n") != strings.Join(tc.want, "\n;\n") {
				t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n;\n"), strings.Join(tc.want, "\n;\n"))
			}
		})
	}
}

func TestQuoting(t *testing.T) {
	if got := clickhouse.QuoteIdent("a`b\\c"); got != "`a\\`b\\\\c`" {
		t.Errorf("QuoteIdent = %s", got)
	}
	if got := clickhouse.QuoteString("it's"); got != `'it\'s'` {
		t.Errorf("QuoteString = %s", got)
	}
	if got := clickhouse.RedactDSN("clickhouse://u:secret@h:9000/db?x=1"); strings.Contains(got, "secret") {
		t.Errorf("RedactDSN leaked the password: %s", got)
	}
	if got := clickhouse.RedactDSN("clickhouse://h:9000/db?password=secret"); strings.Contains(got, "secret") {
		t.Errorf("RedactDSN leaked the password: %s", got)
	}
}

func TestTableName(t *testing.T) {
	ds := testDataset()
	sel := func(dims ...string) *metricsapi.Dataset {
		d, err := ds.Select(metricsapi.Selection{Dimensions: append([]string{}, dims...)})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	lessMetrics, err := ds.Select(metricsapi.Selection{Metric: func(m string) bool { return m == "requests_edge_total" }})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ds   *metricsapi.Dataset
		want string
	}{
		{ds, "edge_errors"},
		{sel("country_code", "http_status_code"), "edge_errors"},
		{lessMetrics, "edge_errors"},
		{sel("http_status_code"), "edge_errors__by_http_status_code"},
		{sel("http_status_code", "country_code"), "edge_errors"}, // every dimension kept, in any order
		{sel(), "edge_errors__by_environment_id"},
	} {
		if got := TableName(tc.ds); got != tc.want {
			t.Errorf("TableName(labels %v, aggregated %v) = %q, want %q", tc.ds.LabelNames(), tc.ds.Aggregated, got, tc.want)
		}
	}
}
