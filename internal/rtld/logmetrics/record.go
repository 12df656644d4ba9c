package logmetrics

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/bits"
	"strconv"
	"unicode/utf8"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// field is a record field the metrics read.
type field uint8

const (
	fieldStatus field = iota
	fieldCache
	fieldBytes
	fieldTime
	fieldPOP
	fieldHost
	fieldCountry
	numFields
)

// fieldCodes are the fields' log-field codes.
var fieldCodes = [numFields]string{"status_code", "cache_status", "bytes_out", "total_time", LabelPOP, LabelHost, LabelCountry}

// fieldOf returns the field a record key names.
func fieldOf(key []byte) (field, bool) {
	switch string(key) {
	case "status_code":
		return fieldStatus, true
	case "cache_status":
		return fieldCache, true
	case "bytes_out":
		return fieldBytes, true
	case "total_time":
		return fieldTime, true
	case LabelPOP:
		return fieldPOP, true
	case LabelHost:
		return fieldHost, true
	case LabelCountry:
		return fieldCountry, true
	}
	return 0, false
}

// fieldSet is a set of fields, one bit each.
type fieldSet uint8

func (s fieldSet) has(f field) bool { return s&(1<<f) != 0 }

// rawFields holds the raw JSON values of a record's fields (nil: absent).
type rawFields [numFields][]byte

// layout is the key order of the records of a batch, learnt from the ones
// before: records of one profile list their fields in one order, so a key
// is recognised by comparing it with the one expected at its position
// instead of looking for its end. Its slices alias a record of the batch;
// reset it before the next batch.
type layout struct {
	keys   [][]byte
	fields []int8 // the field of each key, or -1
}

func (l *layout) reset() {
	clear(l.keys)
	l.keys, l.fields = l.keys[:0], l.fields[:0]
}

// scanRecord sets raw to the values of the fields of want in the record
// object rec (valid JSON, as ingest checked). It walks compact, flat objects
// (what the platform sends) hopping over keys it expects and from quote to
// quote, and stops once it has every field; it reports false, having set
// nothing reliable, for anything else (a nested value, an escaped key,
// whitespace), which scanRecordSlow then reads.
func scanRecord(rec []byte, want fieldSet, raw *rawFields, lay *layout) bool {
	if len(rec) < 2 || rec[0] != '{' {
		return false
	}
	if rec[1] == '}' {
		return true
	}
	return scanMembers(rec, want, raw, lay)
}

// scanMembers is scanRecord for an object with members, from its first key
// at rec[1]. The helpers it calls for every member are inlined (it runs
// for every record received); the rare cases, a key not in the layout or
// a string with escaped quotes, are calls.
func scanMembers(rec []byte, want fieldSet, raw *rawFields, lay *layout) bool {
	var found fieldSet
	for i, j := 1, 0; ; j++ {
		ke, f := expectedKey(rec, i, j, lay)
		if ke < 0 {
			ke, f = learnKey(rec, i, j, lay)
		}
		vs := valueStart(rec, ke)
		if vs < 0 {
			return false
		}
		var ve int
		if rec[vs] == '"' {
			// A string (the common value): its end is the first quote
			// not escaped.
			ve = nextQuote(rec, vs+1) + 1 // 0: not closed
			if ve > 0 && rec[ve-2] == '\\' {
				ve = escapedStringEnd(rec, ve-1)
			}
		} else {
			ve = scalarEnd(rec, vs)
		}
		if ve <= 0 || ve >= len(rec) {
			return false
		}
		if f >= 0 && (want &^ found).has(field(f)) {
			raw[f] = rec[vs:ve]
			if found |= 1 << f; found == want {
				return true
			}
		}
		if rec[ve] != ',' {
			return rec[ve] == '}'
		}
		i = ve + 1
	}
}

// expectedKey returns the end (its closing quote) and field of the key at
// rec[i] when it is the j-th key of the layout, else -1.
func expectedKey(rec []byte, i, j int, lay *layout) (int, int8) {
	if j >= len(lay.keys) {
		return -1, -1
	}
	k := lay.keys[j]
	e := i + 1 + len(k)
	if e >= len(rec) || rec[i] != '"' || rec[e] != '"' || string(rec[i+1:e]) != string(k) {
		return -1, -1
	}
	return e, lay.fields[j]
}

// learnKey reads the key at rec[i], makes it the j-th of the layout (the
// keys after it are learnt again) and returns its end and field; -1 for
// no key there or a key with escapes.
func learnKey(rec []byte, i, j int, lay *layout) (int, int8) {
	if i >= len(rec) || rec[i] != '"' {
		return -1, -1
	}
	q := nextQuote(rec, i+1)
	if q < 0 || bytes.IndexByte(rec[i+1:q], '\\') >= 0 {
		return -1, -1
	}
	f := int8(-1)
	if ff, ok := fieldOf(rec[i+1 : q]); ok {
		f = int8(ff)
	}
	lay.keys = append(lay.keys[:j], rec[i+1:q])
	lay.fields = append(lay.fields[:j], f)
	return q, f
}

// valueStart returns the index of the value after the key ending at rec[ke]
// and its ':', or -1 when there is no key (ke is -1), no ':' or no value.
func valueStart(rec []byte, ke int) int {
	if ke < 0 || ke+2 >= len(rec) || rec[ke+1] != ':' {
		return -1
	}
	return ke + 2
}

// escapedStringEnd returns the index after the string holding the quote
// rec[q] that follows a backslash, or -1 when it is not closed. The string's
// end is the first quote not after an odd run of backslashes.
func escapedStringEnd(rec []byte, q int) int {
	for {
		k := q
		for rec[k-1] == '\\' { // stops at the opening quote
			k--
		}
		if (q-k)%2 == 0 {
			return q + 1
		}
		if q = nextQuote(rec, q+1); q < 0 {
			return -1
		}
	}
}

// scalarEnd returns the index after the number, true, false or null
// starting at rec[i], or -1 for an object, an array, whitespace or the end
// of rec.
func scalarEnd(rec []byte, i int) int {
	switch rec[i] {
	case '{', '[', ' ', '\t', '\n', '\r', ',', '}':
		return -1
	}
	j := nextDelimiter(rec, i+1)
	if j < 0 {
		return -1
	}
	switch rec[j-1] {
	case ' ', '\t', '\n', '\r':
		return -1
	}
	return j
}

// Bytes of a 64-bit word, for finding a byte in eight at once.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// bytesEqual has the high bit of each byte of w that equals c set (and of
// none before the first such byte).
func bytesEqual(w uint64, c byte) uint64 {
	x := w ^ (ones * uint64(c))
	return (x - ones) &^ x & highs
}

// nextQuote returns the index of the first '"' in rec from i, or -1,
// looking at eight bytes at a time (strings in records are short: a call of
// bytes.IndexByte costs more than it saves).
func nextQuote(rec []byte, i int) int {
	for ; i+8 <= len(rec); i += 8 {
		if m := bytesEqual(binary.LittleEndian.Uint64(rec[i:]), '"'); m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
	}
	for ; i < len(rec); i++ {
		if rec[i] == '"' {
			return i
		}
	}
	return -1
}

// nextDelimiter returns the index of the first ',' or '}' in rec from i,
// or -1.
func nextDelimiter(rec []byte, i int) int {
	for ; i+8 <= len(rec); i += 8 {
		w := binary.LittleEndian.Uint64(rec[i:])
		if m := bytesEqual(w, ',') | bytesEqual(w, '}'); m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
	}
	for ; i < len(rec); i++ {
		if c := rec[i]; c == ',' || c == '}' {
			return i
		}
	}
	return -1
}

// scanRecordSlow sets raw to the values of the fields of want in rec,
// whatever its layout (the first of keys given twice counts, as in
// scanRecord).
func scanRecordSlow(rec []byte, want fieldSet, raw *rawFields) {
	*raw = rawFields{}
	_ = accesslog.EachMember(rec, func(key []byte, escaped bool, v []byte) {
		if escaped {
			key = []byte(accesslog.UnescapeKey(key, escaped))
		}
		if f, ok := fieldOf(key); ok && want.has(f) && raw[f] == nil {
			raw[f] = v
		}
	})
}

// Status classes, indexes of statusClasses.
const (
	classUnknown uint8 = iota
	class1xx
	class2xx
	class3xx
	class4xx
	class5xx
	numClasses
)

// statusClasses are the status_class label values.
var statusClasses = [numClasses]string{"unknown", "1xx", "2xx", "3xx", "4xx", "5xx"}

// statusClass returns the class of a raw status_code value: a number (or a
// string of digits) from 100 to 599. ok is false for any other value.
func statusClass(raw []byte) (class uint8, ok bool) {
	if len(raw) == 5 && raw[0] == '"' && raw[4] == '"' {
		raw = raw[1:4]
	}
	if len(raw) != 3 || raw[0] < '1' || raw[0] > '5' || !isDigit(raw[1]) || !isDigit(raw[2]) {
		return classUnknown, false
	}
	return raw[0] - '0', true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// number returns a raw value as a finite number that is not negative: a JSON
// number, or a string holding one.
func number(raw []byte) (float64, bool) {
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' {
		raw = raw[1 : len(raw)-1]
	}
	if len(raw) == 0 || raw[0] == '-' || raw[0] == '+' {
		return 0, false
	}
	v, ok := decimal(raw)
	if !ok {
		var err error
		// Exponents, long mantissas: rare, and the conversion of a
		// short slice does not escape.
		if v, err = strconv.ParseFloat(string(raw), 64); err != nil {
			return 0, false
		}
	}
	return v, !math.IsInf(v, 0) && !math.IsNaN(v)
}

// pow10 are the powers of ten exact in a float64.
var pow10 = [...]float64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15}

// decimal converts digits[.digits] of at most 15 digits, the form of
// durations and byte counts, exactly as strconv.ParseFloat does (an exact
// mantissa divided by an exact power of ten is correctly rounded). It
// reports false for anything else, which ParseFloat then converts.
func decimal(b []byte) (float64, bool) {
	var mant uint64
	digits, frac := 0, -1
	for i, c := range b {
		switch {
		case isDigit(c):
			mant = mant*10 + uint64(c-'0')
			digits++
		case c == '.' && frac < 0 && i > 0 && i < len(b)-1:
			frac = i
		default:
			return 0, false
		}
	}
	if digits == 0 || digits > 15 {
		return 0, false
	}
	if frac < 0 {
		return float64(mant), true
	}
	return float64(mant) / pow10[len(b)-frac-1], true
}

// maxLabelBytes bounds a label value taken from a record.
const maxLabelBytes = 256

// labelValue returns a raw value as a label value: a string's contents, the
// text of another scalar, empty for null or an absent field, at most
// maxLabelBytes bytes. It returns raw's own bytes when it can (the caller
// copies them only to keep them).
func labelValue(raw []byte) []byte {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if raw[0] == '"' {
		if bytes.IndexByte(raw, '\\') < 0 {
			raw = raw[1 : len(raw)-1]
		} else {
			var s string
			if json.Unmarshal(raw, &s) != nil {
				return nil
			}
			raw = []byte(s)
		}
	}
	if len(raw) > maxLabelBytes {
		raw = raw[:maxLabelBytes]
		for len(raw) > 0 && !utf8.Valid(raw) {
			raw = raw[:len(raw)-1]
		}
	}
	return raw
}
