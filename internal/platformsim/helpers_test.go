package platformsim_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/platformsim"
)

// clock is a settable simulated clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *clock { return &clock{t: t} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// testNow is the default simulated time of the tests: a Monday afternoon.
var testNow = time.Date(2026, 11, 23, 14, 2, 30, 0, time.UTC)

// startSim starts a simulator on loopback and stops it when the test ends.
func startSim(t testing.TB, cfg platformsim.Config) (*platformsim.Server, string) {
	t.Helper()
	srv, err := platformsim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	base, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatalf("start simulator: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("close simulator: %v", err)
		}
	})
	return srv, base
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("decode %d response %q: %v", r.status, r.body, err)
	}
	return m
}

func do(t testing.TB, method, u, auth, contentType string, body string) response {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

func tokenRequest(t testing.TB, base string, form url.Values) response {
	t.Helper()
	return do(t, http.MethodPost, base+"/connect/token", "", "application/x-www-form-urlencoded", form.Encode())
}

// token gets an access token of the demo client for scope.
func token(t testing.TB, base, scope string) string {
	t.Helper()
	r := tokenRequest(t, base, url.Values{
		"grant_type": {"client_credentials"}, "client_id": {platformsim.DemoClientID},
		"client_secret": {platformsim.DemoClientSecret}, "scope": {scope},
	})
	if r.status != http.StatusOK {
		t.Fatalf("token: %d %s", r.status, r.body)
	}
	return r.json(t)["access_token"].(string)
}

// checkError asserts the spec's Error object with status and, when source is
// not empty, a details entry with that source and a non-empty description.
func checkError(t testing.TB, r response, status int, source string) map[string]any {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	m := r.json(t)
	if m["@type"] != "Error" || m["code"] == "" || m["title"] == "" || m["description"] == "" {
		t.Fatalf("not an Error object: %s", r.body)
	}
	if sc, _ := m["status_code"].(json.Number).Int64(); int(sc) != status {
		t.Fatalf("status_code %v, want %d", m["status_code"], status)
	}
	details, ok := m["details"].([]any)
	if !ok {
		t.Fatalf("details missing: %s", r.body)
	}
	if source == "" {
		return m
	}
	for _, d := range details {
		dm := d.(map[string]any)
		if dm["@type"] == "ErrorDetail" && dm["source"] == source && dm["description"] != "" {
			return m
		}
	}
	t.Fatalf("no details entry with source %q: %s", source, r.body)
	return nil
}

// dataRows decodes a data response into rows keyed by field name; numbers
// (JSON numbers or numeric strings) become float64, everything else stays a
// string.
type wireRow map[string]any

func dataRows(t testing.TB, r response) (fields []string, rows []wireRow) {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("data: %d %s", r.status, r.body)
	}
	var body struct {
		Fields []struct {
			Name     string `json:"name"`
			DataType string `json:"data_type"`
		} `json:"data_fields"`
		Rows [][]any `json:"data_rows"`
	}
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.UseNumber()
	if err := dec.Decode(&body); err != nil {
		t.Fatal(err)
	}
	for _, f := range body.Fields {
		fields = append(fields, f.Name)
	}
	for _, raw := range body.Rows {
		if len(raw) != len(body.Fields) {
			t.Fatalf("row %v has %d values for %d fields", raw, len(raw), len(body.Fields))
		}
		row := wireRow{}
		for i, v := range raw {
			f := body.Fields[i]
			if f.DataType != "NUMBER" {
				row[f.Name] = v.(string)
				continue
			}
			var s string
			switch x := v.(type) {
			case json.Number:
				s = x.String()
			case string:
				s = x
			default:
				t.Fatalf("field %s: unexpected %T %v", f.Name, v, v)
			}
			n, err := strconv.ParseFloat(s, 64)
			if err != nil {
				t.Fatalf("field %s: %q is not numeric", f.Name, s)
			}
			row[f.Name] = n
		}
		rows = append(rows, row)
	}
	return fields, rows
}

func (r wireRow) f(name string) float64 { return r[name].(float64) }
func (r wireRow) s(name string) string  { return r[name].(string) }

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// dataQuery posts a data request.
func dataQuery(t testing.TB, base, tok, dataset string, q map[string]any) response {
	t.Helper()
	return do(t, http.MethodPost, base+"/metrics/v1/datasets/"+dataset+"/data", "Bearer "+tok, "application/json", mustJSON(q))
}
