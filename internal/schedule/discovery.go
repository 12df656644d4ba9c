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
	r := discoveryRun{
		d:         d,
		props:     make(map[string]platform.Property),
		described: make(map[string]platform.Environment),
	}
	for _, id := range d.Static {
		if err := r.addStatic(ctx, id); err != nil {
			return nil, err
		}
	}
	for _, org := range d.Organizations {
		if err := r.addOrganization(ctx, org); err != nil {
			return nil, err
		}
	}
	out := r.served()
	if d.Catalog != nil {
		d.Catalog.RecordDiscovery(slices.Clone(out), r.describe(out), r.props)
	}
	return out, nil
}

// discoveryRun is what one call of Discovery.Environments has learnt so far.
type discoveryRun struct {
	d *Discovery
	// ids are the environments kept, in no order, possibly repeated and
	// not yet sharded.
	ids []string
	// props are the properties listed or looked up, by ID.
	props map[string]platform.Property
	// described are the environments kept that the Accounts API
	// described, by ID (the last description wins).
	described map[string]platform.Environment
}

// keep adds env when the Filter keeps it (the Filter sees its property as
// far as it is known).
func (r *discoveryRun) keep(env platform.Environment) {
	if r.d.Filter == nil || r.d.Filter.Keep(env, r.props[env.PropertyID]) {
		r.ids = append(r.ids, env.ID)
		r.described[env.ID] = env
	}
}

// addStatic adds the static environment id: as it is without a Filter,
// else looked up (with its property) for the Filter to judge, unless the
// Shard does not own it anyway.
func (r *discoveryRun) addStatic(ctx context.Context, id string) error {
	d := r.d
	if d.Filter == nil {
		r.ids = append(r.ids, id)
		return nil
	}
	if id == "" || !d.Shard.Owns(id) {
		return nil // not served whatever it is: spare the lookup
	}
	if d.Accounts == nil {
		return fmt.Errorf("look up environment %s: no accounts client", id)
	}
	env, err := d.Accounts.Environment(ctx, id)
	if err != nil {
		return fmt.Errorf("look up environment %s to filter it: %w", id, err)
	}
	if err := r.lookUpProperty(ctx, env.PropertyID, id); err != nil {
		return err
	}
	env.ID = id
	r.keep(*env)
	return nil
}

// lookUpProperty adds the property id of the static environment envID to
// props, unless it is known already or empty.
func (r *discoveryRun) lookUpProperty(ctx context.Context, id, envID string) error {
	if _, ok := r.props[id]; ok || id == "" {
		return nil
	}
	p, err := r.d.Accounts.Property(ctx, id)
	if err != nil {
		return fmt.Errorf("look up property %s of environment %s to filter it: %w", id, envID, err)
	}
	r.props[p.ID] = *p
	return nil
}

// addOrganization adds every environment of every property of org.
func (r *discoveryRun) addOrganization(ctx context.Context, org string) error {
	if r.d.Accounts == nil {
		return fmt.Errorf("discover organization %s: no accounts client", org)
	}
	ps, err := r.d.Accounts.Properties(ctx, org)
	if err != nil {
		return fmt.Errorf("list properties of organization %s: %w", org, err)
	}
	for _, p := range ps {
		if err := r.addProperty(ctx, org, p); err != nil {
			return err
		}
	}
	return nil
}

// addProperty adds property p of organization org and every environment
// of it.
func (r *discoveryRun) addProperty(ctx context.Context, org string, p platform.Property) error {
	r.props[p.ID] = p
	envs, err := r.d.Accounts.Environments(ctx, p.ID)
	if err != nil {
		return fmt.Errorf("list environments of property %s (organization %s): %w", p.ID, org, err)
	}
	for _, env := range envs {
		if env.PropertyID == "" {
			env.PropertyID = p.ID
		}
		r.keep(env)
	}
	return nil
}

// served returns the environments kept that the Shard owns, sorted and
// de-duplicated.
func (r *discoveryRun) served() []string {
	out := r.ids[:0]
	for _, e := range r.ids {
		if e != "" && r.d.Shard.Owns(e) {
			out = append(out, e)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// describe returns what the Accounts API said of the environments ids, of
// those it described.
func (r *discoveryRun) describe(ids []string) []platform.Environment {
	var envs []platform.Environment
	for _, id := range ids {
		if env, ok := r.described[id]; ok {
			envs = append(envs, env)
		}
	}
	return envs
}
