package clickhouse

import (
	"errors"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
)

// ErrorCode returns the ClickHouse server exception code in err (such as 60
// for UNKNOWN_TABLE), or 0 when err is not a server exception.
func ErrorCode(err error) int32 {
	var ex *ch.Exception
	if errors.As(err, &ex) {
		return ex.Code
	}
	return 0
}

// RetriableCode reports whether a server exception is worth retrying as is
// (overload, memory, timeouts, a shard or ZooKeeper out of reach), as
// opposed to a rejection of the data.
func RetriableCode(code int32) bool {
	switch code {
	case 159, 160, 164, 201, 202, 203, 209, 210, 225, 241, 242, 252, 279, 285, 286, 319, 425, 473, 999:
		// TIMEOUT_EXCEEDED, TOO_SLOW, READONLY, QUOTA_EXPIRED, TOO_MANY_SIMULTANEOUS_QUERIES,
		// NO_FREE_CONNECTION, SOCKET_TIMEOUT, NETWORK_ERROR, NO_ZOOKEEPER, MEMORY_LIMIT_EXCEEDED,
		// TABLE_IS_READ_ONLY, TOO_MANY_PARTS, ALL_CONNECTION_TRIES_FAILED, TOO_FEW_LIVE_REPLICAS,
		// UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE, UNKNOWN_STATUS_OF_INSERT, SYSTEM_ERROR,
		// DEADLOCK_AVOIDED, KEEPER_EXCEPTION
		return true
	}
	return false
}

// SchemaCode reports whether a server exception says the schema is not (or
// not yet) what the statement expects: a database, table or column is
// missing or was dropped, or the schema is changing under it. Reading the
// schema again and repairing it (Schema.Ensure) fixes it, so a writer
// retries; it is never a reason to drop rows.
func SchemaCode(code int32) bool {
	switch code {
	case 8, 10, 15, 16, 47, 57, 60, 81, 122, 218, 341, 517:
		// THERE_IS_NO_COLUMN, NOT_FOUND_COLUMN_IN_BLOCK, DUPLICATE_COLUMN, NO_SUCH_COLUMN_IN_TABLE,
		// UNKNOWN_IDENTIFIER, TABLE_ALREADY_EXISTS, UNKNOWN_TABLE, UNKNOWN_DATABASE,
		// INCOMPATIBLE_COLUMNS, TABLE_IS_DROPPED, UNFINISHED (an ALTER waiting for replicas),
		// CANNOT_ASSIGN_ALTER (a replica has not applied the previous ALTER yet)
		return true
	}
	return false
}

// SchemaError is returned by Schema.Ensure when a table is not yet in the
// shape writers need and could not be completed now (a node or replica out
// of reach, an ALTER that must wait). It is transient: retry later.
type SchemaError struct {
	// Table is the table's name.
	Table string
	// Reason says what is missing or waiting.
	Reason string
}

func (e *SchemaError) Error() string {
	return "ClickHouse table " + e.Table + " is not ready: " + e.Reason
}

// deniedCode reports whether a server exception refuses the user rather
// than the data: wrong credentials or missing grants, which an operator
// fixes while the writer retries.
func deniedCode(code int32) bool {
	switch code {
	case 192, 193, 194, 195, 291, 497, 516:
		// UNKNOWN_USER, WRONG_PASSWORD, REQUIRED_PASSWORD, IP_ADDRESS_NOT_ALLOWED,
		// DATABASE_ACCESS_DENIED, ACCESS_DENIED, AUTHENTICATION_FAILED
		return true
	}
	return false
}

// Error classes of ErrorClass, the "class" label of insert-error counters.
// Only ClassRejected is about the rows themselves; every other class is
// retried with the same rows.
const (
	ClassConnection = "connection"  // no server exception: the server was not reached
	ClassServerBusy = "server_busy" // a RetriableCode: retry as is
	ClassSchema     = "schema"      // the table, a column or the database is missing or changing (SchemaCode, SchemaError): repair the schema (Schema.Ensure), retry
	ClassDenied     = "denied"      // authentication or permissions: retry until an operator fixes them
	ClassRejected   = "rejected"    // the server refused the statement or its data: the same rows fail again
)

// ErrorClass classifies err as one of the Class constants. It is the one
// classification both programs' ClickHouse sinks use. Besides server
// exceptions, a SchemaError and clickhouse-go's own refusal to convert a Go
// value to a column's type (the column's type changed since the writer read
// it) count as ClassSchema.
//
// Over the HTTP interface a server exception is classified by its code
// like over the native protocol; a response without one (from a proxy or
// load balancer in front of ClickHouse) by its status: 401 and 403 are
// ClassDenied, 408, 429 and 5xx ClassServerBusy, 413 (the INSERT is too
// large for the proxy) ClassRejected, so that a writer splits it; others
// ClassConnection.
func ErrorClass(err error) string {
	var se *SchemaError
	var conv *column.ColumnConverterError
	var unsupported *column.UnsupportedColumnTypeError
	if code := ErrorCode(err); code != 0 {
		return ErrorClassOf(code)
	}
	if errors.As(err, &se) || errors.As(err, &conv) || errors.As(err, &unsupported) {
		return ClassSchema
	}
	var httpErr *ch.HTTPError
	if errors.As(err, &httpErr) {
		return httpStatusClass(httpErr.StatusCode)
	}
	return ClassConnection
}

// httpStatusClass classifies an HTTP status that came without a server
// exception.
func httpStatusClass(status int) string {
	switch {
	case status == 401 || status == 403:
		return ClassDenied
	case status == 413:
		return ClassRejected
	case status == 408 || status == 429 || status >= 500:
		return ClassServerBusy
	}
	return ClassConnection
}

// ErrorClassOf is ErrorClass for a server exception code (0: none).
func ErrorClassOf(code int32) string {
	switch {
	case code == 0:
		return ClassConnection
	case RetriableCode(code):
		return ClassServerBusy
	case SchemaCode(code):
		return ClassSchema
	case deniedCode(code):
		return ClassDenied
	}
	return ClassRejected
}
