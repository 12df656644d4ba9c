package clickhouse

import (
	"errors"

	ch "github.com/ClickHouse/clickhouse-go/v2"
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
// missing, or the schema is changing under it. Such an error is transient
// for a writer that repairs the schema (Schema.Ensure) and retries; it is
// never a reason to drop rows.
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

// IsSchemaError reports whether err is a SchemaError or a server exception
// of a SchemaCode.
func IsSchemaError(err error) bool {
	var se *SchemaError
	return errors.As(err, &se) || SchemaCode(ErrorCode(err))
}

// Error classes of ErrorClass, the "class" label of insert-error counters.
const (
	ClassConnection = "connection"  // no server exception: the server was not reached
	ClassServerBusy = "server_busy" // a RetriableCode: retry as is
	ClassSchema     = "schema"      // IsSchemaError: repair the schema, then retry
	ClassRejected   = "rejected"    // the server refused the statement or its data
)

// ErrorClass classifies err as ClassConnection, ClassServerBusy,
// ClassSchema or ClassRejected. Only ClassRejected is a verdict on the data;
// the other classes are transient.
func ErrorClass(err error) string {
	var se *SchemaError
	if errors.As(err, &se) {
		return ClassSchema
	}
	return ErrorClassOf(ErrorCode(err))
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
	}
	return ClassRejected
}
