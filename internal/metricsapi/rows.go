package metricsapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// rowScanner walks the data_rows array of an answer without copying: each
// row's values are sub-slices of the raw bytes. The bytes were validated as
// JSON by the decoder that produced them; the scanner still fails cleanly,
// never panics, on anything malformed. A row that is a JSON value other than
// an array is returned as such (scannedRow.array false), so that the caller
// can skip it and use the rest.
type rowScanner struct {
	b       []byte
	i       int
	vals    []json.RawMessage
	started bool
	done    bool
}

// scannedRow is one element of data_rows, valid until the next call of next.
type scannedRow struct {
	// vals are the row's values when it is an array.
	vals []json.RawMessage
	// raw is the whole element.
	raw []byte
	// array is false for an element that is not an array.
	array bool
}

func newRowScanner(b []byte) *rowScanner { return &rowScanner{b: b} }

func (s *rowScanner) skipWS() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *rowScanner) errorf(format string, a ...any) error {
	return fmt.Errorf("data_rows at byte %d: %s", s.i, fmt.Sprintf(format, a...))
}

// next returns the next row, valid until the following call; ok is false
// after the last row.
func (s *rowScanner) next() (row scannedRow, ok bool, err error) {
	if s.done {
		return row, false, nil
	}
	s.skipWS()
	if !s.started {
		s.started = true
		if s.i >= len(s.b) || bytes.Equal(bytes.TrimSpace(s.b[s.i:]), null) {
			s.done = true
			return row, false, nil
		}
		if s.b[s.i] != '[' {
			return row, false, s.errorf("want an array of rows")
		}
		s.i++
		s.skipWS()
		if s.i < len(s.b) && s.b[s.i] == ']' {
			s.done = true
			return row, false, nil
		}
	} else {
		if s.i >= len(s.b) {
			return row, false, s.errorf("unexpected end")
		}
		switch s.b[s.i] {
		case ',':
			s.i++
			s.skipWS()
		case ']':
			s.done = true
			return row, false, nil
		default:
			return row, false, s.errorf("want , or ] after a row")
		}
	}
	start := s.i
	if s.i < len(s.b) && s.b[s.i] != '[' {
		if _, err := s.value(); err != nil {
			return row, false, err
		}
		return scannedRow{raw: s.b[start:s.i]}, true, nil
	}
	if s.i >= len(s.b) {
		return row, false, s.errorf("unexpected end")
	}
	s.i++
	s.vals = s.vals[:0]
	s.skipWS()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		return scannedRow{vals: s.vals, raw: s.b[start:s.i], array: true}, true, nil
	}
	for {
		v, err := s.value()
		if err != nil {
			return row, false, err
		}
		s.vals = append(s.vals, v)
		s.skipWS()
		if s.i >= len(s.b) {
			return row, false, s.errorf("unexpected end in a row")
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case ']':
			s.i++
			return scannedRow{vals: s.vals, raw: s.b[start:s.i], array: true}, true, nil
		default:
			return row, false, s.errorf("want , or ] in a row")
		}
	}
}

// value returns the raw bytes of one JSON value.
func (s *rowScanner) value() (json.RawMessage, error) {
	s.skipWS()
	start := s.i
	if s.i >= len(s.b) {
		return nil, s.errorf("unexpected end")
	}
	switch s.b[s.i] {
	case '"':
		if err := s.skipString(); err != nil {
			return nil, err
		}
	case '[', '{':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				if err := s.skipString(); err != nil {
					return nil, err
				}
				continue
			case '[', '{':
				depth++
			case ']', '}':
				depth--
			}
			s.i++
			if depth == 0 {
				return s.b[start:s.i], nil
			}
		}
		return nil, s.errorf("unterminated value")
	default:
	scalar:
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', ']', '}', ' ', '\t', '\n', '\r':
				break scalar
			}
			s.i++
		}
		if s.i == start {
			return nil, s.errorf("empty value")
		}
	}
	return s.b[start:s.i], nil
}

// skipString moves past the string starting at s.i.
func (s *rowScanner) skipString() error {
	s.i++ // opening quote
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '\\':
			s.i += 2
			continue
		case '"':
			s.i++
			return nil
		}
		s.i++
	}
	return errors.New("data_rows: unterminated string")
}
