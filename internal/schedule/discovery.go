package schedule

import (
	"context"
	"fmt"
	"slices"

	"github.com/edgepipe/edgepipe/internal/platform"
)

// AccountsLister is what Discovery needs from the Accounts API: every
// property of an organization and every environment of a property (all
// pages walked) and, to filter environments given by ID, one environment
// and one property. *platform.Accounts implements it.
type AccountsLister interface {
	Properties(ctx context.Context, organizationID string) ([]platform.Property, error)
	Environments(ctx context.Context, propertyID string) ([]platform.Environment, error)
	Environment(ctx context.Context, id string) (*platform.Environment, error)
	Property(ctx context.Context, id string) (*platform.Property, error)
}

// EnvironmentFilter chooses which environments are served among those
// discovered, by what the Accounts API says of them.
type EnvironmentFilter interface {
	// Keep reports whether env, of property prop, is served.
	Keep(env platform.Environment, prop platform.Property) bool
}

// Catalog is told what each successful discovery learnt of the environments
// served (the exporter's inventory names them with it).
type Catalog interface {
	// RecordDiscovery receives the environments served (sorted) and what
	// the Accounts API said of those it listed or looked up, with the
	// properties they belong to by ID. Environments given by ID without a
	// Filter are not looked up, so they are served but not described. It
	// must not block.
	RecordDiscovery(served []string, described []platform.Environment, properties map[string]platform.Property)
}

// Discovery is the EnvironmentSource of the exporter: the static environment
// IDs plus every environment of every property of the organizations, keeping
// those the Filter keeps and of those only the Shard's. Each call lists the
// organizations anew.
type Discovery struct {
	// Accounts is required when Organizations is not empty, or when Filter
	// is set and Static is not empty (a static environment is then looked
	// up for its name and property).
	Accounts      AccountsLister
	Organizations []string
	Static        []string
	Shard         Shard
	// Filter, when set, chooses the environments served.
	Filter EnvironmentFilter
	// Catalog, when set, is told the outcome of every successful call.
	Catalog Catalog
}

// Environments returns the sorted, de-duplicated environment IDs this
// instance serves. It fails when any organization cannot be listed
// completely (or, with a Filter, a static environment cannot be looked up),
// so a partial listing never makes environments vanish.
func (d *Discovery) Environments(ctx context.Context) ([]string, error) {
	var all []string
	props := make(map[string]platform.Property)
	described := make(map[string]platform.Environment)
	keep := func(env platform.Environment) {
		if d.Filter == nil || d.Filter.Keep(env, props[env.PropertyID]) {
			all = append(all, env.ID)
			described[env.ID] = env
		}
	}
	for _, id := range d.Static {
		if d.Filter == nil {
			all = append(all, id)
			continue
		}
		if id == "" || !d.Shard.Owns(id) {
			continue // not served whatever it is: spare the lookup
		}
		if d.Accounts == nil {
			return nil, fmt.Errorf("look up environment %s: no accounts client", id)
		}
		env, err := d.Accounts.Environment(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("look up environment %s to filter it: %w", id, err)
		}
		if _, ok := props[env.PropertyID]; !ok && env.PropertyID != "" {
			p, err := d.Accounts.Property(ctx, env.PropertyID)
			if err != nil {
				return nil, fmt.Errorf("look up property %s of environment %s to filter it: %w", env.PropertyID, id, err)
			}
			props[p.ID] = *p
		}
		env.ID = id
		keep(*env)
	}
	for _, org := range d.Organizations {
		if d.Accounts == nil {
			return nil, fmt.Errorf("discover organization %s: no accounts client", org)
		}
		ps, err := d.Accounts.Properties(ctx, org)
		if err != nil {
			return nil, fmt.Errorf("list properties of organization %s: %w", org, err)
		}
		for _, p := range ps {
			props[p.ID] = p
			envs, err := d.Accounts.Environments(ctx, p.ID)
			if err != nil {
				return nil, fmt.Errorf("list environments of property %s (organization %s): %w", p.ID, org, err)
			}
			for _, env := range envs {
				if env.PropertyID == "" {
					env.PropertyID = p.ID
				}
				keep(env)
			}
		}
	}
	out := all[:0]
	for _, e := range all {
		if e != "" && d.Shard.Owns(e) {
			out = append(out, e)
		}
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if d.Catalog != nil {
		var envs []platform.Environment
		for _, id := range out {
			if env, ok := described[id]; ok {
				envs = append(envs, env)
			}
		}
		d.Catalog.RecordDiscovery(slices.Clone(out), envs, props)
	}
	return out, nil
}
