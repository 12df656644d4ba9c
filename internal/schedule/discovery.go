package schedule

import (
	"context"
	"fmt"
	"slices"
)

// AccountsLister is what Discovery needs from the Accounts API: the IDs of
// every property of an organization and of every environment of a property,
// all pages walked.
type AccountsLister interface {
	PropertyIDs(ctx context.Context, organizationID string) ([]string, error)
	EnvironmentIDs(ctx context.Context, propertyID string) ([]string, error)
}

// Discovery is the EnvironmentSource of the exporter: the static environment
// IDs plus every environment of every property of the organizations, keeping
// only those of the Shard. Each call lists the organizations anew.
type Discovery struct {
	// Accounts is required when Organizations is not empty.
	Accounts      AccountsLister
	Organizations []string
	Static        []string
	Shard         Shard
}

// Environments returns the sorted, de-duplicated environment IDs this
// instance serves. It fails when any organization cannot be listed
// completely, so a partial listing never makes environments vanish.
func (d *Discovery) Environments(ctx context.Context) ([]string, error) {
	var all []string
	all = append(all, d.Static...)
	for _, org := range d.Organizations {
		if d.Accounts == nil {
			return nil, fmt.Errorf("discover organization %s: no accounts client", org)
		}
		props, err := d.Accounts.PropertyIDs(ctx, org)
		if err != nil {
			return nil, fmt.Errorf("list properties of organization %s: %w", org, err)
		}
		for _, p := range props {
			envs, err := d.Accounts.EnvironmentIDs(ctx, p)
			if err != nil {
				return nil, fmt.Errorf("list environments of property %s (organization %s): %w", p, org, err)
			}
			all = append(all, envs...)
		}
	}
	out := all[:0]
	for _, e := range all {
		if e != "" && d.Shard.Owns(e) {
			out = append(out, e)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
