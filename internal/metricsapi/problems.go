package metricsapi

import "maps"

// Why a metric value of an answer is not a value. These are the reason
// labels of edgepipe_invalid_values_total. A value is a finite number, and
// for a count (KindCount) one that is not negative; anything else leaves the
// bucket without a value for that metric (Row.Values holds NaN there).
const (
	// InvalidNull is null, an empty string, or a metric the answer has no
	// field for.
	InvalidNull = "null"
	// InvalidNaN is "NaN" (a string; JSON has no NaN literal).
	InvalidNaN = "nan"
	// InvalidInf is ±Infinity, or a number too large for a float64.
	InvalidInf = "inf"
	// InvalidNegative is a count below zero.
	InvalidNegative = "negative"
	// InvalidText is any other string, a boolean, an array or an object.
	InvalidText = "not_a_number"
)

// InvalidValueReasons lists every reason a value is not one.
var InvalidValueReasons = []string{InvalidNull, InvalidNaN, InvalidInf, InvalidNegative, InvalidText}

// Why a row of an answer is skipped whole. These are the reason labels of
// edgepipe_invalid_rows_total. The other rows of the answer are used.
const (
	// RowNotArray is a row that is not a JSON array.
	RowNotArray = "not_an_array"
	// RowArity is a row with more or fewer values than data_fields.
	RowArity = "arity"
	// RowTime is a row whose time is missing, unreadable or not the start
	// of a bucket of the request's granularity.
	RowTime = "time"
	// RowEnvironment is a row whose environment_id is missing, not a
	// string, or not one the request asked for.
	RowEnvironment = "environment"
	// RowDimension is a row with a dimension value that is an array or an
	// object.
	RowDimension = "dimension"
)

// InvalidRowReasons lists every reason a row is skipped.
var InvalidRowReasons = []string{RowNotArray, RowArity, RowTime, RowEnvironment, RowDimension}

// Problems counts what decoding left out of answers: metric values that are
// not values, and malformed rows. Only an answer that cannot be parsed at
// all fails a request; everything else is counted here.
type Problems struct {
	// Values counts the metric values that are not values, by reason
	// (Invalid*).
	Values map[string]int
	// Rows counts the rows skipped whole, by reason (Row*).
	Rows map[string]int
	// ValueExample and RowExample describe the first of each, for a log
	// line ("" when there was none).
	ValueExample, RowExample string
}

// Empty reports whether nothing was left out.
func (p *Problems) Empty() bool { return len(p.Values) == 0 && len(p.Rows) == 0 }

// InvalidValues is the number of values that were not values.
func (p *Problems) InvalidValues() int { return sum(p.Values) }

// InvalidRows is the number of rows skipped.
func (p *Problems) InvalidRows() int { return sum(p.Rows) }

// Add counts o's problems in p too, keeping p's examples when it has them.
func (p *Problems) Add(o Problems) {
	if len(o.Values) > 0 {
		if p.Values == nil {
			p.Values = maps.Clone(o.Values)
		} else {
			for k, v := range o.Values {
				p.Values[k] += v
			}
		}
	}
	if len(o.Rows) > 0 {
		if p.Rows == nil {
			p.Rows = maps.Clone(o.Rows)
		} else {
			for k, v := range o.Rows {
				p.Rows[k] += v
			}
		}
	}
	if p.ValueExample == "" {
		p.ValueExample = o.ValueExample
	}
	if p.RowExample == "" {
		p.RowExample = o.RowExample
	}
}

func (p *Problems) value(reason string, example func() string) {
	if p.Values == nil {
		p.Values = make(map[string]int)
	}
	p.Values[reason]++
	if p.ValueExample == "" {
		p.ValueExample = example()
	}
}

func (p *Problems) row(reason string, example func() string) {
	if p.Rows == nil {
		p.Rows = make(map[string]int)
	}
	p.Rows[reason]++
	if p.RowExample == "" {
		p.RowExample = example()
	}
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
