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

// Error classes of ErrorClass, the "class" label of insert-error counters.
const (
	ClassConnection = "connection"  // no server exception: the server was not reached
	ClassServerBusy = "server_busy" // a RetriableCode: retry as is
	ClassRejected   = "rejected"    // the server refused the statement or its data
)

// ErrorClass classifies err as ClassConnection, ClassServerBusy or
// ClassRejected.
func ErrorClass(err error) string { return ErrorClassOf(ErrorCode(err)) }

// ErrorClassOf is ErrorClass for a server exception code (0: none).
func ErrorClassOf(code int32) string {
	switch {
	case code == 0:
		return ClassConnection
	case RetriableCode(code):
		return ClassServerBusy
	}
	return ClassRejected
}
