package clickhouse

import (
	"errors"
	"fmt"
	"testing"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
)

func TestErrorClass(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		code int32
		want string
	}{
		{"no server exception", errors.New("dial tcp: connection refused"), 0, ClassConnection},
		{"memory limit", &ch.Exception{Code: 241}, 241, ClassServerBusy},
		{"too many parts, wrapped", fmt.Errorf("insert: %w", &ch.Exception{Code: 252}), 252, ClassServerBusy},
		{"type mismatch", &ch.Exception{Code: 53}, 53, ClassRejected},
		{"unknown table", &ch.Exception{Code: 60}, 60, ClassSchema},
		{"no such column through a Distributed table", fmt.Errorf("insert: %w", &ch.Exception{Code: 16}), 16, ClassSchema},
		{"unknown database", &ch.Exception{Code: 81}, 81, ClassSchema},
		{"alter waiting for replicas", &ch.Exception{Code: 341}, 341, ClassSchema},
		{"schema not complete yet", fmt.Errorf("ensure: %w", &SchemaError{Table: "t", Reason: "node down"}), 0, ClassSchema},
		{"shard unreachable", &ch.Exception{Code: 279}, 279, ClassServerBusy},
		{"quorum of the previous insert pending", &ch.Exception{Code: 286}, 286, ClassServerBusy},
		{"no such column", fmt.Errorf("prepare: %w", &ch.Exception{Code: 16}), 16, ClassSchema},
		{"column type changed (client side)", fmt.Errorf("append: %w", &column.ColumnConverterError{Op: "Append", From: "[]string", To: "UInt16"}), 0, ClassSchema},
		{"wrong password", &ch.Exception{Code: 516}, 516, ClassDenied},
		{"throwIf in a DEFAULT", &ch.Exception{Code: 395}, 395, ClassRejected},
		{"syntax error", &ch.Exception{Code: 62}, 62, ClassRejected},
		// Over HTTP: a server exception by its code, a bare status by the status.
		{"HTTP: unknown table", fmt.Errorf("sendQuery: %w", &ch.HTTPError{StatusCode: 404, Err: &ch.Exception{Code: 60}}), 60, ClassSchema},
		{"HTTP: memory limit", &ch.HTTPError{StatusCode: 500, Err: &ch.Exception{Code: 241}}, 241, ClassServerBusy},
		{"HTTP: type mismatch", &ch.HTTPError{StatusCode: 400, Err: &ch.Exception{Code: 53}}, 53, ClassRejected},
		{"HTTP: authentication failed", &ch.HTTPError{StatusCode: 403, Err: &ch.Exception{Code: 516}}, 516, ClassDenied},
		{"HTTP: mid-stream exception", fmt.Errorf("batch: %w", &ch.Exception{Code: 252}), 252, ClassServerBusy},
		{"HTTP: proxy 502", &ch.HTTPError{StatusCode: 502, Err: errors.New("bad gateway")}, 0, ClassServerBusy},
		{"HTTP: proxy 429", &ch.HTTPError{StatusCode: 429, Err: errors.New("slow down")}, 0, ClassServerBusy},
		{"HTTP: proxy refuses the user", &ch.HTTPError{StatusCode: 401, Err: errors.New("unauthorized")}, 0, ClassDenied},
		{"HTTP: proxy body limit", &ch.HTTPError{StatusCode: 413, Err: errors.New("too large")}, 0, ClassRejected},
		{"HTTP: wrong path", &ch.HTTPError{StatusCode: 404, Err: errors.New("not found")}, 0, ClassConnection},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ErrorCode(tc.err); got != tc.code {
				t.Errorf("ErrorCode = %d, want %d", got, tc.code)
			}
			if got := ErrorClass(tc.err); got != tc.want {
				t.Errorf("ErrorClass = %q, want %q", got, tc.want)
			}
		})
	}
}
