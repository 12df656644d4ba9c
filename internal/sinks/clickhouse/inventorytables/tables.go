// Package inventorytables defines the ClickHouse tables of the exporter's
// inventory (internal/inventory): environments (names for SQL joins) and
// tls_certificates. Both are ReplacingMergeTree tables versioned by write
// time, so `SELECT … FINAL` shows the latest row per key, kept in shape by
// clickhouse.Schema (on a server or every node of a cluster) like every
// other table.
//
// The definitions live apart from their writer (inventorysink, the
// exporter's) because both programs make environments: the Access logs
// dashboard joins it to name environments, so the receiver's sink
// (logtable) creates it too, empty, from the same definition, and neither
// binary links the other's code.
//
// Neither table takes --clickhouse.retention: after merges they hold one
// row per environment or certificate ever seen, a TTL would delete rows
// that are still current once nothing refreshes them (the exporter
// stopped, the certificate inventory turned off, a receiver-only
// deployment), and the two programs, each with its own retention, would
// keep changing the TTL of the one environments table.
package inventorytables

import (
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
)

// Table names.
const (
	TableEnvironments    = "environments"
	TableTLSCertificates = "tls_certificates"
)

// Columns the tables share.
const (
	ColumnEnvironmentID = "environment_id"
	// ColumnSeenAt is the time of the inventory that listed the row: a row
	// whose seen_at stops moving is no longer served (environments) or no
	// longer listed by a running exporter (certificates).
	ColumnSeenAt = "seen_at"
	// ColumnVersion orders the writes of one key: the write time in
	// nanoseconds, strictly increasing within a process.
	ColumnVersion = "version"
)

// Columns of tls_certificates besides those above.
const (
	ColumnCertificateID = "certificate_id"
	// ColumnRemoved is 1 in the row written when a listing of the
	// environment no longer had the certificate (its last values kept).
	ColumnRemoved = "removed"
)

const (
	typeString   = "String"
	typeDateTime = "DateTime('UTC')"
	typeUInt8    = "UInt8"
	typeUInt64   = "UInt64"
)

// EnvironmentsTable is the environments table: one row per environment
// served (a name change is a newer row of the same key).
func EnvironmentsTable() *clickhouse.Table {
	return table(TableEnvironments, []clickhouse.Column{
		{Name: ColumnEnvironmentID, Type: typeString, SortingKey: true},
		{Name: "environment", Type: typeString},
		{Name: "property_id", Type: typeString},
		{Name: "property", Type: typeString},
		{Name: "organization_id", Type: typeString},
		{Name: ColumnSeenAt, Type: typeDateTime},
		{Name: ColumnVersion, Type: typeUInt64},
	}, ColumnEnvironmentID)
}

// CertificatesTable is the tls_certificates table: one row per certificate
// of an environment (spec 2.6 without the PEM bodies).
func CertificatesTable() *clickhouse.Table {
	return table(TableTLSCertificates, []clickhouse.Column{
		{Name: ColumnEnvironmentID, Type: typeString, SortingKey: true},
		{Name: ColumnCertificateID, Type: typeString, SortingKey: true},
		{Name: "common_name", Type: typeString},
		{Name: "alternative_names", Type: "Array(String)"},
		{Name: "serial", Type: typeString},
		{Name: "status", Type: typeString},
		{Name: "generated", Type: typeUInt8},
		{Name: "activation_error", Type: typeString},
		{Name: "expiration", Type: typeDateTime},
		{Name: "created_at", Type: typeDateTime},
		{Name: "updated_at", Type: typeDateTime},
		{Name: ColumnRemoved, Type: typeUInt8},
		{Name: ColumnSeenAt, Type: typeDateTime},
		{Name: ColumnVersion, Type: typeUInt64},
	}, ColumnEnvironmentID, ColumnCertificateID)
}

// table is a ReplacingMergeTree(version) ordered by key, unpartitioned (a
// row per environment or certificate), sharded on a cluster by environment
// so that every version of a row is on one shard.
func table(name string, cols []clickhouse.Column, key ...string) *clickhouse.Table {
	orderBy := make([]string, len(key))
	for i, k := range key {
		orderBy[i] = clickhouse.QuoteIdent(k)
	}
	return &clickhouse.Table{
		Name:           name,
		Columns:        cols,
		Engine:         "ReplacingMergeTree",
		EngineArgs:     []string{clickhouse.QuoteIdent(ColumnVersion)},
		OrderBy:        orderBy,
		ShardingKey:    "cityHash64(" + clickhouse.QuoteIdent(ColumnEnvironmentID) + ")",
		WritesOwnTypes: true,
	}
}
