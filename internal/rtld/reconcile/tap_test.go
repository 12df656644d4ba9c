package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// scriptedAPI answers each call with the JSON in answers[method+" "+path],
// moving the platform's clock (the Date of the answer) to date.
type scriptedAPI struct {
	clock   *PlatformTime
	date    time.Time
	answers map[string]string
	err     error
}

func (a *scriptedAPI) Do(_ context.Context, method, path string, _ url.Values, _, out any) error {
	if a.err != nil {
		return a.err
	}
	a.clock.ObserveDate(a.date, 0)
	if body, ok := a.answers[method+" "+path]; ok && out != nil {
		return json.Unmarshal([]byte(body), out)
	}
	return nil
}

type observation struct {
	env    string
	state  ProfileState
	lo, hi time.Time
}

func TestProfileTapObservesTheReceiversProfile(t *testing.T) {
	const dest = "https://rx.example.com/ingest/env-a"
	profile := func(id int, name string, enabled bool, pct string, dest, filters string) string {
		return `{"id":` + itoa(id) + `,"environment_id":"env-a","profile_name":"` + name + `","enabled":` + btoa(enabled) +
			`,"downsampling_percent":` + pct + `,"filters":` + filters + `,"delivery_method":{"type":"http_post","destination_endpoint":"` + dest + `"}}`
	}
	list := func(items ...string) string { return `{"items":[` + strings.Join(items, ",") + `]}` }
	page := url.Values{"environment_id": {"env-a"}, "limit": {"100"}, "offset": {"0"}}
	full := ProfileState{Delivering: true, Percent: 100}
	for _, tc := range []struct {
		name         string
		method, path string
		query        url.Values
		in           any
		answer       string
		err          error
		want         *ProfileState
	}{
		{"listed, sampled", http.MethodGet, profilesPath, page, nil,
			list(profile(3, "other", true, "null", dest, "null"), profile(5, "edgepipe", true, "25", dest, "null")), nil,
			&ProfileState{Delivering: true, Percent: 25}},
		{"listed twice: the lowest ID counts", http.MethodGet, profilesPath, page, nil,
			list(profile(9, "edgepipe", false, "null", dest, "null"), profile(5, "edgepipe", true, "null", dest, "null")), nil, &full},
		{"posting elsewhere", http.MethodGet, profilesPath, page, nil,
			list(profile(5, "edgepipe", true, "null", "https://elsewhere.example.com/x", "null")), nil, &ProfileState{Percent: 100}},
		{"filtered", http.MethodGet, profilesPath, page, nil,
			list(profile(5, "edgepipe", true, "null", dest, `{"status_codes":["5xx"]}`)), nil, &ProfileState{Delivering: true, Percent: 100, Filtered: true}},
		{"absent from the whole list", http.MethodGet, profilesPath, page, nil, list(profile(3, "other", true, "null", dest, "null")), nil,
			&ProfileState{Percent: 100}},
		{"absent from one page of several: unknown", http.MethodGet, profilesPath,
			url.Values{"environment_id": {"env-a"}, "limit": {"1"}, "offset": {"0"}}, nil, list(profile(3, "other", true, "null", dest, "null")), nil, nil},
		{"created", http.MethodPost, profilesPath, nil, nil, profile(5, "edgepipe", true, "null", dest, "null"), nil, &full},
		{"updated", http.MethodPut, profilesPath + "/5", nil,
			map[string]any{"environment_id": "env-a", "profile_name": "edgepipe", "enabled": true, "downsampling_percent": 0.1,
				"delivery_method": map[string]any{"type": "http_post", "destination_endpoint": dest}}, "", nil,
			&ProfileState{Delivering: true, Percent: 0.1}},
		{"failed", http.MethodGet, profilesPath, page, nil, "", errors.New("503"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := NewPlatformTime(nil)
			before := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
			clock.ObserveDate(before, 0)
			api := &scriptedAPI{clock: clock, date: before.Add(7 * time.Second), answers: map[string]string{tc.method + " " + tc.path: tc.answer}, err: tc.err}
			var got []observation
			tap := &ProfileTap{api: api, name: "edgepipe", clock: clock,
				destination: func(env string) string { return "https://rx.example.com/ingest/" + env },
				observe: func(env string, s ProfileState, lo, hi time.Time) {
					got = append(got, observation{env, s, lo, hi})
				}}
			var out any
			if tc.method != http.MethodPut {
				out = &map[string]any{}
			}
			_ = tap.Do(context.Background(), tc.method, tc.path, tc.query, tc.in, out)
			if tc.want == nil {
				if len(got) > 0 {
					t.Fatalf("observed %+v", got)
				}
				return
			}
			if len(got) != 1 || got[0].env != "env-a" || got[0].state != *tc.want {
				t.Fatalf("observed %+v, want %+v in env-a", got, *tc.want)
			}
			if !got[0].lo.Equal(before) || !got[0].hi.Equal(before.Add(8*time.Second)) {
				t.Errorf("between %v and %v, want the Date before the call and the answer's Date + 1s", got[0].lo, got[0].hi)
			}
		})
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func btoa(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// TestProfileTapWatch: without a registrar the reconciliation lists the
// profiles itself, a page at a time, and learns the same states.
func TestProfileTapWatch(t *testing.T) {
	clock := NewPlatformTime(nil)
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	clock.ObserveDate(t0, 0)
	api := &scriptedAPI{clock: clock, date: t0.Add(time.Minute), answers: map[string]string{
		http.MethodGet + " " + profilesPath: `{"items":[{"id":4,"environment_id":"env-a","profile_name":"edgepipe","enabled":true,"downsampling_percent":50,"delivery_method":{"type":"http_post","destination_endpoint":"https://anywhere.example.com/x"}}]}`,
	}}
	var got []ProfileState
	tap := &ProfileTap{api: api, name: "edgepipe", clock: clock,
		observe: func(_ string, s ProfileState, _, _ time.Time) { got = append(got, s) }}
	if err := tap.watchOnce(context.Background(), "env-a"); err != nil {
		t.Fatal(err)
	}
	// No destination to check (--no-register): any counts.
	if want := (ProfileState{Delivering: true, Percent: 50}); len(got) != 1 || got[0] != want {
		t.Fatalf("observed %+v, want %+v", got, want)
	}
}
