package platformsim_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/platformsim"
)

func TestDefaultWorld(t *testing.T) {
	srv := platformsim.New(platformsim.Config{Seed: 1})
	defer srv.Close()
	props := srv.Properties()
	envs := srv.Environments()
	if len(props) != 3 || len(envs) != 25 {
		t.Fatalf("default world: %d properties, %d environments; want 3 and 25", len(props), len(envs))
	}
	perProp := map[string]int{}
	ids := map[string]bool{}
	for _, e := range envs {
		perProp[e.PropertyID]++
		if ids[e.ID] {
			t.Fatalf("duplicate environment ID %s", e.ID)
		}
		ids[e.ID] = true
		if len(e.ID) != 36 || e.ID[14] != '4' {
			t.Fatalf("environment ID %q is not a v4 UUID", e.ID)
		}
		if len(e.Origins) < 2 {
			t.Fatalf("environment %s has origins %v", e.Name, e.Origins)
		}
	}
	for i, p := range props {
		want := []int{9, 8, 8}[i]
		if perProp[p.ID] != want || p.OrganizationID != platformsim.DemoOrganizationID {
			t.Fatalf("property %d: %d environments, org %s", i, perProp[p.ID], p.OrganizationID)
		}
	}
	// Same seed, same world; another seed, other IDs.
	again := platformsim.New(platformsim.Config{Seed: 1})
	defer again.Close()
	other := platformsim.New(platformsim.Config{Seed: 2})
	defer other.Close()
	if again.Environments()[7].ID != envs[7].ID {
		t.Fatal("same seed gave other environment IDs")
	}
	if other.Environments()[7].ID == envs[7].ID {
		t.Fatal("another seed gave the same environment IDs")
	}
	if other.Organization().ID != platformsim.DemoOrganizationID {
		t.Fatal("organization ID depends on the seed")
	}
}

// walk fetches every page of a paginated list and checks the envelope.
func walk(t *testing.T, base, tok, path string, size int) []map[string]any {
	t.Helper()
	var all []map[string]any
	total := -1
	for page := 0; ; page++ {
		r := do(t, http.MethodGet, fmt.Sprintf("%s%s&page=%d&page_size=%d", base, path, page, size), "Bearer "+tok, "", "")
		if r.status != 200 {
			t.Fatalf("page %d: %d %s", page, r.status, r.body)
		}
		m := r.json(t)
		n, _ := m["total_items"].(json.Number).Int64()
		if total >= 0 && int(n) != total {
			t.Fatalf("total_items changed from %d to %d", total, n)
		}
		total = int(n)
		if m["@type"] == "" || m["@id"] == "" {
			t.Fatalf("envelope without @type/@id: %s", r.body)
		}
		links := m["@links"].(map[string]any)
		for _, k := range []string{"first", "last"} {
			l, ok := links[k].(map[string]any)
			if !ok || l["href"] == "" || l["base_path"] == "" || l["description"] == "" {
				t.Fatalf("link %s missing or incomplete: %v", k, links)
			}
		}
		items := m["items"].([]any)
		if len(items) > size {
			t.Fatalf("page of %d items for page_size %d", len(items), size)
		}
		for _, it := range items {
			obj := it.(map[string]any)
			for _, k := range []string{"@type", "@id", "@links", "id"} {
				if _, ok := obj[k]; !ok {
					t.Fatalf("item without %s: %v", k, obj)
				}
			}
			all = append(all, obj)
		}
		_, hasNext := links["next"]
		_, hasPrev := links["previous"]
		if hasPrev != (page > 0) {
			t.Fatalf("page %d: previous link present=%v", page, hasPrev)
		}
		if !hasNext {
			if len(all) != total {
				t.Fatalf("walked %d items, total_items %d", len(all), total)
			}
			return all
		}
		if page > 100 {
			t.Fatal("pagination does not end")
		}
	}
}

func TestAccountsPagination(t *testing.T) {
	srv, base := startSim(t, platformsim.Config{Seed: 3, Properties: 3, Environments: 25})
	tok := token(t, base, "app.accounts")
	props := walk(t, base, tok, "/accounts/v0.1/properties?organization_id="+platformsim.DemoOrganizationID, 2)
	if len(props) != 3 {
		t.Fatalf("%d properties", len(props))
	}
	seen := map[string]bool{}
	for _, sizes := range []int{1, 4, 20, 100} {
		var got []string
		for _, p := range props {
			for _, e := range walk(t, base, tok, "/accounts/v0.1/environments?property_id="+p["id"].(string), sizes) {
				if e["property_id"] != p["id"] {
					t.Fatalf("environment %v listed under property %v", e["id"], p["id"])
				}
				got = append(got, e["id"].(string))
			}
		}
		if len(got) != 25 {
			t.Fatalf("page_size %d: walked %d environments", sizes, len(got))
		}
		dup := map[string]bool{}
		for _, id := range got {
			if dup[id] {
				t.Fatalf("page_size %d: environment %s twice", sizes, id)
			}
			dup[id] = true
			seen[id] = true
		}
	}
	for _, e := range srv.Environments() {
		if !seen[e.ID] {
			t.Fatalf("environment %s never listed", e.ID)
		}
	}

	t.Run("default page size is 20", func(t *testing.T) {
		r := do(t, http.MethodGet, base+"/accounts/v0.1/environments?property_id="+props[0]["id"].(string), "Bearer "+tok, "", "")
		items := r.json(t)["items"].([]any)
		if len(items) != 9 {
			t.Fatalf("%d items", len(items))
		}
	})
	t.Run("page past the end is empty", func(t *testing.T) {
		r := do(t, http.MethodGet, base+"/accounts/v0.1/environments?page=5&property_id="+props[0]["id"].(string), "Bearer "+tok, "", "")
		if r.status != 200 || len(r.json(t)["items"].([]any)) != 0 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	})

	env := srv.Environments()[4]
	tests := []struct {
		name   string
		method string
		path   string
		status int
		source string
	}{
		{"organization", "GET", "/accounts/v0.1/organizations/" + platformsim.DemoOrganizationID, 200, ""},
		{"property", "GET", "/accounts/v0.1/properties/" + env.PropertyID, 200, ""},
		{"environment", "GET", "/accounts/v0.1/environments/" + env.ID, 200, ""},
		{"unknown organization", "GET", "/accounts/v0.1/organizations/00000000-0000-4000-8000-000000000000", 404, "id"},
		{"unknown property", "GET", "/accounts/v0.1/properties/nope", 404, "id"},
		{"unknown environment", "GET", "/accounts/v0.1/environments/nope", 404, "id"},
		{"properties of unknown organization", "GET", "/accounts/v0.1/properties?organization_id=nope", 404, "id"},
		{"environments of unknown property", "GET", "/accounts/v0.1/environments?property_id=nope", 404, "id"},
		{"properties without organization", "GET", "/accounts/v0.1/properties", 400, "organization_id"},
		{"environments without property", "GET", "/accounts/v0.1/environments", 400, "property_id"},
		{"page_size 0", "GET", "/accounts/v0.1/environments?page_size=0&property_id=" + env.PropertyID, 400, "page_size"},
		{"page_size 101", "GET", "/accounts/v0.1/environments?page_size=101&property_id=" + env.PropertyID, 400, "page_size"},
		{"page_size text", "GET", "/accounts/v0.1/environments?page_size=ten&property_id=" + env.PropertyID, 400, "page_size"},
		{"negative page", "GET", "/accounts/v0.1/environments?page=-1&property_id=" + env.PropertyID, 400, "page"},
		{"POST on a list", "POST", "/accounts/v0.1/environments", 405, ""},
		{"PATCH on an item", "PATCH", "/accounts/v0.1/environments/" + env.ID, 405, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, tc.method, base+tc.path, "Bearer "+tok, "", "")
			if tc.status != 200 {
				checkError(t, r, tc.status, tc.source)
				return
			}
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			m := r.json(t)
			if m["@type"] == "" || m["@id"] == "" || m["@links"] == nil || m["id"] == "" {
				t.Fatalf("object without envelope fields: %s", r.body)
			}
		})
	}
	t.Run("environment fields", func(t *testing.T) {
		m := do(t, "GET", base+"/accounts/v0.1/environments/"+env.ID, "Bearer "+tok, "", "").json(t)
		for _, k := range []string{"property_id", "legacy_account_number", "name", "default_domain_name", "dns_domain_name", "can_members_deploy", "only_maintainers_can_deploy", "http_request_logging", "pci_compliance", "created_at", "updated_at"} {
			if _, ok := m[k]; !ok {
				t.Errorf("environment without %s", k)
			}
		}
		if m["name"] != env.Name || m["id"] != env.ID {
			t.Errorf("environment %v, want %s", m, env.Name)
		}
	})
}

func TestEnvironmentsChange(t *testing.T) {
	clk := newClock(testNow)
	srv, base := startSim(t, platformsim.Config{Seed: 4, Now: clk.Now})
	tok := token(t, base, "app.accounts app.metrics")
	prop := srv.Properties()[1]
	listed := func() map[string]bool {
		out := map[string]bool{}
		for _, e := range walk(t, base, tok, "/accounts/v0.1/environments?property_id="+prop.ID, 5) {
			out[e["id"].(string)] = true
		}
		return out
	}
	before := listed()
	if _, err := srv.AddEnvironment(prop.ID, "Bad Name"); err == nil {
		t.Fatal("invalid name accepted")
	}
	if _, err := srv.AddEnvironment("nope", "preview-2"); err == nil {
		t.Fatal("unknown property accepted")
	}
	added, err := srv.AddEnvironment(prop.ID, "preview-2")
	if err != nil {
		t.Fatal(err)
	}
	again := platformsim.New(platformsim.Config{Seed: 4})
	defer again.Close()
	if same, _ := again.AddEnvironment(again.Properties()[1].ID, "preview-2"); same.ID != added.ID {
		t.Fatal("added environment ID does not follow the seed")
	}
	after := listed()
	if len(after) != len(before)+1 || !after[added.ID] {
		t.Fatalf("added environment not listed: %d → %d", len(before), len(after))
	}
	q := query([]string{added.ID}, []string{"time"}, []string{"requests_edge_total"}, testNow.Add(-6*time.Hour).Truncate(time.Hour), testNow.Truncate(time.Hour), "HOUR")
	dataRows(t, dataQuery(t, base, tok, "edge_usage_by_country", q))

	victim := srv.Environments()[0]
	r := do(t, http.MethodDelete, base+"/accounts/v0.1/environments/"+victim.ID, "Bearer "+tok, "", "")
	if r.status != 200 || r.json(t)["id"] != victim.ID {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	checkError(t, do(t, http.MethodGet, base+"/accounts/v0.1/environments/"+victim.ID, "Bearer "+tok, "", ""), 404, "id")
	checkError(t, do(t, http.MethodDelete, base+"/accounts/v0.1/environments/"+victim.ID, "Bearer "+tok, "", ""), 404, "id")
	q["filters"] = map[string]any{"environment_id": []string{victim.ID}}
	checkError(t, dataQuery(t, base, tok, "edge_usage_by_country", q), 400, "filters.environment_id[0]")
	if len(srv.Environments()) != 25 {
		t.Fatalf("%d environments after one added and one removed", len(srv.Environments()))
	}
}

// TestWorldOf1000Environments is the world make bench-scale polls: 1,000
// environments in 10 properties, 100 each, with distinct IDs and, within a
// property, distinct names; every environment has edge traffic in the last
// hour, and the sizes vary as in a real organization (a few big production
// environments carry most of it).
func TestWorldOf1000Environments(t *testing.T) {
	srv := platformsim.New(platformsim.Config{Seed: 1, Properties: 10, Environments: 1000})
	defer srv.Close()
	props, envs := srv.Properties(), srv.Environments()
	if len(props) != 10 || len(envs) != 1000 {
		t.Fatalf("%d properties, %d environments", len(props), len(envs))
	}
	ids := map[string]bool{}
	names := map[string]bool{}
	perProp := map[string]int{}
	for _, e := range envs {
		if ids[e.ID] || names[e.PropertyID+"/"+e.Name] {
			t.Fatalf("environment %s %q repeats an ID or a name in its property", e.ID, e.Name)
		}
		ids[e.ID], names[e.PropertyID+"/"+e.Name] = true, true
		perProp[e.PropertyID]++
	}
	for _, p := range props {
		if perProp[p.ID] != 100 {
			t.Errorf("property %s has %d environments, want 100", p.Slug, perProp[p.ID])
		}
	}
	at := time.Date(2026, 11, 23, 14, 0, 0, 0, time.UTC)
	var totals []float64
	for _, e := range envs {
		rows, err := srv.Rows("edge_usage_by_country", e.ID, "FIVE_MINUTES", at.Add(-time.Hour), at, at)
		if err != nil {
			t.Fatal(err)
		}
		total := 0.0
		for _, r := range rows {
			total += r.Values[0] // requests_edge_total
		}
		if total == 0 {
			t.Errorf("environment %s (%s) has no edge traffic in an hour", e.ID, e.Name)
		}
		totals = append(totals, total)
	}
	slices.Sort(totals)
	sum, top := 0.0, 0.0
	for i, v := range totals {
		sum += v
		if i >= len(totals)-100 {
			top += v
		}
	}
	if share := top / sum; share < 0.3 || share > 0.95 {
		t.Errorf("the biggest 10%% of environments carry %.0f%% of the traffic", 100*share)
	}
	t.Logf("an hour of edge requests: %.3g in total, biggest 10%% of environments %.0f%%, median environment %.3g",
		sum, 100*top/sum, totals[len(totals)/2])
}
