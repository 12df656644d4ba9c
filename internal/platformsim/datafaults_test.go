package platformsim_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/platformsim"
)

// rawRows returns the raw data_rows of a data answer.
func rawRows(t *testing.T, r response) []json.RawMessage {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("data: %d %s", r.status, r.body)
	}
	var body struct {
		DataRows []json.RawMessage `json:"data_rows"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatalf("the answer must stay valid JSON: %v", err)
	}
	return body.DataRows
}

// TestBadValueFaults checks each kind of bad value as it appears on the
// wire: every replaced value is exactly the kind's literal, negatives only
// in counts, the rest of the row untouched, and about the configured share.
func TestBadValueFaults(t *testing.T) {
	srv, base := startSim(t, platformsim.Config{Seed: 4, Now: func() time.Time { return testNow }, Numbers: platformsim.NumbersOnly})
	tok := token(t, base, "app.metrics")
	envs := srv.EnvironmentIDs()[:5]
	metrics := srv.DatasetMetrics("edge_usage_by_country")
	dims := allDims(srv, "edge_usage_by_country")
	q := query(envs, dims, metrics, testNow.Add(-3*time.Hour).Truncate(5*time.Minute), testNow.Truncate(5*time.Minute), "FIVE_MINUTES")
	clean := map[string][]json.RawMessage{}
	for _, row := range rawRows(t, dataQuery(t, base, tok, "edge_usage_by_country", q)) {
		var vals []json.RawMessage
		if err := json.Unmarshal(row, &vals); err != nil {
			t.Fatal(err)
		}
		clean[string(vals[0])+string(vals[1])+string(vals[2])] = vals
	}
	for _, tc := range []struct {
		kind    platformsim.BadValue
		literal string
	}{
		{platformsim.BadNull, `null`},
		{platformsim.BadNaN, `"NaN"`},
		{platformsim.BadInfinity, `"Infinity"`},
		{platformsim.BadNegative, `-12345`},
		{platformsim.BadText, `"n/a"`},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			srv.SetFaults(platformsim.Faults{BadValues: tc.kind, BadValueRate: 0.25})
			defer srv.SetFaults(platformsim.Faults{})
			bad, eligible := 0, 0
			for _, row := range rawRows(t, dataQuery(t, base, tok, "edge_usage_by_country", q)) {
				var vals []json.RawMessage
				if err := json.Unmarshal(row, &vals); err != nil {
					t.Fatal(err)
				}
				want := clean[string(vals[0])+string(vals[1])+string(vals[2])]
				if want == nil {
					t.Fatalf("row %s is not in the clean answer", row)
				}
				for i := 3; i < len(vals); i++ {
					m := metrics[i-3]
					count := strings.HasSuffix(m, "_total")
					if tc.kind != platformsim.BadNegative || count {
						eligible++
					}
					switch string(vals[i]) {
					case string(want[i]):
					case tc.literal:
						bad++
						if tc.kind == platformsim.BadNegative && !count {
							t.Errorf("negative in %s, which is not a count", m)
						}
					default:
						t.Errorf("%s = %s, want %s or %s", m, vals[i], want[i], tc.literal)
					}
				}
			}
			if share := float64(bad) / float64(eligible); share < 0.2 || share > 0.3 {
				t.Errorf("%d of %d values replaced (%.2f), want about 0.25", bad, eligible, share)
			}
			st := srv.Stats().Data
			if got := st[len(st)-1].BadValues; got != bad {
				t.Errorf("Stats reports %d bad values, the answer held %d", got, bad)
			}
		})
	}
}

// TestMalformedRowFaults checks that malformed rows replace whole rows and
// that the answer stays valid JSON with the other rows intact.
func TestMalformedRowFaults(t *testing.T) {
	srv, base := startSim(t, platformsim.Config{Seed: 4, Now: func() time.Time { return testNow }})
	tok := token(t, base, "app.metrics")
	dims := allDims(srv, "edge_errors")
	q := query(srv.EnvironmentIDs()[:5], dims, []string{"requests_edge_total"},
		testNow.Add(-3*time.Hour).Truncate(5*time.Minute), testNow.Truncate(5*time.Minute), "FIVE_MINUTES")
	n := len(rawRows(t, dataQuery(t, base, tok, "edge_errors", q)))
	srv.SetFaults(platformsim.Faults{MalformedRowRate: 0.3})
	rows := rawRows(t, dataQuery(t, base, tok, "edge_errors", q))
	if len(rows) != n {
		t.Fatalf("%d rows with faults, %d without", len(rows), n)
	}
	kinds := map[string]int{}
	for _, row := range rows {
		var vals []json.RawMessage
		switch {
		case bytes.HasPrefix(row, []byte("{")):
			kinds["object"]++
		case json.Unmarshal(row, &vals) != nil:
			t.Fatalf("row %s", row)
		case len(vals) < len(dims)+1:
			kinds["short"]++
		case len(vals) > len(dims)+1:
			kinds["long"]++
		default:
			kinds["good"]++
		}
	}
	bad := n - kinds["good"]
	if st := srv.Stats().Data; st[len(st)-1].MalformedRows != bad {
		t.Errorf("Stats reports %d malformed rows, the answer held %d", st[len(st)-1].MalformedRows, bad)
	}
	if kinds["object"] == 0 || kinds["short"] == 0 || kinds["long"] == 0 || bad < n/5 || bad > n*2/5 {
		t.Errorf("row kinds %v of %d, want about 30%% malformed of every kind", kinds, n)
	}
}

// TestClockOffsetAndDateHeader checks that every answer's Date is the
// platform's clock, and that a clock offset moves which buckets exist.
func TestClockOffsetAndDateHeader(t *testing.T) {
	clk := newClock(testNow) // 14:02:30
	srv, base := startSim(t, platformsim.Config{Seed: 4, Now: clk.Now, ClockOffset: -40 * time.Minute})
	tok := token(t, base, "app.metrics")
	env := srv.EnvironmentIDs()[0]
	q := query([]string{env}, []string{"time"}, []string{"requests_edge_total"}, testNow.Add(-2*time.Hour), testNow.Add(time.Hour), "FIVE_MINUTES")
	newest := func() (time.Time, time.Time) {
		t.Helper()
		r := dataQuery(t, base, tok, "edge_usage_by_country", q)
		date, err := http.ParseTime(r.header.Get("Date"))
		if err != nil {
			t.Fatalf("Date %q: %v", r.header.Get("Date"), err)
		}
		_, rows := dataRows(t, r)
		var last time.Time
		for _, row := range rows {
			ts, err := time.Parse(time.RFC3339, row.s("time"))
			if err != nil {
				t.Fatal(err)
			}
			if ts.After(last) {
				last = ts
			}
		}
		return date, last
	}
	date, last := newest()
	if want := testNow.Add(-40 * time.Minute); !date.Equal(want.Truncate(time.Second)) || !last.Equal(want.Truncate(5*time.Minute)) {
		t.Errorf("40 min behind: Date %s, newest bucket %s; want %s and the bucket in progress then", date, last, want)
	}
	if !srv.Now().Equal(testNow.Add(-40 * time.Minute)) {
		t.Errorf("Now() = %s", srv.Now())
	}
	srv.SetClockOffset(0)
	tok = token(t, base, "app.metrics") // the clock's jump expired the old one
	date, last = newest()
	if !date.Equal(testNow) || !last.Equal(testNow.Truncate(5*time.Minute)) {
		t.Errorf("caught up: Date %s, newest bucket %s", date, last)
	}
	// The token endpoint's answers carry the platform's Date too.
	r := tokenRequest(t, base, nil)
	if d, err := http.ParseTime(r.header.Get("Date")); err != nil || !d.Equal(testNow) {
		t.Errorf("token endpoint Date %q", r.header.Get("Date"))
	}
}

// TestLimitsAgreeWithTheClient is the check that keeps the simulator an
// independent oracle honest: its own table of the API's limits and the
// client's constants must agree, and the client's requests at the limits
// are accepted while one beyond is refused.
func TestLimitsAgreeWithTheClient(t *testing.T) {
	lim := platformsim.APILimits()
	if lim.MaxFilterValues != metricsapi.MaxFilterValues {
		t.Errorf("filter values: simulator %d, client %d", lim.MaxFilterValues, metricsapi.MaxFilterValues)
	}
	if len(lim.Granularities) != len(metricsapi.Granularities) {
		t.Fatalf("granularities: simulator %v, client %v", lim.Granularities, metricsapi.Granularities)
	}
	for i, g := range metricsapi.Granularities {
		sg := lim.Granularities[i]
		if sg.Name != string(g) || sg.Bucket != g.Duration() || sg.MaxRange != g.MaxRange() {
			t.Errorf("granularity %d: simulator %+v, client %s bucket %s range %s", i, sg, g, g.Duration(), g.MaxRange())
		}
	}
	if platform.PageSize < lim.MinPageSize || platform.PageSize > lim.MaxPageSize {
		t.Errorf("the client walks pages of %d, the simulator accepts %d..%d", platform.PageSize, lim.MinPageSize, lim.MaxPageSize)
	}

	// Behaviour at the limits, through the client's own planner.
	srv, base := startSim(t, platformsim.Config{Seed: 4, Now: func() time.Time { return testNow }, Environments: 45})
	tok := token(t, base, "app.metrics")
	envs := srv.EnvironmentIDs()
	for _, g := range metricsapi.Granularities {
		end := g.Truncate(testNow)
		reqs, err := metricsapi.Plan(metricsapi.Query{Dataset: "edge_errors", Environments: envs, Granularity: g,
			Start: end.Add(-g.MaxRange() - g.Duration()), End: end, Metrics: []string{"requests_edge_total"}})
		if err != nil {
			t.Fatal(err)
		}
		full := 0
		for _, r := range reqs {
			if len(r.Environments) == lim.MaxFilterValues && r.End.Sub(r.Start) == g.MaxRange() {
				full++
			}
			resp := dataQuery(t, base, tok, "edge_errors", bodyOf(r.Body()))
			if resp.status != http.StatusOK {
				t.Errorf("%s: planned request of %d environments over %s refused: %s", g, len(r.Environments), r.End.Sub(r.Start), resp.body)
			}
		}
		if full == 0 {
			t.Errorf("%s: no request at both limits, the test proves nothing", g)
		}
		over := query(envs[:lim.MaxFilterValues+1], []string{"time"}, []string{"requests_edge_total"}, end.Add(-g.Duration()), end, string(g))
		checkError(t, dataQuery(t, base, tok, "edge_errors", over), http.StatusBadRequest, "filters.environment_id")
		long := query(envs[:1], []string{"time"}, []string{"requests_edge_total"}, end.Add(-g.MaxRange()-g.Duration()), end, string(g))
		checkError(t, dataQuery(t, base, tok, "edge_errors", long), http.StatusBadRequest, "date_range")
	}
	// Page sizes at and beyond the limit.
	org := platformsim.DemoOrganizationID
	accTok := token(t, base, "app.accounts")
	for size, want := range map[int]int{lim.MaxPageSize: 200, lim.MaxPageSize + 1: 400, lim.MinPageSize - 1: 400} {
		r := do(t, http.MethodGet, fmt.Sprintf("%s/accounts/v0.1/properties?organization_id=%s&page_size=%d", base, org, size), "Bearer "+accTok, "", "")
		if r.status != want {
			t.Errorf("page_size %d: %d, want %d", size, r.status, want)
		}
	}
}

// bodyOf turns a client request body into the map dataQuery sends.
func bodyOf(b metricsapi.Body) map[string]any {
	var m map[string]any
	raw, _ := json.Marshal(b)
	_ = json.Unmarshal(raw, &m)
	return m
}
