package platform

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// PageSize is the page size edgepipe asks for when walking lists (the API's
// maximum).
const PageSize = 100

// maxPages stops a list walk that never ends (a server ignoring page).
const maxPages = 10000

// Organization is an organization of the accounts service (spec 2.7).
type Organization struct {
	ID                  string    `json:"id"`
	PartnerID           string    `json:"partner_id,omitempty"`
	Name                string    `json:"name"`
	PCIDNSDomainName    string    `json:"pci_dns_domain_name,omitempty"`
	NonPCIDNSDomainName string    `json:"non_pci_dns_domain_name,omitempty"`
	PCICompliance       string    `json:"pci_compliance,omitempty"`
	CreatedAt           time.Time `json:"created_at"`
	UpdatedAt           time.Time `json:"updated_at"`
}

// Property is a property of an organization (spec 2.7).
type Property struct {
	ID             string    `json:"id"`
	OrganizationID string    `json:"organization_id"`
	Slug           string    `json:"slug"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
}

// Environment is an environment of a property (spec 2.7).
type Environment struct {
	ID                       string    `json:"id"`
	PropertyID               string    `json:"property_id"`
	LegacyAccountNumber      string    `json:"legacy_account_number,omitempty"`
	Name                     string    `json:"name"`
	DefaultDomainName        string    `json:"default_domain_name,omitempty"`
	DNSDomainName            string    `json:"dns_domain_name,omitempty"`
	CanMembersDeploy         bool      `json:"can_members_deploy"`
	OnlyMaintainersCanDeploy bool      `json:"only_maintainers_can_deploy"`
	HTTPRequestLogging       bool      `json:"http_request_logging"`
	PCICompliance            bool      `json:"pci_compliance"`
	CreatedAt                time.Time `json:"created_at"`
	UpdatedAt                time.Time `json:"updated_at"`
}

// Accounts is the accounts service: organizations, properties and
// environments. Its embedded Service serves calls not wrapped here.
type Accounts struct {
	*Service
}

// Organization gets one organization.
func (a *Accounts) Organization(ctx context.Context, id string) (*Organization, error) {
	var o Organization
	if err := a.Do(ctx, http.MethodGet, "/organizations/"+url.PathEscape(id), nil, nil, &o); err != nil {
		return nil, err
	}
	return &o, nil
}

// Property gets one property.
func (a *Accounts) Property(ctx context.Context, id string) (*Property, error) {
	var p Property
	if err := a.Do(ctx, http.MethodGet, "/properties/"+url.PathEscape(id), nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Environment gets one environment.
func (a *Accounts) Environment(ctx context.Context, id string) (*Environment, error) {
	var e Environment
	if err := a.Do(ctx, http.MethodGet, "/environments/"+url.PathEscape(id), nil, nil, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// Properties lists every property of an organization, walking all pages.
func (a *Accounts) Properties(ctx context.Context, organizationID string) ([]Property, error) {
	ps, err := listAll[Property](ctx, a.Service, "/properties", url.Values{"organization_id": {organizationID}},
		func(p Property) string { return p.ID })
	if err != nil {
		return nil, fmt.Errorf("properties of organization %s: %w", organizationID, err)
	}
	return ps, nil
}

// Environments lists every environment of a property, walking all pages.
func (a *Accounts) Environments(ctx context.Context, propertyID string) ([]Environment, error) {
	es, err := listAll[Environment](ctx, a.Service, "/environments", url.Values{"property_id": {propertyID}},
		func(e Environment) string { return e.ID })
	if err != nil {
		return nil, fmt.Errorf("environments of property %s: %w", propertyID, err)
	}
	return es, nil
}

// OrganizationEnvironments lists every environment of every property of an
// organization.
func (a *Accounts) OrganizationEnvironments(ctx context.Context, organizationID string) ([]Environment, error) {
	props, err := a.Properties(ctx, organizationID)
	if err != nil {
		return nil, err
	}
	var out []Environment
	for _, p := range props {
		es, err := a.Environments(ctx, p.ID)
		if err != nil {
			return nil, err
		}
		out = append(out, es...)
	}
	return out, nil
}

// page is the paginated-list envelope of spec 2.1.
type page[T any] struct {
	TotalItems *int `json:"total_items"`
	Items      []T  `json:"items"`
	Links      *struct {
		Next *struct {
			Href string `json:"href"`
		} `json:"next"`
	} `json:"@links"`
}

// listAll walks a paginated list from page 0 with PageSize items per page. It
// stops at an empty page, once total_items items arrived, when the links
// name no next page, or on a short page; an item seen twice (a server that
// ignores page) is dropped, and a page of nothing but such items is an error
// rather than an endless loop.
func listAll[T any](ctx context.Context, s *Service, path string, query url.Values, id func(T) string) ([]T, error) {
	var out []T
	seen := map[string]bool{}
	for n := 0; n < maxPages; n++ {
		q := url.Values{}
		for k, v := range query {
			q[k] = v
		}
		q.Set("page", strconv.Itoa(n))
		q.Set("page_size", strconv.Itoa(PageSize))
		var p page[T]
		if err := s.Do(ctx, http.MethodGet, path, q, nil, &p); err != nil {
			return nil, err
		}
		if len(p.Items) == 0 {
			return out, nil
		}
		fresh := 0
		for _, it := range p.Items {
			k := id(it)
			if seen[k] {
				// The list shifted under us (an item was added
				// between two pages): keep one copy.
				continue
			}
			seen[k] = true
			fresh++
			out = append(out, it)
		}
		if fresh == 0 {
			return nil, fmt.Errorf("page %d repeats earlier items only: the server does not paginate as expected", n)
		}
		switch {
		case p.TotalItems != nil:
			if len(out) >= *p.TotalItems {
				return out, nil
			}
		case p.Links != nil:
			if p.Links.Next == nil || p.Links.Next.Href == "" {
				return out, nil
			}
		default:
			if len(p.Items) < PageSize {
				return out, nil
			}
		}
	}
	return nil, fmt.Errorf("more than %d pages", maxPages)
}
