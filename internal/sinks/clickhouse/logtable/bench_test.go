package logtable

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
)

// BenchmarkBuildColumns measures the conversion of 500-record batches with
// every catalogue field into typed columns (the receiver's CPU per record
// on the ClickHouse path, without the server).
func BenchmarkBuildColumns(b *testing.B) {
	fields := accesslog.Fields()
	cols, err := accessColumns(clickhouse.Version{}, fields, nil)
	if err != nil {
		b.Fatal(err)
	}
	var batches []*accesslog.Batch
	bytes := 0
	for n := 0; n < 4; n++ {
		batch := &accesslog.Batch{EnvironmentID: "env", Format: accesslog.FormatJSON, AgentID: "agent", Datestamp: "20261123", SeqNum: int64(n), ProfileID: "1"}
		for j := 0; j < 500; j++ {
			var sb strings.Builder
			sb.WriteByte('{')
			for k, f := range fields {
				if k > 0 {
					sb.WriteByte(',')
				}
				sb.WriteString(strconv.Quote(f.Code) + ":")
				switch f.Type {
				case accesslog.TypeTimestamp:
					fmt.Fprintf(&sb, "%d.%06d", 1763856000+j, j)
				case accesslog.TypeInteger:
					sb.WriteString(strconv.Itoa(j * k))
				case accesslog.TypeFloat:
					sb.WriteString(strconv.FormatFloat(float64(j)/7, 'f', 6, 64))
				default:
					fmt.Fprintf(&sb, `"%s-%d"`, f.Code, j%50)
				}
			}
			sb.WriteByte('}')
			batch.Records = append(batch.Records, json.RawMessage(sb.String()))
			bytes += sb.Len()
		}
		batches = append(batches, batch)
	}
	b.SetBytes(int64(bytes))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d := buildColumns(batches, cols, 1)
		if d.rows != 2000 {
			b.Fatal(d.rows)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2000, "ns/record")
}
