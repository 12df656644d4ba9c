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
// never panics, on anything malformed.
type rowScanner struct {
	b       []byte
	i       int
	vals    []json.RawMessage
	started bool
	done    bool
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

// next returns the next row's values, valid until the following call; ok is
// false after the last row.
func (s *rowScanner) next() (vals []json.RawMessage, ok bool, err error) {
	if s.done {
		return nil, false, nil
	}
	s.skipWS()
	if !s.started {
		s.started = true
		if s.i >= len(s.b) || bytes.Equal(bytes.TrimSpace(s.b[s.i:]), null) {
			s.done = true
			return nil, false, nil
		}
		if s.b[s.i] != '[' {
			return nil, false, s.errorf("want an array of rows")
		}
		s.i++
		s.skipWS()
		if s.i < len(s.b) && s.b[s.i] == ']' {
			s.done = true
			return nil, false, nil
		}
	} else {
		if s.i >= len(s.b) {
			return nil, false, s.errorf("unexpected end")
		}
		switch s.b[s.i] {
		case ',':
			s.i++
			s.skipWS()
		case ']':
			s.done = true
			return nil, false, nil
		default:
			return nil, false, s.errorf("want , or ] after a row")
		}
	}
	if s.i >= len(s.b) || s.b[s.i] != '[' {
		return nil, false, s.errorf("a row must be an array")
	}
	s.i++
	s.vals = s.vals[:0]
	s.skipWS()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		return s.vals, true, nil
	}
	for {
		v, err := s.value()
		if err != nil {
			return nil, false, err
		}
		s.vals = append(s.vals, v)
		s.skipWS()
		if s.i >= len(s.b) {
			return nil, false, s.errorf("unexpected end in a row")
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case ']':
			s.i++
			return s.vals, true, nil
		default:
			return nil, false, s.errorf("want , or ] in a row")
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
