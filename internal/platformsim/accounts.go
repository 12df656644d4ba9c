package platformsim

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
)

const accountsBase = "/accounts/v0.1"

func (s *Server) routeAccounts(r chi.Router) {
	r.Group(func(r chi.Router) {
		r.Use(s.requireScope(ScopeAccounts))
		r.Get(accountsBase+"/organizations/{id}", s.handleOrganization)
		r.Get(accountsBase+"/properties", s.handleProperties)
		r.Get(accountsBase+"/properties/{id}", s.handleProperty)
		r.Get(accountsBase+"/environments", s.handleEnvironments)
		r.Get(accountsBase+"/environments/{id}", s.handleEnvironment)
		r.Delete(accountsBase+"/environments/{id}", s.handleDeleteEnvironment)
	})
}

type link struct {
	Href        string `json:"href"`
	Description string `json:"description"`
	BasePath    string `json:"base_path"`
}

type page struct {
	Type       string          `json:"@type"`
	ID         string          `json:"@id"`
	Links      map[string]link `json:"@links"`
	TotalItems int             `json:"total_items"`
	Items      []any           `json:"items"`
}

func ts(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func (s *Server) orgJSON(o Organization) map[string]any {
	self := accountsBase + "/organizations/" + o.ID
	return map[string]any{
		"@type":                   "Organization",
		"@id":                     self,
		"@links":                  map[string]any{"properties": map[string]string{"href": accountsBase + "/properties?organization_id=" + o.ID}},
		"id":                      o.ID,
		"partner_id":              o.PartnerID,
		"name":                    o.Name,
		"pci_compliance":          "pci",
		"pci_dns_domain_name":     o.PCIDNSDomainName,
		"non_pci_dns_domain_name": o.NonPCIDNSDomainName,
		"created_at":              ts(o.CreatedAt),
		"updated_at":              ts(o.UpdatedAt),
	}
}

func propJSON(p Property) map[string]any {
	return map[string]any{
		"@type": "Property",
		"@id":   accountsBase + "/properties/" + p.ID,
		"@links": map[string]any{
			"organization": map[string]string{"href": accountsBase + "/organizations/" + p.OrganizationID},
			"environments": map[string]string{"href": accountsBase + "/environments?property_id=" + p.ID},
		},
		"id":              p.ID,
		"organization_id": p.OrganizationID,
		"slug":            p.Slug,
		"created_at":      ts(p.CreatedAt),
		"updated_at":      ts(p.UpdatedAt),
	}
}

func envJSON(e Environment) map[string]any {
	return map[string]any{
		"@type":                       "Environment",
		"@id":                         accountsBase + "/environments/" + e.ID,
		"@links":                      map[string]any{"property": map[string]string{"href": accountsBase + "/properties/" + e.PropertyID}},
		"id":                          e.ID,
		"property_id":                 e.PropertyID,
		"legacy_account_number":       e.LegacyAccountNumber,
		"name":                        e.Name,
		"default_domain_name":         e.DefaultDomainName,
		"dns_domain_name":             e.DNSDomainName,
		"can_members_deploy":          e.CanMembersDeploy,
		"only_maintainers_can_deploy": e.OnlyMaintainersCanDeploy,
		"http_request_logging":        e.HTTPRequestLogging,
		"pci_compliance":              e.PCICompliance,
		"created_at":                  ts(e.CreatedAt),
		"updated_at":                  ts(e.UpdatedAt),
	}
}

func notFound(w http.ResponseWriter, kind, id string) {
	writeError(w, http.StatusNotFound, "not_found", "Not Found",
		fmt.Sprintf("No %s with ID %q.", kind, id), detail("id", fmt.Sprintf("unknown %s ID", kind)))
}

func (s *Server) handleOrganization(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	if id != s.w().org.ID {
		notFound(w, "organization", id)
		return
	}
	writeJSON(w, http.StatusOK, s.orgJSON(s.w().org))
}

func (s *Server) handleProperty(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	wd := s.w()
	i, ok := wd.propByID[id]
	if !ok {
		notFound(w, "property", id)
		return
	}
	writeJSON(w, http.StatusOK, propJSON(wd.properties[i]))
}

func (s *Server) handleEnvironment(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	e, ok := s.environment(id)
	if !ok {
		notFound(w, "environment", id)
		return
	}
	writeJSON(w, http.StatusOK, envJSON(e))
}

func (s *Server) handleDeleteEnvironment(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	e, ok := s.RemoveEnvironment(id)
	if !ok {
		notFound(w, "environment", id)
		return
	}
	writeJSON(w, http.StatusOK, envJSON(e))
}

// pagination parses page and page_size (spec 2.1 / 8); it answers 400 itself
// and reports ok=false on bad values.
func pagination(w http.ResponseWriter, r *http.Request) (pg, size int, ok bool) {
	q := r.URL.Query()
	pg, size = 0, limits.DefaultPageSize
	if v := q.Get("page"); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "invalid_parameter", "Bad Request", "page must be an integer ≥ 0.", detail("page", "got "+strconv.Quote(v)))
			return 0, 0, false
		}
		pg = int(n)
	}
	if v := q.Get("page_size"); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < int64(limits.MinPageSize) || n > int64(limits.MaxPageSize) {
			writeError(w, http.StatusBadRequest, "invalid_parameter", "Bad Request",
				fmt.Sprintf("page_size must be an integer from %d to %d.", limits.MinPageSize, limits.MaxPageSize), detail("page_size", "got "+strconv.Quote(v)))
			return 0, 0, false
		}
		size = int(n)
	}
	return pg, size, true
}

func baseURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// handleList serves a page (spec 2.1) of the list at path of the children
// of the parent (a kind of object) that the required query parameter param
// names: items returns the list for the parent's ID, or false when no
// parent has it (404).
func handleList(w http.ResponseWriter, r *http.Request, path, param, parent string, items func(id string) ([]any, bool)) {
	pg, size, ok := pagination(w, r)
	if !ok {
		return
	}
	id := r.URL.Query().Get(param)
	if id == "" {
		writeError(w, http.StatusBadRequest, "missing_parameter", "Bad Request", param+" is required.", detail(param, "missing"))
		return
	}
	list, ok := items(id)
	if !ok {
		notFound(w, parent, id)
		return
	}
	writePage(w, r, "PaginatedList", path, param, id, pg, size, list)
}

// writePage writes items[page*size:…] in the paginated envelope.
func writePage(w http.ResponseWriter, r *http.Request, typ, path, keyName, keyValue string, pg, size int, items []any) {
	total := len(items)
	last := 0
	if total > 0 {
		last = (total - 1) / size
	}
	href := func(p int) string {
		v := url.Values{}
		v.Set(keyName, keyValue)
		v.Set("page", strconv.Itoa(p))
		v.Set("page_size", strconv.Itoa(size))
		return path + "?" + v.Encode()
	}
	base := baseURL(r)
	links := map[string]link{
		"first": {Href: href(0), Description: "First page", BasePath: base},
		"last":  {Href: href(last), Description: "Last page", BasePath: base},
	}
	if pg < last {
		links["next"] = link{Href: href(pg + 1), Description: "Next page", BasePath: base}
	}
	if pg > 0 {
		prev := pg - 1
		if prev > last {
			prev = last
		}
		links["previous"] = link{Href: href(prev), Description: "Previous page", BasePath: base}
	}
	lo := pg * size
	if lo > total {
		lo = total
	}
	hi := lo + size
	if hi > total {
		hi = total
	}
	writeJSON(w, http.StatusOK, page{
		Type:       typ,
		ID:         href(pg),
		Links:      links,
		TotalItems: total,
		Items:      append([]any{}, items[lo:hi]...),
	})
}

func (s *Server) handleProperties(w http.ResponseWriter, r *http.Request) {
	handleList(w, r, accountsBase+"/properties", "organization_id", "organization", func(org string) ([]any, bool) {
		if org != s.w().org.ID {
			return nil, false
		}
		var items []any
		for _, p := range s.w().properties {
			items = append(items, propJSON(p))
		}
		return items, true
	})
}

func (s *Server) handleEnvironments(w http.ResponseWriter, r *http.Request) {
	handleList(w, r, accountsBase+"/environments", "property_id", "property", func(prop string) ([]any, bool) {
		wd := s.w()
		if _, ok := wd.propByID[prop]; !ok {
			return nil, false
		}
		var items []any
		for _, e := range wd.envs {
			if e.PropertyID == prop {
				items = append(items, envJSON(e))
			}
		}
		return items, true
	})
}
