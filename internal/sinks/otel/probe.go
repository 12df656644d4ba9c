package otel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
)

// Probe sends exp one export request that carries the resource and no
// metric, and returns the receiver's answer: the endpoint, protocol, TLS
// and headers work when it is nil. Collectors take such a request and
// store nothing. The exporter is shut down afterwards.
func Probe(ctx context.Context, exp Exporter, res *resource.Resource) error {
	err := exp.Export(ctx, &metricdata.ResourceMetrics{Resource: res})
	return errors.Join(err, exp.Shutdown(ctx))
}
