package schedule

import (
	"bytes"
	"encoding/gob"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

// stateVersion is the version of the encoding of a dataset's state that
// Snapshot writes and Restore reads.
const stateVersion = 1

// datasetState is a dataset's part of the tracker as Snapshot encodes it
// (encoding/gob). Times are Unix nanoseconds.
type datasetState struct {
	Version int
	Dataset string
	Labels  []string
	Metrics []string
	// HighWaterMarks by environment.
	HighWaterMarks map[string]int64
	Newest         int64
	PointTime      int64
	Series         []seriesState
}

type seriesState struct {
	Environment string
	Labels      []string
	Start       int64
	Newest      int64
	Totals      []float64
	PointTime   int64
	PointTotals []float64
	// BucketTimes and BucketValues are the settle window's buckets:
	// start times ascending, and the values last published for each.
	BucketTimes  []int64
	BucketValues [][]float64
}

// Snapshot encodes what the tracker holds for dataset: HighWaterMarks, the
// values last published for the buckets of the settle window, and every
// series' totals, start and last point. Restore reads it back.
func (t *Tracker) Snapshot(dataset string) ([]byte, error) {
	t.mu.Lock()
	st := datasetState{Version: stateVersion, Dataset: dataset, HighWaterMarks: map[string]int64{}}
	if d := t.datasets[dataset]; d != nil {
		st.Labels, st.Metrics = d.labels, d.metrics
		st.Newest, st.PointTime = d.newest, d.pointT
		for e, h := range d.hwm {
			st.HighWaterMarks[e] = h.UnixNano()
		}
		st.Series = make([]seriesState, 0, len(d.series))
		for _, s := range d.series {
			ss := seriesState{Environment: s.env, Labels: s.labels, Start: s.start, Newest: s.newest,
				Totals: s.totals, PointTime: s.pointT, PointTotals: s.pointTotals,
				BucketTimes: make([]int64, len(s.buckets)), BucketValues: make([][]float64, len(s.buckets))}
			for i, b := range s.buckets {
				ss.BucketTimes[i], ss.BucketValues[i] = b.t, b.values
			}
			st.Series = append(st.Series, ss)
		}
	}
	var buf bytes.Buffer
	err := gob.NewEncoder(&buf).Encode(&st)
	t.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("encode the state of %s: %w", dataset, err)
	}
	return buf.Bytes(), nil
}

// ErrBadState is wrapped by Restore's errors: the state cannot be used.
var ErrBadState = errors.New("unusable state")

// Restore replaces what the tracker holds for dataset with a Snapshot of it,
// checked entirely before anything is applied. Environments it holds resume
// at their HighWaterMarks; the next poll of the dataset republishes every
// bucket it fetches and the totals of every live series (sinks that start
// empty get them back) without counting anything again. Call it before the
// scheduler runs.
func (t *Tracker) Restore(dataset string, state []byte) error {
	var st datasetState
	if err := gob.NewDecoder(bytes.NewReader(state)).Decode(&st); err != nil {
		return fmt.Errorf("%w of %s: decode: %w", ErrBadState, dataset, err)
	}
	d, err := st.track(dataset)
	if err != nil {
		return fmt.Errorf("%w of %s: %w", ErrBadState, dataset, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.datasets[dataset] = d
	return nil
}

// track checks st and builds the dataset's track from it.
func (st *datasetState) track(dataset string) (*datasetTrack, error) {
	switch {
	case st.Version != stateVersion:
		return nil, fmt.Errorf("version %d, this program reads version %d", st.Version, stateVersion)
	case st.Dataset != dataset:
		return nil, fmt.Errorf("it holds dataset %q", st.Dataset)
	}
	d := &datasetTrack{
		hwm:     make(map[string]time.Time, len(st.HighWaterMarks)),
		resume:  make(map[string]time.Time),
		asked:   make(map[string]bool),
		series:  make(map[string]*seriesTrack, len(st.Series)),
		labels:  st.Labels,
		metrics: st.Metrics,
		newest:  st.Newest,
		pointT:  st.PointTime,
		replay:  true,
	}
	for e, h := range st.HighWaterMarks {
		d.hwm[e] = time.Unix(0, h).UTC()
	}
	nm := len(st.Metrics)
	for i := range st.Series {
		ss := &st.Series[i]
		switch {
		case len(ss.Labels) != len(st.Labels):
			return nil, fmt.Errorf("series %d has %d labels, the dataset %d", i, len(ss.Labels), len(st.Labels))
		case len(ss.Totals) != nm || (ss.PointTotals != nil && len(ss.PointTotals) != nm):
			return nil, fmt.Errorf("series %d has totals for %d metrics, the dataset has %d", i, len(ss.Totals), nm)
		case len(ss.BucketTimes) != len(ss.BucketValues):
			return nil, fmt.Errorf("series %d has %d bucket times and %d value lists", i, len(ss.BucketTimes), len(ss.BucketValues))
		case !slices.IsSorted(ss.BucketTimes):
			return nil, fmt.Errorf("series %d: buckets out of order", i)
		}
		for j, m := range st.Metrics {
			count := metricsapi.Classify(m).Kind == metricsapi.KindCount
			if v := ss.Totals[j]; count && (math.IsNaN(v) || math.IsInf(v, 0) || v < 0) {
				return nil, fmt.Errorf("series %d: total of %s is %v", i, m, v)
			}
		}
		s := &seriesTrack{env: ss.Environment, labels: ss.Labels, start: ss.Start, newest: ss.Newest,
			totals: ss.Totals, pointT: ss.PointTime, pointTotals: ss.PointTotals}
		s.buckets = make([]bucketValues, len(ss.BucketTimes))
		for j, bt := range ss.BucketTimes {
			if len(ss.BucketValues[j]) != nm {
				return nil, fmt.Errorf("series %d: a bucket has %d values, the dataset %d metrics", i, len(ss.BucketValues[j]), nm)
			}
			s.buckets[j] = bucketValues{t: bt, values: ss.BucketValues[j]}
		}
		key := (&metricsapi.Row{Environment: s.env, Labels: s.labels}).SeriesKey()
		if _, dup := d.series[key]; dup {
			return nil, fmt.Errorf("series %d appears twice", i)
		}
		d.series[key] = s
	}
	return d, nil
}
