package reconcile

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// profilesPath is the RTLD profile collection (the registrar's).
const profilesPath = "/accesslogs/profiles"

// ProfileAPI is the RTLD service as the registrar calls it
// (rtld.ProfileAPI).
type ProfileAPI interface {
	Do(ctx context.Context, method, path string, query url.Values, in, out any) error
}

// ProfileTap is a ProfileAPI that passes every call on and learns from the
// answers about the receiver's own profile what the reconciliation needs:
// each list that shows it, each create and each update is an observation of
// its state, timed by the platform's clock (between the greatest Date seen
// before the call and the one seen after it). Give it to the registrar in
// place of the RTLD service; Watch uses it on its own when profiles are not
// registered. It is safe for concurrent use.
type ProfileTap struct {
	api         ProfileAPI
	name        string
	destination func(env string) string // nil: any
	clock       *PlatformTime
	observe     func(env string, s ProfileState, lo, hi time.Time)
}

// Do implements ProfileAPI.
func (t *ProfileTap) Do(ctx context.Context, method, path string, query url.Values, in, out any) error {
	lo, _ := t.clock.Floor()
	err := t.api.Do(ctx, method, path, query, in, out)
	if err != nil {
		return err
	}
	hi, ok := t.clock.Floor()
	if !ok {
		return nil // no Date: the answer cannot be placed in time
	}
	hi = hi.Add(time.Second) // a Date is truncated to the second
	switch {
	case method == http.MethodGet && path == profilesPath:
		t.listed(query, out, lo, hi)
	case method == http.MethodPost && path == profilesPath:
		p, ok := decodeProfile(out)
		if !ok || p.EnvironmentID == "" {
			p, ok = decodeProfile(in)
		}
		if ok && p.ProfileName == t.name {
			t.observe(p.EnvironmentID, t.stateOf(&p), lo, hi)
		}
	case method == http.MethodPut && strings.HasPrefix(path, profilesPath+"/"):
		if p, ok := decodeProfile(in); ok && p.ProfileName == t.name {
			t.observe(p.EnvironmentID, t.stateOf(&p), lo, hi)
		}
	}
	return nil
}

// listed observes one page of an environment's profiles: the receiver's
// profile when the page holds it (the lowest ID of that name, as the
// registrar keeps), its absence when the page is the whole list.
func (t *ProfileTap) listed(query url.Values, out any, lo, hi time.Time) {
	env := query.Get("environment_id")
	if env == "" {
		return
	}
	var page struct {
		Items []profileView `json:"items"`
	}
	if !remarshal(out, &page) {
		return
	}
	var mine *profileView
	for i := range page.Items {
		if p := &page.Items[i]; p.ProfileName == t.name && (mine == nil || p.ID < mine.ID) {
			mine = p
		}
	}
	limit, _ := strconv.Atoi(query.Get("limit"))
	switch {
	case mine != nil:
		t.observe(env, t.stateOf(mine), lo, hi)
	case query.Get("offset") == "0" && len(page.Items) < limit:
		t.observe(env, ProfileState{Percent: 100}, lo, hi)
	}
}

// profileView is the part of a profile the reconciliation reads.
type profileView struct {
	ID                  int64    `json:"id"`
	EnvironmentID       string   `json:"environment_id"`
	ProfileName         string   `json:"profile_name"`
	Enabled             bool     `json:"enabled"`
	DownsamplingPercent *float64 `json:"downsampling_percent"`
	Filters             *struct {
		StatusCodes []string `json:"status_codes"`
		HostNames   *struct {
			Names []string `json:"names"`
		} `json:"host_names"`
	} `json:"filters"`
	DeliveryMethod struct {
		Type                string `json:"type"`
		DestinationEndpoint string `json:"destination_endpoint"`
	} `json:"delivery_method"`
}

func (t *ProfileTap) stateOf(p *profileView) ProfileState {
	s := ProfileState{Delivering: p.Enabled && p.DeliveryMethod.Type == "http_post", Percent: 100}
	if t.destination != nil && strings.TrimRight(p.DeliveryMethod.DestinationEndpoint, "/") != t.destination(p.EnvironmentID) {
		s.Delivering = false
	}
	if p.DownsamplingPercent != nil {
		s.Percent = *p.DownsamplingPercent
	}
	if f := p.Filters; f != nil && (len(f.StatusCodes) > 0 || (f.HostNames != nil && len(f.HostNames.Names) > 0)) {
		s.Filtered = true
	}
	return s
}

// decodeProfile reads a profile from a request or answer body value.
func decodeProfile(v any) (profileView, bool) {
	var p profileView
	ok := remarshal(v, &p)
	return p, ok && p.ProfileName != ""
}

// remarshal decodes the JSON form of v (a body the registrar built or
// decoded into its own types) into out.
func remarshal(v, out any) bool {
	if v == nil {
		return false
	}
	b, err := json.Marshal(v)
	if err != nil {
		return false
	}
	return json.Unmarshal(b, out) == nil
}

// watchOnce lists env's profiles through the tap (when the receiver does
// not register profiles, this is how it sees them).
func (t *ProfileTap) watchOnce(ctx context.Context, env string) error {
	const limit = 100
	for offset := 0; offset < 100*limit; offset += limit {
		var page struct {
			Items []json.RawMessage `json:"items"`
		}
		q := url.Values{"environment_id": {env}, "limit": {strconv.Itoa(limit)}, "offset": {strconv.Itoa(offset)}}
		if err := t.Do(ctx, http.MethodGet, profilesPath, q, nil, &page); err != nil {
			return err
		}
		if len(page.Items) < limit {
			return nil
		}
	}
	return nil
}
