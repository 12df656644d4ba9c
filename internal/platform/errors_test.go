package platform

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestNewError(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		header  http.Header
		body    string
		want    Error
		message []string // substrings of Error()
	}{
		{
			name:   "spec error object",
			status: 400,
			body: `{"@type":"Error","code":"invalid_request","status_code":400,"title":"Bad Request",
				"description":"query is invalid","details":[{"@type":"ErrorDetail","source":"filters.environment_id","description":"at most 20 values"},
				{"@type":"ErrorDetail","source":"metrics[1]","description":"unknown metric nope"}]}`,
			want: Error{Status: 400, Code: "invalid_request", Title: "Bad Request", Description: "query is invalid",
				Details: []ErrorDetail{{"filters.environment_id", "at most 20 values"}, {"metrics[1]", "unknown metric nope"}}},
			message: []string{"400 Bad Request", "[invalid_request]", "query is invalid", "filters.environment_id: at most 20 values", "metrics[1]: unknown metric nope"},
		},
		{
			name:    "numeric code",
			status:  404,
			body:    `{"code":404,"title":"Not Found","description":"no dataset x"}`,
			want:    Error{Status: 404, Code: "404", Title: "Not Found", Description: "no dataset x"},
			message: []string{"404 Not Found", "no dataset x"},
		},
		{
			name:    "oauth2 token error",
			status:  401,
			body:    `{"error":"invalid_client","error_description":"bad secret"}`,
			want:    Error{Status: 401, Code: "invalid_client", Description: "bad secret"},
			message: []string{"401 Unauthorized", "invalid_client", "bad secret"},
		},
		{
			name:    "html from a proxy",
			status:  502,
			body:    "<html><body>Bad gateway</body></html>",
			want:    Error{Status: 502, Body: "<html><body>Bad gateway</body></html>"},
			message: []string{"502 Bad Gateway", "Bad gateway"},
		},
		{
			name:    "empty body",
			status:  503,
			header:  http.Header{"Retry-After": {"30"}},
			want:    Error{Status: 503, RetryAfter: 30 * time.Second},
			message: []string{"503 Service Unavailable"},
		},
		{
			name:    "json without error fields",
			status:  500,
			body:    `{"foo":1}`,
			want:    Error{Status: 500, Body: `{"foo":1}`},
			message: []string{"500 Internal Server Error"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := newError(tt.status, tt.header, []byte(tt.body))
			if fmt.Sprintf("%+v", *got) != fmt.Sprintf("%+v", tt.want) {
				t.Errorf("got  %+v\nwant %+v", *got, tt.want)
			}
			msg := got.Error()
			for _, s := range tt.message {
				if !strings.Contains(msg, s) {
					t.Errorf("Error() = %q, lacks %q", msg, s)
				}
			}
			// errors.As finds it through layers of wrapping.
			wrapped := fmt.Errorf("outer: %w", fmt.Errorf("inner: %w", got))
			var e *Error
			if !errors.As(wrapped, &e) || e != got {
				t.Error("errors.As does not find the *Error through wrapping")
			}
		})
	}
}

func TestNewErrorTruncatesBody(t *testing.T) {
	body := strings.Repeat("é", 1000) // 2000 bytes
	e := newError(500, nil, []byte(body))
	if len(e.Body) > maxErrorBody+len("…") || !strings.HasSuffix(e.Body, "…") {
		t.Errorf("body of %d bytes kept whole or without ellipsis (%d bytes)", len(body), len(e.Body))
	}
	if strings.ContainsRune(e.Body, '\uFFFD') {
		t.Error("truncation split a UTF-8 sequence")
	}
}

func TestErrorHelpers(t *testing.T) {
	nf := fmt.Errorf("get: %w", &Error{Status: 404})
	if !IsNotFound(nf) || StatusCode(nf) != 404 {
		t.Error("IsNotFound/StatusCode miss a wrapped 404")
	}
	if StatusCode(errors.New("x")) != 0 || IsNotFound(nil) {
		t.Error("StatusCode of a non-API error should be 0")
	}
	for status, want := range map[int]bool{429: true, 500: true, 502: true, 503: true, 504: true, 501: false, 505: false, 400: false, 401: false, 404: false, 409: false} {
		if got := (&Error{Status: status}).Temporary(); got != want {
			t.Errorf("Temporary(%d) = %v, want %v", status, got, want)
		}
	}
}

func TestDoReturnsDecodedError(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
		writeJSON(w, http.StatusBadRequest, map[string]any{
			"@type": "Error", "code": "bad_filter", "status_code": 400, "title": "Bad Request", "description": "invalid filter",
			"details": []map[string]string{{"@type": "ErrorDetail", "source": "filters.environment_id", "description": "21 values, at most 20"}},
		})
	})
	c := f.client(f.config())
	err := c.Metrics().Do(ctxT(t), http.MethodPost, "/datasets/edge_errors/data", nil, map[string]any{}, nil)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v, want *Error", err)
	}
	if e.Code != "bad_filter" || len(e.Details) != 1 || e.Details[0].Source != "filters.environment_id" {
		t.Errorf("decoded %+v", e)
	}
	if !strings.Contains(err.Error(), "metrics POST /datasets/edge_errors/data") {
		t.Errorf("err = %q lacks the call it came from", err)
	}
}
