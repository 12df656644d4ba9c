package platform

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// maxErrorBody is how much of a non-JSON error body an Error keeps.
const maxErrorBody = 512

// Error is an error answer of the platform API: the spec's Error object
// (section 7) together with the HTTP status it came with. Bodies that are not an
// Error object still produce an Error, with the start of the body in Body.
// Callers test for it with errors.As; it survives any wrapping.
type Error struct {
	// Status is the HTTP status code of the response.
	Status int
	// Code is the API's error code (the object's "code"), when sent.
	Code string
	// Title is a short summary of the error.
	Title string
	// Description says what went wrong.
	Description string
	// Details names the parts of the request at fault (for example the
	// offending filter of a metrics query).
	Details []ErrorDetail
	// Body is the start of the response body when it was not an Error object
	// (at most 512 bytes, valid UTF-8).
	Body string
	// RetryAfter is the wait the server asked for with Retry-After (429, 503),
	// zero when it asked for none.
	RetryAfter time.Duration
}

// ErrorDetail is one entry of an Error's details.
type ErrorDetail struct {
	// Source is the part of the request the detail is about.
	Source string `json:"source"`
	// Description says what is wrong with it.
	Description string `json:"description"`
}

// Error renders the status, code, title, description and details on one line.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("platform API: ")
	b.WriteString(strconv.Itoa(e.Status))
	if t := http.StatusText(e.Status); t != "" {
		b.WriteByte(' ')
		b.WriteString(t)
	}
	if e.Code != "" {
		b.WriteString(" [")
		b.WriteString(e.Code)
		b.WriteByte(']')
	}
	if e.Title != "" && e.Title != http.StatusText(e.Status) {
		b.WriteString(": ")
		b.WriteString(e.Title)
	}
	if e.Description != "" {
		b.WriteString(": ")
		b.WriteString(e.Description)
	}
	for i, d := range e.Details {
		if i == 0 {
			b.WriteString(" (")
		} else {
			b.WriteString("; ")
		}
		if d.Source != "" {
			b.WriteString(d.Source)
			b.WriteString(": ")
		}
		b.WriteString(d.Description)
		if i == len(e.Details)-1 {
			b.WriteByte(')')
		}
	}
	if e.Body != "" {
		b.WriteString(": ")
		b.WriteString(strconv.Quote(e.Body))
	}
	return b.String()
}

// Temporary reports whether the same request may succeed later: 429 and
// server errors other than 501 and 505.
func (e *Error) Temporary() bool {
	return retryableStatus(e.Status)
}

// StatusCode returns the HTTP status of the *Error in err's chain, or 0 when
// there is none (a network error, a cancelled context).
func StatusCode(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// IsNotFound reports whether err is the API's 404.
func IsNotFound(err error) bool { return StatusCode(err) == http.StatusNotFound }

// IsRefused reports whether err says the platform refuses the client for
// what it asked: a 401 or 403 of an API call (the client has already fetched
// a new token once), or the token endpoint refusing the client or the scope
// (401, or 400 with the OAuth2 codes invalid_scope, invalid_client,
// unauthorized_client). A wrong secret and a scope the API client lacks
// both look like this; the error's text tells them apart.
func IsRefused(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Status {
	case http.StatusUnauthorized, http.StatusForbidden:
		return true
	case http.StatusBadRequest:
		switch e.Code {
		case "invalid_scope", "invalid_client", "unauthorized_client":
			return true
		}
	}
	return false
}

// IsClientRefused reports whether err is the token endpoint refusing the
// API client itself (OAuth2 invalid_client or unauthorized_client: an
// unknown client ID, a wrong or deleted secret), not a scope.
func IsClientRefused(err error) bool {
	var e *Error
	return errors.As(err, &e) && (e.Code == "invalid_client" || e.Code == "unauthorized_client")
}

// IsScopeRefused reports whether err is the token endpoint refusing a
// scope the API client was not granted (OAuth2 invalid_scope).
func IsScopeRefused(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == "invalid_scope"
}

func retryableStatus(status int) bool {
	switch {
	case status == http.StatusTooManyRequests:
		return true
	case status == http.StatusNotImplemented, status == http.StatusHTTPVersionNotSupported:
		return false
	case status >= 500 && status <= 599:
		return true
	}
	return false
}

// wireError is the JSON shape of the spec's Error object; it also reads the
// OAuth2 error shape of the token endpoint (RFC 6749 section 5.2).
type wireError struct {
	Type        string          `json:"@type"`
	Code        json.RawMessage `json:"code"`
	StatusCode  json.RawMessage `json:"status_code"`
	Title       string          `json:"title"`
	Description string          `json:"description"`
	Details     []ErrorDetail   `json:"details"`
	// OAuth2 token endpoint errors.
	OAuthError       string `json:"error"`
	OAuthDescription string `json:"error_description"`
	// Some gateways use "message".
	Message string `json:"message"`
}

// newError builds the Error for a non-2xx response.
func newError(status int, header http.Header, body []byte) *Error {
	e := &Error{Status: status}
	if header != nil {
		e.RetryAfter = parseRetryAfter(header.Get("Retry-After"), time.Now())
	}
	var w wireError
	if len(body) > 0 && json.Unmarshal(body, &w) == nil {
		e.Code = rawString(w.Code)
		e.Title = w.Title
		e.Description = w.Description
		e.Details = w.Details
		if e.Code == "" {
			e.Code = w.OAuthError
		}
		if e.Description == "" {
			e.Description = w.OAuthDescription
		}
		if e.Description == "" {
			e.Description = w.Message
		}
		if e.Code != "" || e.Title != "" || e.Description != "" || len(e.Details) > 0 {
			return e
		}
	}
	e.Body = truncateUTF8(strings.TrimSpace(string(body)), maxErrorBody)
	return e
}

// rawString renders a JSON string or number as text.
func rawString(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return strings.ToValidUTF8(s, "\uFFFD")
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// parseRetryAfter reads a Retry-After header: delay-seconds or an HTTP date.
// It returns 0 when the header is absent or unreadable.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		if secs > int64(24*time.Hour/time.Second) {
			secs = int64(24 * time.Hour / time.Second)
		}
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
		return 0
	}
	return 0
}

// networkError marks a failure to get an HTTP answer at all (connection
// refused or reset, attempt timeout); such failures are retried.
type networkError struct{ err error }

func (e *networkError) Error() string { return e.err.Error() }
func (e *networkError) Unwrap() error { return e.err }
