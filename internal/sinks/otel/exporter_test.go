package otel

import "testing"

func TestProtocolAndEnabled(t *testing.T) {
	for _, tc := range []struct {
		flag, envAll, envMetrics, want string
		bad                            bool
	}{
		{"", "", "", ProtocolGRPC, false},
		{"http/protobuf", "", "", ProtocolHTTP, false},
		{"", "http/protobuf", "", ProtocolHTTP, false},
		{"", "grpc", "http/protobuf", ProtocolHTTP, false},
		{"grpc", "http/protobuf", "", ProtocolGRPC, false},
		{"http/json", "", "", "", true},
	} {
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", tc.envAll)
		t.Setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", tc.envMetrics)
		got, err := Protocol(tc.flag)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("Protocol(%q) with env %q/%q = %q, %v; want %q", tc.flag, tc.envAll, tc.envMetrics, got, err, tc.want)
		}
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "")
	if Enabled("") {
		t.Error("enabled without endpoint")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://collector:4318/v1/metrics")
	if !Enabled("") {
		t.Error("not enabled by OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
	}
}
