package otel

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
)

// ServiceName is the default service.name resource attribute.
const ServiceName = "edgepipe-exporter"

// Protocols accepted by NewExporter.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// Enabled reports whether OTLP export is configured: an endpoint flag, or
// one of the standard endpoint environment variables.
func Enabled(endpoint string) bool {
	return endpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" ||
		os.Getenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") != ""
}

// Protocol resolves the protocol: the flag value, else
// OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL,
// else grpc.
func Protocol(flag string) (string, error) {
	p := flag
	for _, env := range []string{"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p == "" {
			p = os.Getenv(env)
		}
	}
	switch strings.ToLower(strings.TrimSpace(p)) {
	case "", "grpc":
		return ProtocolGRPC, nil
	case "http/protobuf", "http":
		return ProtocolHTTP, nil
	}
	return "", fmt.Errorf("OTLP protocol %q: want grpc or http/protobuf", p)
}

// Temporality resolves the temporality of the count sums: the flag value,
// else OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, else cumulative
// (the OpenTelemetry default, and what Prometheus and Mimir take). The
// variable's "lowmemory" means cumulative here: it asks for delta only for
// synchronous counters, and the platform's counts are observed, like an
// asynchronous counter's.
func Temporality(flag string) (metricdata.Temporality, error) {
	const env = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"
	v, from := flag, "--otlp.temporality"
	if v == "" {
		v, from = os.Getenv(env), env
	}
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "cumulative":
		return metricdata.CumulativeTemporality, nil
	case "delta":
		return metricdata.DeltaTemporality, nil
	case "lowmemory":
		if from == env {
			return metricdata.CumulativeTemporality, nil
		}
	}
	return 0, fmt.Errorf("%s %q: want cumulative or delta", from, v)
}

// NewExporter returns the OTLP metric exporter for protocol. endpoint is
// either a URL (http:// for plaintext, https:// for TLS; for HTTP a URL
// without a path gets /v1/metrics) or host:port (TLS unless
// OTEL_EXPORTER_OTLP_INSECURE=true), or empty to let the exporter read the
// standard OTEL_EXPORTER_OTLP_* variables (headers, certificates, timeout,
// compression are always read from them). The exporter's own retry is off:
// the Sink retries.
func NewExporter(ctx context.Context, protocol, endpoint string) (Exporter, error) {
	isURL := strings.Contains(endpoint, "://")
	switch protocol {
	case ProtocolGRPC:
		opts := []otlpmetricgrpc.Option{otlpmetricgrpc.WithRetry(otlpmetricgrpc.RetryConfig{Enabled: false}),
			// The exporter's own size check (64 MiB) walks every request
			// once more before encoding it: a quarter of the export's CPU.
			// The Sink bounds requests by points (Options.MaxPoints), which
			// keeps them under the collectors' 4 MiB receive limit, far
			// under this one.
			otlpmetricgrpc.WithMaxRequestSize(0)}
		if isURL {
			opts = append(opts, otlpmetricgrpc.WithEndpointURL(endpoint))
		} else if endpoint != "" {
			opts = append(opts, otlpmetricgrpc.WithEndpoint(endpoint))
		}
		exp, err := otlpmetricgrpc.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("OTLP gRPC exporter: %w", err)
		}
		return exp, nil
	case ProtocolHTTP:
		opts := []otlpmetrichttp.Option{otlpmetrichttp.WithRetry(otlpmetrichttp.RetryConfig{Enabled: false})}
		if isURL {
			u, err := url.Parse(endpoint)
			if err != nil {
				return nil, fmt.Errorf("OTLP endpoint %q: %w", endpoint, err)
			}
			if u.Path == "" || u.Path == "/" {
				u.Path = "/v1/metrics"
			}
			opts = append(opts, otlpmetrichttp.WithEndpointURL(u.String()))
		} else if endpoint != "" {
			opts = append(opts, otlpmetrichttp.WithEndpoint(endpoint))
		}
		exp, err := otlpmetrichttp.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("OTLP HTTP exporter: %w", err)
		}
		return exp, nil
	}
	return nil, fmt.Errorf("OTLP protocol %q: want grpc or http/protobuf", protocol)
}

// NewResource describes the exporter: service.name=edgepipe-exporter,
// service.version, host.name and the SDK's telemetry.sdk.*, overridden by
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
func NewResource(ctx context.Context, version string) (*resource.Resource, error) {
	r, err := resource.New(ctx,
		resource.WithAttributes(
			attribute.String("service.name", ServiceName),
			attribute.String("service.version", version),
		),
		resource.WithHost(),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	)
	if err != nil {
		return nil, fmt.Errorf("OTel resource: %w", err)
	}
	return r, nil
}
