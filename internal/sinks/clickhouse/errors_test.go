package clickhouse

import (
	"errors"
	"fmt"
	"testing"

	ch "github.com/ClickHouse/clickhouse-go/v2"
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
		{"unknown table", &ch.Exception{Code: 60}, 60, ClassRejected},
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
