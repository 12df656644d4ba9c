package clickhouse

import (
	"strings"
	"testing"
	"time"
)

func TestCreateStatements(t *testing.T) {
	tbl := &Table{
		Name:             "access_logs",
		Columns:          []Column{{Name: "environment_id", Type: "String"}, {Name: "timestamp", Type: "DateTime"}, {Name: "insert_version", Type: "UInt64"}},
		Engine:           "ReplacingMergeTree",
		EngineArgs:       []string{"insert_version"},
		PartitionBy:      "toDate(timestamp)",
		OrderBy:          []string{"environment_id", "toStartOfHour(timestamp)"},
		ShardingKey:      "cityHash64(environment_id)",
		Retention:        30 * 24 * time.Hour,
		RetentionTime:    "toDateTime(timestamp)",
		TTLOnlyDropParts: true,
	}
	for _, tc := range []struct {
		name, version, cluster string
		want                   []string
	}{
		{name: "18.16 single server: no TTL", version: "18.16.1", want: []string{
			"CREATE DATABASE IF NOT EXISTS `logs`",
			"CREATE TABLE IF NOT EXISTS `logs`.`access_logs`\n(\n    `environment_id` String,\n    `timestamp` DateTime,\n    `insert_version` UInt64\n)\n" +
				"ENGINE = ReplacingMergeTree(insert_version)\nPARTITION BY toDate(timestamp)\nORDER BY (environment_id, toStartOfHour(timestamp))",
		}},
		{name: "18.16 cluster", version: "18.16.1", cluster: "c1", want: []string{
			"CREATE DATABASE IF NOT EXISTS `logs` ON CLUSTER `c1`",
			"CREATE TABLE IF NOT EXISTS `logs`.`access_logs_local` ON CLUSTER `c1`\n(\n    `environment_id` String,\n    `timestamp` DateTime,\n    `insert_version` UInt64\n)\n" +
				"ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/logs/access_logs_local', '{replica}', insert_version)\nPARTITION BY toDate(timestamp)\nORDER BY (environment_id, toStartOfHour(timestamp))",
			"CREATE TABLE IF NOT EXISTS `logs`.`access_logs` ON CLUSTER `c1` AS `logs`.`access_logs_local`\nENGINE = Distributed('c1', 'logs', 'access_logs_local', cityHash64(environment_id))",
		}},
		{name: "24.8 single server: TTL, deduplication window, parts dropped whole", version: "24.8.4.13", want: []string{
			"CREATE DATABASE IF NOT EXISTS `logs`",
			"CREATE TABLE IF NOT EXISTS `logs`.`access_logs`\n(\n    `environment_id` String,\n    `timestamp` DateTime,\n    `insert_version` UInt64\n)\n" +
				"ENGINE = ReplacingMergeTree(insert_version)\nPARTITION BY toDate(timestamp)\nORDER BY (environment_id, toStartOfHour(timestamp))\n" +
				"TTL toDateTime(timestamp) + INTERVAL 2592000 SECOND\nSETTINGS non_replicated_deduplication_window = 1000, ttl_only_drop_parts = 1",
		}},
		{name: "26.7 cluster: Replicated tables deduplicate by default", version: "26.7.2.1", cluster: "c1", want: []string{
			"CREATE DATABASE IF NOT EXISTS `logs` ON CLUSTER `c1`",
			"CREATE TABLE IF NOT EXISTS `logs`.`access_logs_local` ON CLUSTER `c1`\n(\n    `environment_id` String,\n    `timestamp` DateTime,\n    `insert_version` UInt64\n)\n" +
				"ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/logs/access_logs_local', '{replica}', insert_version)\nPARTITION BY toDate(timestamp)\nORDER BY (environment_id, toStartOfHour(timestamp))\n" +
				"TTL toDateTime(timestamp) + INTERVAL 2592000 SECOND\nSETTINGS ttl_only_drop_parts = 1",
			"CREATE TABLE IF NOT EXISTS `logs`.`access_logs` ON CLUSTER `c1` AS `logs`.`access_logs_local`\nENGINE = Distributed('c1', 'logs', 'access_logs_local', cityHash64(environment_id))",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := CreateStatements("logs", tc.cluster, mustParseVersion(t, tc.version), tbl)
			if strings.Join(got, "\n;\n") != strings.Join(tc.want, "\n;\n") {
				t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n;\n"), strings.Join(tc.want, "\n;\n"))
			}
		})
	}
}

func TestAddColumns(t *testing.T) {
	metric := Column{Name: "requests_new_total", Type: "UInt64"}
	dim := Column{Name: "http_method", Type: "String", SortingKey: true}
	for _, tc := range []struct {
		name       string
		cols       []Column
		sortingKey string
		want       string
	}{
		{name: "metric", cols: []Column{metric}, sortingKey: "granularity, time",
			want: "ALTER TABLE `cdn`.`t`\n    ADD COLUMN `requests_new_total` UInt64"},
		{name: "dimension extends the sorting key", cols: []Column{metric, dim}, sortingKey: "granularity, environment_id, time",
			want: "ALTER TABLE `cdn`.`t`\n    ADD COLUMN `requests_new_total` UInt64,\n    ADD COLUMN `http_method` String,\n" +
				"    MODIFY ORDER BY (granularity, environment_id, time, `http_method`)"},
		{name: "Distributed table: columns only", cols: []Column{dim},
			want: "ALTER TABLE `cdn`.`t`\n    ADD COLUMN `http_method` String"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := addColumns("`cdn`.`t`", tc.cols, tc.sortingKey); got != tc.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

func TestIfNotExists(t *testing.T) {
	for in, want := range map[string]string{
		"CREATE TABLE db.t (k UInt64) ENGINE = Memory":               "CREATE TABLE IF NOT EXISTS db.t (k UInt64) ENGINE = Memory",
		"CREATE TABLE IF NOT EXISTS db.t (k UInt64) ENGINE = Memory": "CREATE TABLE IF NOT EXISTS db.t (k UInt64) ENGINE = Memory",
	} {
		if got := ifNotExists(in); got != want {
			t.Errorf("ifNotExists(%q) = %q, want %q", in, got, want)
		}
	}
}
