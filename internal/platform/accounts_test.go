package platform

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"testing"
)

// listHandler serves n items at path in pages, with the envelope parts
// selected by style: "total" (total_items only), "links" (@links only),
// "both", or "bare" (items only). It records the page sizes asked for.
func listHandler(_ *testing.T, path string, n int, style string, sizes *[]int) func(http.ResponseWriter, *http.Request, int) {
	return func(w http.ResponseWriter, r *http.Request, _ int) {
		if r.URL.Path != path {
			writeJSON(w, http.StatusNotFound, map[string]any{"title": "Not Found"})
			return
		}
		if r.URL.Query().Get("organization_id") == "" && r.URL.Query().Get("property_id") == "" {
			writeJSON(w, http.StatusBadRequest, map[string]any{"description": "parent ID required"})
			return
		}
		page, _ := strconv.Atoi(r.URL.Query().Get("page"))
		size, _ := strconv.Atoi(r.URL.Query().Get("page_size"))
		*sizes = append(*sizes, size)
		if size < 1 || size > 100 {
			writeJSON(w, http.StatusBadRequest, map[string]any{"description": "page_size out of range"})
			return
		}
		var items []map[string]any
		for i := page * size; i < min((page+1)*size, n); i++ {
			items = append(items, map[string]any{"id": fmt.Sprintf("id-%03d", i), "slug": fmt.Sprintf("s%d", i), "name": fmt.Sprintf("env%d", i)})
		}
		body := map[string]any{"@type": "Collection", "items": items}
		if style == "total" || style == "both" {
			body["total_items"] = n
		}
		if style == "links" || style == "both" {
			links := map[string]any{"first": map[string]string{"href": path + "?page=0"}}
			if (page+1)*size < n {
				links["next"] = map[string]string{"href": fmt.Sprintf("%s?page=%d", path, page+1)}
			}
			body["@links"] = links
		}
		writeJSON(w, http.StatusOK, body)
	}
}

func TestPropertiesWalksEveryPage(t *testing.T) {
	tests := []struct {
		n         int
		style     string
		wantPages int
	}{
		{250, "both", 3},
		{250, "total", 3},
		{250, "links", 3},
		{250, "bare", 3},
		{200, "bare", 3}, // a full last page needs one more, empty, page
		{200, "total", 2},
		{100, "links", 1},
		{0, "both", 1},
		{7, "total", 1},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d_%s", tt.n, tt.style), func(t *testing.T) {
			var sizes []int
			f := newFakeAPI(t, listHandler(t, "/accounts/v0.1/properties", tt.n, tt.style, &sizes))
			c := f.client(f.config())
			ps, err := c.Accounts().Properties(ctxT(t), "org-1")
			if err != nil {
				t.Fatal(err)
			}
			if len(ps) != tt.n {
				t.Fatalf("got %d properties, want %d", len(ps), tt.n)
			}
			for i, p := range ps {
				if p.ID != fmt.Sprintf("id-%03d", i) {
					t.Fatalf("property %d = %q: pages out of order or repeated", i, p.ID)
				}
			}
			if len(sizes) != tt.wantPages {
				t.Errorf("fetched %d pages, want %d", len(sizes), tt.wantPages)
			}
			for _, s := range sizes {
				if s != PageSize {
					t.Errorf("page_size = %d, want %d", s, PageSize)
				}
			}
		})
	}
}

func TestEnvironmentsPagination(t *testing.T) {
	var sizes []int
	f := newFakeAPI(t, listHandler(t, "/accounts/v0.1/environments", 101, "both", &sizes))
	c := f.client(f.config())
	es, err := c.Accounts().Environments(ctxT(t), "prop-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 101 || es[100].Name != "env100" || len(sizes) != 2 {
		t.Fatalf("got %d environments over %d pages", len(es), len(sizes))
	}
}

func TestListServerIgnoringPage(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
		items := make([]map[string]any, 100)
		for i := range items {
			items[i] = map[string]any{"id": strconv.Itoa(i)}
		}
		writeJSON(w, http.StatusOK, map[string]any{"items": items, "total_items": 1000})
	})
	c := f.client(f.config())
	_, err := c.Accounts().Properties(ctxT(t), "org-1")
	if err == nil {
		t.Fatal("want an error from a server that returns page 0 for every page")
	}
	if _, api := f.counts(); api != 2 {
		t.Errorf("API calls = %d, want 2", api)
	}
}

func TestGetOne(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		switch r.URL.Path {
		case "/accounts/v0.1/environments/env-1":
			writeJSON(w, http.StatusOK, map[string]any{"id": "env-1", "property_id": "p", "name": "production",
				"http_request_logging": true, "created_at": "2026-01-02T03:04:05Z"})
		case "/accounts/v0.1/organizations/org-1":
			writeJSON(w, http.StatusOK, map[string]any{"id": "org-1", "name": "Acme", "pci_compliance": "pci"})
		default:
			writeJSON(w, http.StatusNotFound, map[string]any{"code": "not_found", "title": "Not Found"})
		}
	})
	c := f.client(f.config())
	ctx := ctxT(t)
	e, err := c.Accounts().Environment(ctx, "env-1")
	if err != nil {
		t.Fatal(err)
	}
	if e.Name != "production" || !e.HTTPRequestLogging || e.CreatedAt.Year() != 2026 {
		t.Errorf("environment = %+v", e)
	}
	o, err := c.Accounts().Organization(ctx, "org-1")
	if err != nil || o.Name != "Acme" || o.PCICompliance != "pci" {
		t.Errorf("organization = %+v, %v", o, err)
	}
	_, err = c.Accounts().Environment(ctx, "missing")
	var apiErr *Error
	if !errors.As(err, &apiErr) || !IsNotFound(err) || apiErr.Code != "not_found" {
		t.Errorf("err = %v, want a 404 *Error", err)
	}
	if _, api := f.counts(); api != 3 {
		t.Errorf("API calls = %d, want 3 (404 not retried)", api)
	}
}
