package deploytest

import (
	"context"
	"fmt"
	"math"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// RunPromQL runs expr as Grafana would (a range query over the dashboard's
// range for time series, an instant query at its end for instant targets)
// and returns the number of finite samples and the series they belong to.
func RunPromQL(api promv1.API, expr string, instant bool, v Values) (int, []model.Metric, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		val model.Value
		err error
	)
	if instant {
		val, _, _, err = api.Query(ctx, expr, v.To)
	} else {
		val, _, _, err = api.QueryRange(ctx, expr, promv1.Range{Start: v.From, End: v.To, Step: 5 * time.Second})
	}
	if err != nil {
		return 0, nil, err
	}
	n := 0
	finite := func(f model.SampleValue) {
		if !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) {
			n++
		}
	}
	var series []model.Metric
	switch r := val.(type) {
	case model.Vector:
		for _, s := range r {
			finite(s.Value)
			series = append(series, s.Metric)
		}
	case model.Matrix:
		for _, s := range r {
			for _, p := range s.Values {
				finite(p.Value)
			}
			series = append(series, s.Metric)
		}
	case *model.Scalar:
		finite(r.Value)
	default:
		return 0, nil, fmt.Errorf("unexpected result type %s", val.Type())
	}
	return n, series, nil
}
