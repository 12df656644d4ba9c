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
// (overload, memory, timeouts), as opposed to a rejection of the data.
func RetriableCode(code int32) bool {
	switch code {
	case 159, 160, 164, 201, 202, 203, 209, 210, 241, 242, 252, 285, 319, 425, 999:
		// TIMEOUT_EXCEEDED, TOO_SLOW, READONLY, QUOTA_EXPIRED, TOO_MANY_SIMULTANEOUS_QUERIES,
		// NO_FREE_CONNECTION, SOCKET_TIMEOUT, NETWORK_ERROR, MEMORY_LIMIT_EXCEEDED,
		// TABLE_IS_READ_ONLY, TOO_MANY_PARTS, TOO_FEW_LIVE_REPLICAS, UNKNOWN_STATUS_OF_INSERT,
		// SYSTEM_ERROR, KEEPER_EXCEPTION
		return true
	}
	return false
}

// schemaCode reports whether a server exception says that the database, a
// table or a column is not what the writer knows (dropped, renamed, never
// created): reading the schema again (and creating what is missing) fixes it.
func schemaCode(code int32) bool {
	switch code {
	case 8, 10, 16, 47, 60, 81, 218:
		// THERE_IS_NO_COLUMN, NOT_FOUND_COLUMN_IN_BLOCK, NO_SUCH_COLUMN_IN_TABLE,
		// UNKNOWN_IDENTIFIER, UNKNOWN_TABLE, UNKNOWN_DATABASE, TABLE_IS_DROPPED
		return true
	}
	return false
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
	ClassSchema     = "schema"      // the table, a column or the database is missing or changed: read the schema again, re-create what is missing, retry
	ClassDenied     = "denied"      // authentication or permissions: retry until an operator fixes them
	ClassRejected   = "rejected"    // the server refused the statement or its data: the same rows fail again
)

// ErrorClass classifies err as one of the Class constants. It is the one
// classification both programs' ClickHouse sinks use. Besides server
// exceptions, clickhouse-go's own refusal to convert a Go value to a
// column's type counts as ClassSchema: the column's type changed since the
// writer read it.
func ErrorClass(err error) string {
	var conv *column.ColumnConverterError
	var unsupported *column.UnsupportedColumnTypeError
	if code := ErrorCode(err); code != 0 || !(errors.As(err, &conv) || errors.As(err, &unsupported)) {
		return ErrorClassOf(code)
	}
	return ClassSchema
}

// ErrorClassOf is ErrorClass for a server exception code (0: none).
func ErrorClassOf(code int32) string {
	switch {
	case code == 0:
		return ClassConnection
	case RetriableCode(code):
		return ClassServerBusy
	case schemaCode(code):
		return ClassSchema
	case deniedCode(code):
		return ClassDenied
	}
	return ClassRejected
}
