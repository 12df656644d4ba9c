package logtable

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
)

// columnType is a ClickHouse column type as the sink understands it: a base
// type, optionally Nullable and (for strings) LowCardinality.
type columnType struct {
	base     string // Int8 … Int64, UInt8 … UInt64, Float32, Float64, String, DateTime, DateTime64
	nullable bool
	raw      string // as the server names it
}

// parseColumnType understands the types a field column may have; it
// reports false for any other (Date, Decimal, FixedString, Enum, Array, …).
func parseColumnType(raw string) (columnType, bool) {
	t := columnType{raw: raw}
	s := strings.TrimSpace(raw)
	lowCardinality := false
	for {
		if inner, ok := unwrap(s, "Nullable"); ok {
			t.nullable, s = true, inner
			continue
		}
		if inner, ok := unwrap(s, "LowCardinality"); ok {
			lowCardinality, s = true, inner
			continue
		}
		break
	}
	switch {
	case s == "DateTime" || strings.HasPrefix(s, "DateTime("):
		t.base = "DateTime"
	case strings.HasPrefix(s, "DateTime64("):
		t.base = "DateTime64"
	case s == "String", s == "Float32", s == "Float64",
		s == "Int8", s == "Int16", s == "Int32", s == "Int64",
		s == "UInt8", s == "UInt16", s == "UInt32", s == "UInt64":
		t.base = s
	default:
		return t, false
	}
	if lowCardinality && t.base != "String" {
		return t, false
	}
	return t, true
}

func unwrap(s, wrapper string) (string, bool) {
	if strings.HasPrefix(s, wrapper+"(") && strings.HasSuffix(s, ")") {
		return strings.TrimSpace(s[len(wrapper)+1 : len(s)-1]), true
	}
	return "", false
}

func (t columnType) isInteger() bool { return strings.Contains(t.base, "Int") }
func (t columnType) isFloat() bool   { return strings.HasPrefix(t.base, "Float") }
func (t columnType) isTime() bool    { return strings.HasPrefix(t.base, "DateTime") }

// holds reports whether a column of type t can hold every value of a field
// of type ft (values out of the column's range go to extra).
func (t columnType) holds(ft accesslog.FieldType) bool {
	switch ft {
	case accesslog.TypeInteger:
		return t.isInteger() || t.isFloat() || t.base == "String"
	case accesslog.TypeFloat:
		return t.isFloat() || t.base == "String"
	case accesslog.TypeTimestamp:
		return t.isTime() || t.base == "Float64" || t.base == "String"
	}
	return t.base == "String"
}

// defaultType is the type the sink creates a field's column with on
// servers of version v: on modern servers (Modern) LowCardinality(String)
// for the string fields with few distinct values.
func defaultType(f accesslog.Field, v clickhouse.Version) string {
	switch f.Type {
	case accesslog.TypeInteger:
		return "Int64"
	case accesslog.TypeFloat:
		return "Float64"
	case accesslog.TypeTimestamp:
		if v.HasDateTime64() {
			return "DateTime64(6)"
		}
		return "DateTime"
	}
	if Modern(v) && lowCardinalityFields[f.Code] {
		return "LowCardinality(String)"
	}
	return "String"
}

// Modern reports whether access_logs gets the modern layout on servers of
// version v (20.1 on): LowCardinality for the fields with few values and
// codecs for timestamps, counters and long text. Older servers (18.16) get
// plain types, as before.
func Modern(v clickhouse.Version) bool { return v.HasLowCardinality() && v.HasCodecs() }

// lowCardinalityFields are the string fields with few distinct values (up
// to some thousands per table: methods, protocols, POPs, countries,
// cities, content types, TLS versions, WAF and bot verdicts…), stored as
// dictionaries: smaller, and faster to group by.
var lowCardinalityFields = map[string]bool{
	"account_number": true, "method": true, "scheme": true, "proto": true, "host": true, "file_ext": true,
	"accept_encoding": true, "client_ip_version": true, "client_country_code": true, "client_country": true,
	"client_region": true, "client_city": true, "client_as_org": true, "client_tls_version": true,
	"client_tls_cipher": true, "client_tls_sni": true, "content_type": true, "content_encoding": true,
	"cache_control": true, "cache_status": true, "cacheable": true, "prefetch": true, "pop": true,
	"edge_region": true, "server_ip": true, "origin_name": true, "origin_ip": true, "image_optimized": true,
	"waf_action": true, "waf_rule_id": true, "rate_limit_action": true, "bot_action": true, "is_bot": true,
}

// fieldCodec returns the codec a field's new column gets on modern servers
// (" CODEC(…)", or "" for the server's default, LZ4): Delta for
// timestamps, T64 for integers (counters, sizes, ports, codes), and ZSTD
// behind both and for floats and long text (paths, queries, user agents,
// referers); none for LowCardinality columns, whose dictionary already
// packs them.
func fieldCodec(f accesslog.Field, typ columnType, v clickhouse.Version) string {
	if !Modern(v) || strings.HasPrefix(typ.raw, "LowCardinality(") {
		return ""
	}
	switch {
	case typ.isTime():
		return " CODEC(Delta, ZSTD(1))"
	case typ.isInteger():
		return " CODEC(T64, ZSTD(1))"
	case typ.isFloat(), typ.base == "String" && f.Type == accesslog.TypeString:
		return " CODEC(ZSTD(1))"
	}
	return ""
}

// IncompatibleColumnError reports a column of access_logs whose type
// cannot hold its field: the sink refuses to write rather than lose or
// mangle the field's values.
type IncompatibleColumnError struct {
	Table, Column, Type string
	// Field is the field's value type; Want the type the sink would create.
	Field accesslog.FieldType
	Want  string
}

// Error implements error.
func (e *IncompatibleColumnError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("column %s of table %s has type %s, but the receiver writes it as %s; change it (ALTER TABLE %s MODIFY COLUMN %s %s) or drop the table",
			e.Column, e.Table, e.Type, e.Want, e.Table, e.Column, e.Want)
	}
	return fmt.Sprintf("column %s of table %s has type %s, which cannot hold the field %s (%s values); change it (ALTER TABLE %s MODIFY COLUMN %s %s) or drop the column",
		e.Column, e.Table, e.Type, e.Column, e.Field, e.Table, e.Column, e.Want)
}

// valueColumn holds one field column of an INSERT in the Go type its
// ClickHouse type takes.
type valueColumn interface {
	// add appends the JSON value v (vs is v's text as a string, shared with
	// its record) and reports whether the column can hold it; on false
	// nothing is appended (the caller adds the default and keeps v in
	// extra). JSON null is held: the default, or NULL when Nullable.
	add(v []byte, vs string) bool
	// addDefault appends the column's default (NULL when Nullable).
	addDefault()
	// dropLast removes the last value (a repeated key: the last one wins).
	dropLast()
	// data appends the column's slice (two for a timestamp with a
	// microseconds companion) to out.
	data(out []any) []any
}

// newValueColumn returns the buffer of column c for n rows.
func newValueColumn(c accessColumn, n int) valueColumn {
	t := c.typ
	switch {
	case t.base == "String":
		return &stringColumn{vals: make([]string, 0, n), nulls: nullsFor(t, n)}
	case t.isTime():
		tc := &timeColumn{vals: make([]time.Time, 0, n), nulls: nullsFor(t, n), min: 0, max: math.MaxUint32}
		if t.base == "DateTime64" {
			tc.min, tc.max = dateTime64Min, dateTime64Max
		}
		if c.fraction != "" {
			tc.fracs = make([]uint32, 0, n)
		}
		return tc
	}
	switch t.base {
	case "Int8":
		return newNumberColumn[int8](t, n, signed[int8](math.MinInt8, math.MaxInt8))
	case "Int16":
		return newNumberColumn[int16](t, n, signed[int16](math.MinInt16, math.MaxInt16))
	case "Int32":
		return newNumberColumn[int32](t, n, signed[int32](math.MinInt32, math.MaxInt32))
	case "Int64":
		return newNumberColumn[int64](t, n, signed[int64](math.MinInt64, math.MaxInt64))
	case "UInt8":
		return newNumberColumn[uint8](t, n, unsigned[uint8](math.MaxUint8))
	case "UInt16":
		return newNumberColumn[uint16](t, n, unsigned[uint16](math.MaxUint16))
	case "UInt32":
		return newNumberColumn[uint32](t, n, unsigned[uint32](math.MaxUint32))
	case "UInt64":
		return newNumberColumn[uint64](t, n, unsigned[uint64](math.MaxUint64))
	case "Float32":
		return newNumberColumn[float32](t, n, float[float32](math.MaxFloat32))
	}
	return newNumberColumn[float64](t, n, float[float64](math.MaxFloat64))
}

func nullsFor(t columnType, n int) []bool {
	if !t.nullable {
		return nil
	}
	return make([]bool, 0, n)
}

// stringColumn is a String, LowCardinality(String) or Nullable(String)
// column. Strings are unescaped; numbers and booleans keep their text;
// objects and arrays do not fit.
type stringColumn struct {
	vals  []string
	nulls []bool
}

func (c *stringColumn) add(v []byte, vs string) bool {
	if vs == "null" {
		c.addDefault()
		return true
	}
	s := vs
	switch vs[0] {
	case '"':
		if strings.IndexByte(vs, '\\') < 0 {
			s = vs[1 : len(vs)-1]
		} else if u, ok := unescape(v); ok {
			s = u
		} else {
			return false
		}
	case '{', '[':
		return false
	}
	c.vals = append(c.vals, s)
	if c.nulls != nil {
		c.nulls = append(c.nulls, false)
	}
	return true
}

// unescape decodes a JSON string with escapes (kept apart from add, where
// the decoded string's address would make every value allocate).
func unescape(v []byte) (string, bool) {
	var s string
	err := json.Unmarshal(v, &s)
	return s, err == nil
}

func (c *stringColumn) addDefault() {
	c.vals = append(c.vals, "")
	if c.nulls != nil {
		c.nulls = append(c.nulls, true)
	}
}

func (c *stringColumn) dropLast() {
	c.vals = c.vals[:len(c.vals)-1]
	if c.nulls != nil {
		c.nulls = c.nulls[:len(c.nulls)-1]
	}
}

func (c *stringColumn) data(out []any) []any { return append(out, nullable(c.vals, c.nulls)) }

// nullable returns vals, or for a Nullable column pointers into vals with
// nil where nulls says so (clickhouse-go's form of Nullable).
func nullable[T any](vals []T, nulls []bool) any {
	if nulls == nil {
		return vals
	}
	out := make([]*T, len(vals))
	for i := range vals {
		if !nulls[i] {
			out[i] = &vals[i]
		}
	}
	return out
}

type number interface {
	~int8 | ~int16 | ~int32 | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~float32 | ~float64
}

// numberColumn is an integer or float column of any width; parse converts
// a JSON number (or a string holding one) and refuses values the type
// cannot hold exactly (out of range, a fraction in an integer column).
type numberColumn[T number] struct {
	vals  []T
	nulls []bool
	parse func(s string) (T, bool)
}

func newNumberColumn[T number](t columnType, n int, parse func(string) (T, bool)) *numberColumn[T] {
	return &numberColumn[T]{vals: make([]T, 0, n), nulls: nullsFor(t, n), parse: parse}
}

func (c *numberColumn[T]) add(_ []byte, vs string) bool {
	if vs == "null" {
		c.addDefault()
		return true
	}
	x, ok := c.parse(unquoteNumber(vs))
	if !ok {
		return false
	}
	c.vals = append(c.vals, x)
	if c.nulls != nil {
		c.nulls = append(c.nulls, false)
	}
	return true
}

func (c *numberColumn[T]) addDefault() {
	c.vals = append(c.vals, 0)
	if c.nulls != nil {
		c.nulls = append(c.nulls, true)
	}
}

func (c *numberColumn[T]) dropLast() {
	c.vals = c.vals[:len(c.vals)-1]
	if c.nulls != nil {
		c.nulls = c.nulls[:len(c.nulls)-1]
	}
}

func (c *numberColumn[T]) data(out []any) []any { return append(out, nullable(c.vals, c.nulls)) }

// maxExactFloat is the largest magnitude below which every integer is a
// float64 exactly.
const maxExactFloat = 1 << 53

// signed parses integers within [lo, hi]. A number written with a
// fraction or an exponent counts when it is integral and exact.
func signed[T ~int8 | ~int16 | ~int32 | ~int64](lo, hi int64) func(string) (T, bool) {
	return func(s string) (T, bool) {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			f, ferr := strconv.ParseFloat(s, 64)
			if ferr != nil || f != math.Trunc(f) || math.Abs(f) > maxExactFloat {
				return 0, false
			}
			n = int64(f)
		}
		if n < lo || n > hi {
			return 0, false
		}
		return T(n), true
	}
}

// unsigned parses integers within [0, hi].
func unsigned[T ~uint8 | ~uint16 | ~uint32 | ~uint64](hi uint64) func(string) (T, bool) {
	return func(s string) (T, bool) {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			f, ferr := strconv.ParseFloat(s, 64)
			if ferr != nil || f != math.Trunc(f) || f < 0 || f > maxExactFloat {
				return 0, false
			}
			n = uint64(f)
		}
		if n > hi {
			return 0, false
		}
		return T(n), true
	}
}

// float parses finite numbers within ±hi.
func float[T ~float32 | ~float64](hi float64) func(string) (T, bool) {
	return func(s string) (T, bool) {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) || math.Abs(f) > hi {
			return 0, false
		}
		return T(f), true
	}
}

// The range of DateTime64 on every server version that has it (20.1 on:
// 1925-01-01 to 2283-11-11; newer servers accept more).
var (
	dateTime64Min = time.Date(1925, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	dateTime64Max = time.Date(2283, 11, 11, 0, 0, 0, 0, time.UTC).Unix() - 1
)

// timeColumn is a DateTime or DateTime64 column (Nullable or not); on
// servers without DateTime64 the microseconds go to a companion UInt32
// column. A timestamp outside [min, max] seconds (DateTime: 1970 to
// 2106-02-07) does not fit: it would wrap around.
type timeColumn struct {
	vals     []time.Time
	fracs    []uint32 // nil without a companion column
	nulls    []bool
	min, max int64
}

// epoch is the default of timestamp columns.
var epoch = time.Unix(0, 0).UTC()

func (c *timeColumn) add(_ []byte, vs string) bool {
	if vs == "null" {
		c.addDefault()
		return true
	}
	sec, us, ok := parseTimestamp(vs)
	if !ok || sec < c.min || sec > c.max {
		return false
	}
	if c.fracs != nil {
		c.vals = append(c.vals, time.Unix(sec, 0).UTC())
		c.fracs = append(c.fracs, us)
	} else {
		c.vals = append(c.vals, time.Unix(sec, int64(us)*1000).UTC())
	}
	if c.nulls != nil {
		c.nulls = append(c.nulls, false)
	}
	return true
}

func (c *timeColumn) addDefault() {
	c.vals = append(c.vals, epoch)
	if c.fracs != nil {
		c.fracs = append(c.fracs, 0)
	}
	if c.nulls != nil {
		c.nulls = append(c.nulls, true)
	}
}

func (c *timeColumn) dropLast() {
	c.vals = c.vals[:len(c.vals)-1]
	if c.fracs != nil {
		c.fracs = c.fracs[:len(c.fracs)-1]
	}
	if c.nulls != nil {
		c.nulls = c.nulls[:len(c.nulls)-1]
	}
}

func (c *timeColumn) data(out []any) []any {
	out = append(out, nullable(c.vals, c.nulls))
	if c.fracs != nil {
		out = append(out, c.fracs)
	}
	return out
}

// unquoteNumber strips the quotes of a JSON string holding a number ("200").
func unquoteNumber(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return s[1 : len(s)-1]
	}
	return s
}

// maxTimestamp bounds the seconds parseTimestamp accepts, far beyond every
// column's range (it only keeps the arithmetic from overflowing).
const maxTimestamp = 1 << 40

// parseTimestamp reads Unix seconds with an optional fraction
// ("1523916295.768957", "-5.5") exactly, without a float's rounding: sec is
// the floor, us the microseconds after it.
func parseTimestamp(v string) (sec int64, us uint32, ok bool) {
	s := unquoteNumber(v)
	if strings.ContainsAny(s, "eE") {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || math.Abs(f) > maxTimestamp {
			return 0, 0, false
		}
		fl := math.Floor(f)
		sec, us = int64(fl), uint32(math.Round((f-fl)*1e6))
		if us >= 1e6 {
			sec, us = sec+1, 0
		}
		return sec, us, true
	}
	neg := strings.HasPrefix(s, "-")
	whole, frac, _ := strings.Cut(strings.TrimPrefix(s, "-"), ".")
	if whole == "" || whole[0] < '0' || whole[0] > '9' {
		return 0, 0, false
	}
	sec, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || sec > maxTimestamp {
		return 0, 0, false
	}
	if frac != "" {
		if len(frac) > 6 {
			frac = frac[:6]
		}
		for len(frac) < 6 {
			frac += "0"
		}
		n, err := strconv.ParseUint(frac, 10, 32)
		if err != nil {
			return 0, 0, false
		}
		us = uint32(n)
	}
	if neg {
		sec = -sec
		if us > 0 {
			sec, us = sec-1, 1e6-us
		}
	}
	return sec, us, true
}
