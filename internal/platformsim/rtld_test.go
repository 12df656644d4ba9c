package platformsim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// rtldSim is a Server behind a real HTTP listener with a token for the
// demo client.
type rtldSim struct {
	t     testing.TB
	srv   *Server
	base  string
	token string
}

func newRTLDSim(t testing.TB, cfg Config) *rtldSim {
	t.Helper()
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		srv.Close()
	})
	s := &rtldSim{t: t, srv: srv, base: hs.URL}
	s.token = s.fetchToken(DemoClientID, DemoClientSecret, ScopeRTLD)
	return s
}

func (s *rtldSim) fetchToken(id, secret, scope string) string {
	s.t.Helper()
	form := url.Values{"client_id": {id}, "client_secret": {secret}, "grant_type": {"client_credentials"}, "scope": {scope}}
	resp, err := http.PostForm(s.base+"/connect/token", form)
	if err != nil {
		s.t.Fatalf("token: %v", err)
	}
	defer resp.Body.Close()
	var tok struct {
		AccessToken string `json:"access_token"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&tok); err != nil || resp.StatusCode != http.StatusOK || tok.AccessToken == "" {
		s.t.Fatalf("token: status %d, err %v", resp.StatusCode, err)
	}
	return tok.AccessToken
}

// do sends a request and returns the status and the raw body.
func (s *rtldSim) do(method, path string, body any) (int, []byte) {
	s.t.Helper()
	return s.doWith(s.token, method, path, body)
}

func (s *rtldSim) doWith(token, method, path string, body any) (int, []byte) {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		switch b := body.(type) {
		case string:
			rd = strings.NewReader(b)
		default:
			enc, err := json.Marshal(b)
			if err != nil {
				s.t.Fatal(err)
			}
			rd = bytes.NewReader(enc)
		}
	}
	req, err := http.NewRequest(method, s.base+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// validProfile returns a create body that passes every rule.
func validProfile(env string) map[string]any {
	return map[string]any{
		"environment_id": env,
		"profile_name":   "edgepipe",
		"description":    "edgepipe receiver",
		"enabled":        true,
		"fields":         []any{"timestamp", "uuid", "status_code", "host", "path"},
		"delivery_method": map[string]any{
			"type":                 "http_post",
			"destination_endpoint": "https://receiver.example.com/ingest/" + env,
			"log_format":           "json",
			"authentication": map[string]any{
				"type": "http_basic", "username": "edgepipe", "password": "s3cr3t-pa55",
			},
		},
	}
}

type errorObject struct {
	Type       string `json:"@type"`
	Code       string `json:"code"`
	StatusCode int    `json:"status_code"`
	Details    []struct {
		Type   string `json:"@type"`
		Source string `json:"source"`
	} `json:"details"`
}

func TestRTLDProfileValidation(t *testing.T) {
	sim := newRTLDSim(t, Config{Seed: 7})
	env := sim.srv.EnvironmentIDs()[0]
	long := strings.Repeat("x", 37)
	many := make([]any, 251)
	for i := range many {
		many[i] = fmt.Sprintf("X-H%d", i)
	}
	type mutate func(p map[string]any)
	dm := func(p map[string]any) map[string]any { return p["delivery_method"].(map[string]any) }
	auth := func(p map[string]any) map[string]any { return dm(p)["authentication"].(map[string]any) }
	tests := []struct {
		name   string
		mutate mutate
		source string // "" means the body is valid (201)
	}{
		{"valid", func(_ map[string]any) {}, ""},
		{"all optional fields valid", func(p map[string]any) {
			p["downsampling_percent"] = 0.1
			p["custom_cookies"] = []any{"session_id"}
			p["custom_request_headers"] = []any{"X-Request-Id"}
			p["custom_response_headers"] = []any{"Content-Language"}
			p["filters"] = map[string]any{"status_codes": []any{"5xx", "404"}, "host_names": map[string]any{"names": []any{"a.example.com"}, "condition": "in"}}
		}, ""},
		{"custom_authentication", func(p map[string]any) {
			dm(p)["authentication"] = map[string]any{"type": "custom_authentication", "token": "Bearer abc"}
		}, ""},
		{"every log format: json_lines", func(p map[string]any) { dm(p)["log_format"] = "json_lines" }, ""},
		{"environment_id missing", func(p map[string]any) { delete(p, "environment_id") }, "environment_id"},
		{"environment_id not a uuid", func(p map[string]any) { p["environment_id"] = "prod" }, "environment_id"},
		{"environment_id unknown", func(p map[string]any) { p["environment_id"] = "00000000-0000-4000-8000-000000000000" }, "environment_id"},
		{"profile_name missing", func(p map[string]any) { delete(p, "profile_name") }, "profile_name"},
		{"profile_name empty", func(p map[string]any) { p["profile_name"] = "" }, "profile_name"},
		{"profile_name 37 chars", func(p map[string]any) { p["profile_name"] = long }, "profile_name"},
		{"profile_name not a string", func(p map[string]any) { p["profile_name"] = 12 }, "profile_name"},
		{"description empty", func(p map[string]any) { p["description"] = "" }, "description"},
		{"description 1025 chars", func(p map[string]any) { p["description"] = strings.Repeat("d", 1025) }, "description"},
		{"enabled not boolean", func(p map[string]any) { p["enabled"] = "yes" }, "enabled"},
		{"downsampling not in enum", func(p map[string]any) { p["downsampling_percent"] = 10 }, "downsampling_percent"},
		{"fields missing", func(p map[string]any) { delete(p, "fields") }, "fields"},
		{"fields empty", func(p map[string]any) { p["fields"] = []any{} }, "fields"},
		{"fields duplicate", func(p map[string]any) { p["fields"] = []any{"uuid", "host", "uuid"} }, "fields[2]"},
		{"fields unknown code", func(p map[string]any) { p["fields"] = []any{"uuid", "no_such_field"} }, "fields[1]"},
		{"fields not strings", func(p map[string]any) { p["fields"] = []any{"uuid", 3} }, "fields[1]"},
		{"custom_cookies empty", func(p map[string]any) { p["custom_cookies"] = []any{} }, "custom_cookies"},
		{"custom_cookies duplicate", func(p map[string]any) { p["custom_cookies"] = []any{"a", "a"} }, "custom_cookies[1]"},
		{"custom_cookies bad name", func(p map[string]any) { p["custom_cookies"] = []any{"a;b"} }, "custom_cookies[0]"},
		{"custom_request_headers 251 items", func(p map[string]any) { p["custom_request_headers"] = many }, "custom_request_headers"},
		{"custom_request_headers pattern", func(p map[string]any) { p["custom_request_headers"] = []any{"X_Bad"} }, "custom_request_headers[0]"},
		{"custom_request_headers duplicate", func(p map[string]any) { p["custom_request_headers"] = []any{"X-A", "x-a"} }, "custom_request_headers[1]"},
		{"custom_response_headers pattern", func(p map[string]any) { p["custom_response_headers"] = []any{"ok", "bad header"} }, "custom_response_headers[1]"},
		{"custom_response_headers empty", func(p map[string]any) { p["custom_response_headers"] = []any{} }, "custom_response_headers"},
		{"filters not an object", func(p map[string]any) { p["filters"] = []any{} }, "filters"},
		{"filters bad status code", func(p map[string]any) { p["filters"] = map[string]any{"status_codes": []any{"2xx", "99"}} }, "filters.status_codes[1]"},
		{"filters unknown key", func(p map[string]any) { p["filters"] = map[string]any{"methods": []any{"GET"}} }, "filters.methods"},
		{"filters host_names condition", func(p map[string]any) {
			p["filters"] = map[string]any{"host_names": map[string]any{"names": []any{"a"}, "condition": "like"}}
		}, "filters.host_names.condition"},
		{"filters host_names names missing", func(p map[string]any) {
			p["filters"] = map[string]any{"host_names": map[string]any{"condition": "in"}}
		}, "filters.host_names.names"},
		{"delivery_method missing", func(p map[string]any) { delete(p, "delivery_method") }, "delivery_method"},
		{"delivery_method type missing", func(p map[string]any) { delete(dm(p), "type") }, "delivery_method.type"},
		{"delivery_method type s3", func(p map[string]any) { dm(p)["type"] = "s3" }, "delivery_method.type"},
		{"destination missing", func(p map[string]any) { delete(dm(p), "destination_endpoint") }, "delivery_method.destination_endpoint"},
		{"destination http", func(p map[string]any) { dm(p)["destination_endpoint"] = "http://r.example.com/ingest" }, "delivery_method.destination_endpoint"},
		{"destination too long", func(p map[string]any) {
			dm(p)["destination_endpoint"] = "https://r.example.com/" + strings.Repeat("a", 1010)
		}, "delivery_method.destination_endpoint"},
		{"log_format missing", func(p map[string]any) { delete(dm(p), "log_format") }, "delivery_method.log_format"},
		{"log_format unknown", func(p map[string]any) { dm(p)["log_format"] = "xml" }, "delivery_method.log_format"},
		{"authentication type unknown", func(p map[string]any) { auth(p)["type"] = "oauth" }, "delivery_method.authentication.type"},
		{"authentication username missing", func(p map[string]any) { delete(auth(p), "username") }, "delivery_method.authentication.username"},
		{"authentication password missing", func(p map[string]any) { delete(auth(p), "password") }, "delivery_method.authentication.password"},
		{"authentication password empty", func(p map[string]any) { auth(p)["password"] = "" }, "delivery_method.authentication.password"},
		{"custom_authentication token missing", func(p map[string]any) {
			dm(p)["authentication"] = map[string]any{"type": "custom_authentication"}
		}, "delivery_method.authentication.token"},
		{"unknown property", func(p map[string]any) { p["colour"] = "blue" }, "colour"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := validProfile(env)
			p["profile_name"] = fmt.Sprintf("p%d", i)
			tt.mutate(p)
			status, body := sim.do("POST", "/rtld/v1/accesslogs/profiles", p)
			if tt.source == "" {
				if status != http.StatusCreated {
					t.Fatalf("status %d, want 201: %s", status, body)
				}
				return
			}
			if status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", status, body)
			}
			var e errorObject
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("body is not an Error object: %v: %s", err, body)
			}
			if e.Type != "Error" || e.StatusCode != http.StatusBadRequest || e.Code == "" {
				t.Errorf("error object %+v", e)
			}
			var sources []string
			for _, d := range e.Details {
				if d.Type != "ErrorDetail" {
					t.Errorf("detail @type %q", d.Type)
				}
				sources = append(sources, d.Source)
			}
			if !slices.Contains(sources, tt.source) {
				t.Errorf("details sources %q do not name %q: %s", sources, tt.source, body)
			}
		})
	}

	t.Run("malformed JSON", func(t *testing.T) {
		status, body := sim.do("POST", "/rtld/v1/accesslogs/profiles", `{"profile_name":`)
		if status != 400 || !bytes.Contains(body, []byte(`"source":"body"`)) {
			t.Errorf("status %d: %s", status, body)
		}
	})
	t.Run("name not unique in environment", func(t *testing.T) {
		p := validProfile(env)
		p["profile_name"] = "dup"
		if status, body := sim.do("POST", "/rtld/v1/accesslogs/profiles", p); status != 201 {
			t.Fatalf("first create: %d %s", status, body)
		}
		status, body := sim.do("POST", "/rtld/v1/accesslogs/profiles", p)
		if status != 400 || !bytes.Contains(body, []byte(`"source":"profile_name"`)) {
			t.Errorf("second create: %d %s", status, body)
		}
		// The same name in another environment is fine.
		p["environment_id"] = sim.srv.EnvironmentIDs()[1]
		if status, body := sim.do("POST", "/rtld/v1/accesslogs/profiles", p); status != 201 {
			t.Errorf("other environment: %d %s", status, body)
		}
	})
}

func TestRTLDProfileLifecycle(t *testing.T) {
	sim := newRTLDSim(t, Config{Seed: 3})
	env := sim.srv.EnvironmentIDs()[0]
	p := validProfile(env)
	status, body := sim.do("POST", "/rtld/v1/accesslogs/profiles", p)
	if status != 201 {
		t.Fatalf("create: %d %s", status, body)
	}
	noSecret := func(what string, body []byte) {
		t.Helper()
		if bytes.Contains(body, []byte("s3cr3t-pa55")) || bytes.Contains(body, []byte(`"password"`)) {
			t.Errorf("%s echoes the password: %s", what, body)
		}
	}
	noSecret("create", body)
	var created profileView
	if err := json.Unmarshal(body, &created); err != nil {
		t.Fatal(err)
	}
	if created.AtType != "AccessLogsProfile" || created.ID == 0 || created.AtID != profilePath(created.ID) ||
		created.DeliveryMethod.Authentication == nil || created.DeliveryMethod.Authentication.Username != "edgepipe" {
		t.Errorf("created %+v", created)
	}
	item := fmt.Sprintf("/rtld/v1/accesslogs/profiles/%d", created.ID)
	q := "?environment_id=" + env

	status, body = sim.do("GET", item+q, nil)
	noSecret("get", body)
	if status != 200 {
		t.Fatalf("get: %d %s", status, body)
	}
	status, body = sim.do("GET", "/rtld/v1/accesslogs/profiles"+q, nil)
	noSecret("list", body)
	var list struct {
		Items      []profileView `json:"items"`
		TotalItems int           `json:"total_items"`
	}
	if err := json.Unmarshal(body, &list); err != nil || status != 200 || list.TotalItems != 1 || list.Items[0].ID != created.ID {
		t.Fatalf("list: %d %v %s", status, err, body)
	}

	// Update: PUT replaces the profile.
	p["enabled"] = false
	p["fields"] = []any{"uuid"}
	status, body = sim.do("PUT", item, p)
	noSecret("update", body)
	var updated profileView
	_ = json.Unmarshal(body, &updated)
	if status != 200 || updated.Enabled || !slices.Equal(updated.Fields, []string{"uuid"}) || updated.ID != created.ID {
		t.Fatalf("update: %d %s", status, body)
	}

	tests := []struct {
		name   string
		method string
		path   string
		body   any
		status int
	}{
		{"get without environment_id", "GET", item, nil, 400},
		{"get in another environment", "GET", item + "?environment_id=" + sim.srv.EnvironmentIDs()[1], nil, 404},
		{"get unknown id", "GET", "/rtld/v1/accesslogs/profiles/999999" + q, nil, 404},
		{"get non-integer id", "GET", "/rtld/v1/accesslogs/profiles/abc" + q, nil, 400},
		{"update unknown id", "PUT", "/rtld/v1/accesslogs/profiles/999999", validProfile(env), 404},
		{"update invalid body", "PUT", item, map[string]any{"environment_id": env}, 400},
		{"list without environment_id", "GET", "/rtld/v1/accesslogs/profiles", nil, 400},
		{"delete unknown id", "DELETE", "/rtld/v1/accesslogs/profiles/999999" + q, nil, 404},
		{"PATCH not allowed", "PATCH", item + q, nil, 405},
		{"delete", "DELETE", item + q, nil, 204},
		{"get after delete", "GET", item + q, nil, 404},
		{"delete again", "DELETE", item + q, nil, 404},
	}
	for _, tt := range tests {
		status, body := sim.do(tt.method, tt.path, tt.body)
		if status != tt.status {
			t.Errorf("%s: status %d, want %d: %s", tt.name, status, tt.status, body)
		}
	}
}

func TestRTLDScope(t *testing.T) {
	sim := newRTLDSim(t, Config{Seed: 1, Clients: []Client{
		{ID: DemoClientID, Secret: DemoClientSecret, Scopes: []string{ScopeRTLD}},
		{ID: "metrics-only", Secret: "m", Scopes: []string{ScopeMetrics}},
	}})
	tok := sim.fetchToken("metrics-only", "m", ScopeMetrics)
	for _, path := range []string{"/rtld/v1/accesslogs/fields", "/rtld/v1/cloud-regions",
		"/rtld/v1/accesslogs/profiles?environment_id=" + sim.srv.EnvironmentIDs()[0]} {
		if status, body := sim.doWith(tok, "GET", path, nil); status != 401 {
			t.Errorf("%s with app.metrics token: %d %s", path, status, body)
		}
		if status, body := sim.do("GET", path, nil); status != 200 {
			t.Errorf("%s with app.rtld token: %d %s", path, status, body)
		}
	}
}

func TestRTLDPagination(t *testing.T) {
	sim := newRTLDSim(t, Config{Seed: 1})
	type page struct {
		ID    string `json:"@id"`
		Type  string `json:"@type"`
		Links map[string]struct {
			Href string `json:"href"`
		} `json:"@links"`
		Items []struct {
			Code string `json:"code"`
			Name string `json:"name"`
		} `json:"items"`
		TotalItems int `json:"total_items"`
	}
	get := func(path string) (int, page, []byte) {
		status, body := sim.do("GET", path, nil)
		var p page
		_ = json.Unmarshal(body, &p)
		return status, p, body
	}
	// Default page: 50 items.
	status, first, body := get("/rtld/v1/accesslogs/fields")
	all := accesslog.Fields()
	if status != 200 || first.Type != "Collection" || first.TotalItems != len(all) || len(first.Items) != min(50, len(all)) {
		t.Fatalf("default page: %d %s", status, body)
	}
	// Walk every page by following next links.
	for _, limit := range []int{1, 7, 50, 1000} {
		var codes []string
		next := fmt.Sprintf("/rtld/v1/accesslogs/fields?limit=%d", limit)
		pages := 0
		for next != "" {
			status, p, body := get(next)
			if status != 200 || len(p.Items) > limit || p.TotalItems != len(all) {
				t.Fatalf("limit %d, %s: %d %s", limit, next, status, body)
			}
			for _, it := range p.Items {
				codes = append(codes, it.Code)
			}
			next = p.Links["next"].Href
			if p.Links["first"].Href == "" || p.Links["last"].Href == "" {
				t.Fatalf("missing first/last link: %s", body)
			}
			if pages++; pages > len(all)+1 {
				t.Fatal("next links do not end")
			}
		}
		if !slices.Equal(codes, accesslog.FieldCodes()) {
			t.Errorf("limit %d: walked %d codes, want the %d of the catalogue", limit, len(codes), len(all))
		}
	}
	// Offset beyond the end: empty page, no next.
	if status, p, body := get(fmt.Sprintf("/rtld/v1/accesslogs/fields?offset=%d", len(all))); status != 200 || len(p.Items) != 0 || p.Links["next"].Href != "" {
		t.Errorf("offset at end: %d %s", status, body)
	}
	if status, p, body := get("/rtld/v1/accesslogs/fields?limit=9223372036854775807&offset=3"); status != 200 || len(p.Items) != len(all)-3 || p.Links["next"].Href != "" {
		t.Errorf("huge limit: %d %s", status, body)
	}
	if status, p, _ := get("/rtld/v1/cloud-regions?limit=4&offset=2"); status != 200 || len(p.Items) != 4 || p.Items[0].Code != cloudRegions[2].Code || p.TotalItems != len(cloudRegions) {
		t.Errorf("cloud regions page: %d %+v", status, p)
	}
	bad := []struct{ query, source string }{
		{"limit=0", "limit"}, {"limit=-1", "limit"}, {"limit=x", "limit"},
		{"offset=-1", "offset"}, {"offset=1.5", "offset"},
	}
	for _, b := range bad {
		for _, path := range []string{"/rtld/v1/accesslogs/fields", "/rtld/v1/cloud-regions"} {
			status, body := sim.do("GET", path+"?"+b.query, nil)
			if status != 400 || !bytes.Contains(body, []byte(`"source":"`+b.source+`"`)) {
				t.Errorf("%s?%s: %d %s", path, b.query, status, body)
			}
		}
	}
}

func TestRTLDConcurrentCreateSameName(t *testing.T) {
	sim := newRTLDSim(t, Config{Seed: 2})
	env := sim.srv.EnvironmentIDs()[0]
	var wg sync.WaitGroup
	statuses := make([]int, 8)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i], _ = sim.do("POST", "/rtld/v1/accesslogs/profiles", validProfile(env))
		}()
	}
	wg.Wait()
	created := 0
	for _, s := range statuses {
		switch s {
		case 201:
			created++
		case 400:
		default:
			t.Errorf("status %d", s)
		}
	}
	if created != 1 || len(sim.srv.rtld.store.list(env)) != 1 {
		t.Errorf("%d creates succeeded, %d profiles stored; want 1", created, len(sim.srv.rtld.store.list(env)))
	}
}

func TestRTLDRequestBodyLimits(t *testing.T) {
	sim := newRTLDSim(t, Config{Seed: 1})
	env := sim.srv.EnvironmentIDs()[0]
	post := func(ctype string, body []byte) int {
		req, _ := http.NewRequest(http.MethodPost, sim.base+"/rtld/v1/accesslogs/profiles", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+sim.token)
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	valid, _ := json.Marshal(validProfile(env))
	other := validProfile(env)
	other["profile_name"] = "other"
	valid2, _ := json.Marshal(other)
	huge := append([]byte(`{"description":"`), bytes.Repeat([]byte("x"), maxProfileBodySize)...)
	tests := []struct {
		name, ctype string
		body        []byte
		want        int
	}{
		{"no content type", "", valid, 201},
		{"json with charset", "application/json; charset=utf-8", valid2, 201},
		{"text/plain", "text/plain", valid, 415},
		{"body over 1 MiB", "application/json", huge, 413},
		{"trailing data", "application/json", append(append([]byte{}, valid...), []byte(` {}`)...), 400},
	}
	for _, tt := range tests {
		if got := post(tt.ctype, tt.body); got != tt.want {
			t.Errorf("%s: status %d, want %d", tt.name, got, tt.want)
		}
	}
}
