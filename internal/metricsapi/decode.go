package metricsapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// DataField describes one column of a data response.
type DataField struct {
	Name        string   `json:"name"`
	Description string   `json:"description,omitempty"`
	DataType    DataType `json:"data_type"`
}

// dataResponse is the body of a data answer (spec 2.8). Rows stay raw until
// decodeRows reads them by field name.
type dataResponse struct {
	DataFields []DataField     `json:"data_fields"`
	DataRows   json.RawMessage `json:"data_rows"`
}

// rowChunk is how many rows' label and value storage is allocated at once.
const rowChunk = 1024

// decodeRows turns the rows of one answer to r into Rows. Fields are found by
// name in any order; fields not asked for are ignored. Values may be JSON
// numbers or numeric strings; a value that is not one (see Invalid*) reads
// as NaN, so the bucket has no value for that metric, and is counted in the
// Problems. A malformed row (see Row*) is skipped and counted; the others
// are used. Only an answer whose data_fields do not match the request, or
// whose data_rows are not a JSON array of rows, is an error.
func decodeRows(r *Request, resp *dataResponse) ([]Row, Problems, error) {
	var probs Problems
	fail := func(format string, a ...any) ([]Row, Problems, error) {
		return nil, Problems{}, fmt.Errorf("dataset %s: %s", r.Dataset, fmt.Sprintf(format, a...))
	}
	index := make(map[string]int, len(resp.DataFields))
	for i, f := range resp.DataFields {
		if _, dup := index[f.Name]; dup {
			return fail("data field %q appears twice", f.Name)
		}
		index[f.Name] = i
	}
	timeIdx, ok := index[DimensionTime]
	if !ok {
		return fail("answer has no %s field", DimensionTime)
	}
	envIdx, ok := index[DimensionEnvironment]
	if !ok {
		if len(r.Environments) != 1 {
			return fail("answer has no %s field", DimensionEnvironment)
		}
		envIdx = -1
	}
	asked := make(map[string]bool, len(r.Environments))
	for _, e := range r.Environments {
		asked[e] = true
	}
	labelIdx := make([]int, len(r.Labels))
	labelNumeric := make([]bool, len(r.Labels))
	for i, l := range r.Labels {
		j, ok := index[l]
		if !ok {
			return fail("answer has no field for dimension %q", l)
		}
		labelIdx[i] = j
		labelNumeric[i] = resp.DataFields[j].DataType == TypeNumber
	}
	metricIdx := make([]int, len(r.Metrics))
	isCount := make([]bool, len(r.Metrics))
	for i, m := range r.Metrics {
		j, ok := index[m]
		if !ok {
			j = -1
		}
		metricIdx[i] = j
		isCount[i] = Classify(m).Kind == KindCount
	}

	var (
		rows   []Row
		labels []string  // storage for the next rows' labels
		values []float64 // and values
		// Environments, label values and times repeat across rows: parse
		// each distinct raw value once and share the result.
		envs      = map[string]string{}
		labelSeen = make([]map[string]string, len(r.Labels))
		times     = map[string]time.Time{}
	)
	for i := range labelSeen {
		labelSeen[i] = map[string]string{}
	}
	sc := newRowScanner(resp.DataRows)
	var (
		sr scannedRow
		n  int
	)
	skip := func(reason, format string, a ...any) {
		probs.row(reason, func() string {
			return fmt.Sprintf("row %d %s: %s", n, abbrev(sr.raw), fmt.Sprintf(format, a...))
		})
	}
	for ; ; n++ {
		var ok bool
		var err error
		sr, ok, err = sc.next()
		if err != nil {
			return fail("row %d: %v", n, err)
		}
		if !ok {
			break
		}
		raw := sr.vals
		if !sr.array {
			skip(RowNotArray, "not an array")
			continue
		}
		if len(raw) != len(resp.DataFields) {
			skip(RowArity, "%d values for %d data fields", len(raw), len(resp.DataFields))
			continue
		}
		t, ok := times[string(raw[timeIdx])]
		if !ok {
			if t, err = parseTime(raw[timeIdx]); err == nil && !r.Granularity.Truncate(t).Equal(t) {
				err = fmt.Errorf("%s is not the start of a %s bucket", t.Format(time.RFC3339), r.Granularity)
			}
			if err != nil {
				skip(RowTime, "%s: %v", DimensionTime, err)
				continue
			}
			times[string(raw[timeIdx])] = t
		}
		env := r.Environments[0]
		if envIdx >= 0 {
			if env, ok = envs[string(raw[envIdx])]; !ok {
				env, err = parseString(raw[envIdx])
				if err != nil || !asked[env] {
					skip(RowEnvironment, "%s %s is not an environment the request asked for", DimensionEnvironment, abbrev(raw[envIdx]))
					continue
				}
				envs[string(raw[envIdx])] = env
			}
		}
		if len(labels) < len(r.Labels) {
			labels = make([]string, rowChunk*len(r.Labels))
		}
		row := Row{
			Time:        t,
			Environment: env,
			Labels:      labels[:len(r.Labels):len(r.Labels)],
		}
		badLabel := false
		for i, j := range labelIdx {
			v, ok := labelSeen[i][string(raw[j])]
			if !ok {
				if v, err = parseLabel(raw[j], labelNumeric[i]); err != nil {
					skip(RowDimension, "%s: %v", r.Labels[i], err)
					badLabel = true
					break
				}
				labelSeen[i][string(raw[j])] = v
			}
			row.Labels[i] = v
		}
		if badLabel {
			continue
		}
		labels = labels[len(r.Labels):]
		if len(values) < len(r.Metrics) {
			values = make([]float64, rowChunk*len(r.Metrics))
		}
		row.Values, values = values[:len(r.Metrics):len(r.Metrics)], values[len(r.Metrics):]
		for i, j := range metricIdx {
			var v json.RawMessage
			if j >= 0 {
				v = raw[j]
			}
			f, reason := parseValue(v, isCount[i])
			if reason != "" {
				probs.value(reason, func() string {
					shown := "no field"
					if j >= 0 {
						shown = abbrev(v)
					}
					return fmt.Sprintf("%s %s %s=%s", env, t.Format(time.RFC3339), r.Metrics[i], shown)
				})
			}
			row.Values[i] = f
		}
		rows = append(rows, row)
	}
	return rows, probs, nil
}

var null = []byte("null")

// parseValue classifies a metric value: a JSON number or numeric string
// that is finite (and, for a count, not negative) is a value; anything else
// returns NaN and the reason it is not one (see Invalid*). A nil or empty
// raw (no field) and an empty string read as null.
func parseValue(raw json.RawMessage, count bool) (float64, string) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, null) {
		return math.NaN(), InvalidNull
	}
	s := string(raw)
	switch raw[0] {
	case '"':
		var err error
		if s, err = parseString(raw); err != nil {
			return math.NaN(), InvalidText
		}
		s = strings.TrimSpace(s)
		if s == "" {
			return math.NaN(), InvalidNull
		}
	case '[', '{', 't', 'f':
		return math.NaN(), InvalidText
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		var ne *strconv.NumError
		if !errors.As(err, &ne) || !errors.Is(ne.Err, strconv.ErrRange) {
			return math.NaN(), InvalidText
		}
		// Out of range: ±Inf for overflow (caught below), 0 for underflow.
	}
	switch {
	case math.IsNaN(f):
		return math.NaN(), InvalidNaN
	case math.IsInf(f, 0):
		return math.NaN(), InvalidInf
	case count && f < 0:
		return math.NaN(), InvalidNegative
	}
	return f, ""
}

// parseString reads a JSON string.
func parseString(raw json.RawMessage) (string, error) {
	// Fast path: a string without escapes (the whole body was validated as
	// JSON already, so the quotes delimit it).
	if n := len(raw); n >= 2 && raw[0] == '"' && raw[n-1] == '"' && bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : n-1]), nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", err
	}
	return s, nil
}

// parseLabel renders a dimension value as text. Numbers (and, for NUMBER
// dimensions, numeric strings) are written in their shortest plain form, so
// the status code 503 reads "503" whether the API sent 503, 503.0 or "503".
// null reads as "".
func parseLabel(raw json.RawMessage, numeric bool) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, null) {
		return "", nil
	}
	switch raw[0] {
	case '"':
		s, err := parseString(raw)
		if err != nil {
			return "", fmt.Errorf("value %s: %w", abbrev(raw), err)
		}
		if numeric {
			if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
				return formatNumber(f), nil
			}
		}
		return s, nil
	case '{', '[':
		return "", fmt.Errorf("value %s is not a dimension value", abbrev(raw))
	case 't', 'f':
		return string(raw), nil
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil {
		return "", fmt.Errorf("value %s is not a dimension value", abbrev(raw))
	}
	return formatNumber(f), nil
}

func formatNumber(f float64) string {
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// timeLayouts are the forms of the time dimension the client accepts;
// layouts without a zone are UTC.
var timeLayouts = []string{
	time.RFC3339Nano,
	"2006-01-02T15:04:05.999999999",
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04Z07:00",
	"2006-01-02T15:04",
	"2006-01-02",
}

// parseTime reads the time dimension: ISO 8601 / RFC 3339 text (with or
// without zone, T or space, fractions allowed, or a bare date), or Unix time
// in seconds or milliseconds as a number or numeric string. The result is UTC.
func parseTime(raw json.RawMessage) (time.Time, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, null) {
		return time.Time{}, errors.New("no time")
	}
	s := string(raw)
	if raw[0] == '"' {
		var err error
		if s, err = parseString(raw); err != nil {
			return time.Time{}, fmt.Errorf("time %s: %w", abbrev(raw), err)
		}
		s = strings.TrimSpace(s)
		for _, layout := range timeLayouts {
			if t, err := time.Parse(layout, s); err == nil {
				return t.UTC(), nil
			}
		}
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) && f >= 0 {
		if f >= 1e11 { // milliseconds: 1e11 s is the year 5138
			return time.UnixMilli(int64(f)).UTC(), nil
		}
		sec, frac := math.Modf(f)
		return time.Unix(int64(sec), int64(math.Round(frac*1e9))).UTC(), nil
	}
	return time.Time{}, fmt.Errorf("time %s: not an ISO 8601 date-time or Unix time", abbrev(raw))
}

// abbrev quotes the start of a raw value for an error message.
func abbrev(raw []byte) string {
	const n = 40
	if len(raw) > n {
		return string(raw[:n]) + "…"
	}
	return string(raw)
}
