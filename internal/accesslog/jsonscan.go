package accesslog

import (
	"encoding/json"
	"errors"
	"unicode/utf8"
)

// errScan reports JSON that the member scanner cannot walk.
var errScan = errors.New("malformed JSON object")

// EachMember calls fn with the raw key (without quotes; escaped tells
// whether it holds backslash escapes) and the raw value of every member of
// the JSON object obj, in order, without allocating. obj must be valid JSON
// (as every spooled record is: ingest validated it); on anything else it
// returns an error, after calling fn for the members before the problem.
func EachMember(obj []byte, fn func(key []byte, escaped bool, value []byte)) error {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return errScan
	}
	i = skipSpace(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return nil
	}
	for {
		if i >= len(obj) || obj[i] != '"' {
			return errScan
		}
		ke, esc := stringEnd(obj, i)
		if ke < 0 {
			return errScan
		}
		key := obj[i+1 : ke-1]
		i = skipSpace(obj, ke)
		if i >= len(obj) || obj[i] != ':' {
			return errScan
		}
		i = skipSpace(obj, i+1)
		ve := valueEnd(obj, i)
		if ve < 0 {
			return errScan
		}
		fn(key, esc, obj[i:ve])
		var more bool
		if i, more = afterValue(obj, ve, '}'); !more {
			return scanResult(i)
		}
	}
}

// EachElement calls fn with the raw value of every element of the JSON
// array arr; like EachMember, arr must be valid JSON.
func EachElement(arr []byte, fn func(value []byte)) error {
	i := skipSpace(arr, 0)
	if i >= len(arr) || arr[i] != '[' {
		return errScan
	}
	i = skipSpace(arr, i+1)
	if i < len(arr) && arr[i] == ']' {
		return nil
	}
	for {
		ve := valueEnd(arr, i)
		if ve < 0 {
			return errScan
		}
		fn(arr[i:ve])
		var more bool
		if i, more = afterValue(arr, ve, ']'); !more {
			return scanResult(i)
		}
	}
}

// UnescapeKey returns a member key as a string, decoding escapes if any.
func UnescapeKey(key []byte, escaped bool) string {
	if !escaped && utf8.Valid(key) {
		return string(key)
	}
	var s string
	q := make([]byte, 0, len(key)+2)
	q = append(append(append(q, '"'), key...), '"')
	if json.Unmarshal(q, &s) != nil {
		return string(key)
	}
	return s
}

// scanResult is the error of a container scan that ended at index i
// (afterValue's -1: invalid).
func scanResult(i int) error {
	if i < 0 {
		return errScan
	}
	return nil
}

// afterValue reads what follows a member or element of a container that
// ends at index e: the index of the next one and true after a comma, the
// index after the container and false when end (its closing bracket)
// ends it, or -1.
func afterValue(b []byte, e int, end byte) (int, bool) {
	i := skipSpace(b, e)
	switch {
	case i >= len(b):
		return -1, false
	case b[i] == ',':
		return skipSpace(b, i+1), true
	case b[i] == end:
		return i + 1, false
	}
	return -1, false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index after the string starting at b[i] == '"'.
func stringEnd(b []byte, i int) (int, bool) {
	esc := false
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			esc = true
			j++
		case '"':
			return j + 1, esc
		}
	}
	return -1, esc
}

// valueEnd returns the index after the value starting at b[i], or -1.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		e, _ := stringEnd(b, i)
		return e
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				e, _ := stringEnd(b, j)
				if e < 0 {
					return -1
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	case ',', '}', ']', ':':
		return -1
	default:
		for j := i; j < len(b); j++ {
			switch b[j] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return j
			}
		}
		return len(b)
	}
}

// RecordUUID returns the "uuid" member of the record object rec when it is
// a non-empty JSON string, else "". A batch without identity (json_array,
// json_lines) names its records by it where it can (the sinks' record
// identity).
func RecordUUID(rec []byte) string {
	var uuid []byte
	_ = EachMember(rec, func(key []byte, escaped bool, value []byte) {
		if uuid == nil && !escaped && string(key) == "uuid" {
			uuid = value
		}
	})
	if len(uuid) < 2 || uuid[0] != '"' {
		return ""
	}
	if _, esc := stringEnd(uuid, 0); !esc {
		return string(uuid[1 : len(uuid)-1])
	}
	var s string
	if json.Unmarshal(uuid, &s) != nil {
		return ""
	}
	return s
}
