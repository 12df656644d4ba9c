package inventory

import (
	"context"
	"slices"
	"time"

	"github.com/edgepipe/edgepipe/internal/platform"
)

// Environment is an environment served, as the accounts API names it.
type Environment struct {
	ID string
	// Name is the environment's name; "" while the platform has not named
	// it (an environment given by ID whose lookup failed).
	Name string
	// PropertyID and Property (the property's slug) say whose it is, and
	// OrganizationID whose property.
	PropertyID     string
	Property       string
	OrganizationID string
}

// names is the cache of the environments served and their names.
type names struct {
	discovered bool
	served     []string               // sorted, from the last discovery
	byID       map[string]Environment // named environments served
	described  map[string]bool        // named by the last discovery
	// lookupFailed is set when the last lookups could not name every
	// environment discovery did not describe.
	lookupFailed  bool
	refusedLogged bool
	// published is what the Publisher got last, and when.
	published   []Environment
	publishedAt time.Time
}

func newNames() names {
	return names{byID: map[string]Environment{}, described: map[string]bool{}}
}

// complete reports whether every environment served has a name.
func (n *names) complete() bool {
	if !n.discovered || n.lookupFailed {
		return false
	}
	for _, id := range n.served {
		if _, ok := n.byID[id]; !ok {
			return false
		}
	}
	return true
}

// RecordDiscovery takes the outcome of a successful discovery (it
// implements schedule.Catalog): the environments served and the names and
// properties discovery knows. A name looked up earlier is kept for an
// environment discovery served without describing; the certificates of
// environments no longer served are forgotten. The first call starts Run's
// first pass.
func (inv *Inventory) RecordDiscovery(served []string, described []platform.Environment, properties map[string]platform.Property) {
	inv.mu.Lock()
	n := &inv.names
	byID := make(map[string]Environment, len(served))
	desc := make(map[string]bool, len(described))
	for _, e := range described {
		p := properties[e.PropertyID]
		byID[e.ID] = Environment{ID: e.ID, Name: e.Name, PropertyID: e.PropertyID, Property: p.Slug, OrganizationID: p.OrganizationID}
		desc[e.ID] = true
	}
	for _, id := range served {
		if old, ok := n.byID[id]; ok && !desc[id] {
			byID[id] = old
		}
	}
	n.served = slices.Sorted(slices.Values(served))
	n.served = slices.Compact(n.served)
	n.byID, n.described, n.discovered = byID, desc, true
	inv.certs.retain(n.served)
	inv.mu.Unlock()
	inv.publishEnvironments(inv.cfg.Clock.Now(), false)
	inv.once.Do(func() { close(inv.discovered) })
}

// undescribed returns the environments served that the last discovery did
// not describe.
func (inv *Inventory) undescribed() []string {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	var out []string
	for _, id := range inv.names.served {
		if !inv.names.described[id] {
			out = append(out, id)
		}
	}
	return out
}

// nameUndescribed looks up, one request every RequestGap from start, the
// environments served that discovery did not describe, and their
// properties. It returns when the next request of the pass is due.
func (inv *Inventory) nameUndescribed(ctx context.Context, start time.Time) time.Time {
	ids := inv.undescribed()
	due := start
	if len(ids) == 0 || inv.cfg.Accounts == nil {
		inv.mu.Lock()
		inv.names.lookupFailed = len(ids) > 0
		inv.mu.Unlock()
		return due
	}
	props := map[string]*platform.Property{}
	failed := 0
	var firstErr error
	for _, id := range ids {
		if !inv.wait(ctx, due) {
			return due
		}
		due = due.Add(inv.cfg.RequestGap)
		env, err := inv.cfg.Accounts.Environment(ctx, id)
		var prop *platform.Property
		if err == nil {
			if prop = props[env.PropertyID]; prop == nil && env.PropertyID != "" {
				if !inv.wait(ctx, due) {
					return due
				}
				due = due.Add(inv.cfg.RequestGap)
				prop, err = inv.cfg.Accounts.Property(ctx, env.PropertyID)
				props[env.PropertyID] = prop
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return due
			}
			failed++
			if firstErr == nil {
				firstErr = err
			}
			if platform.IsRefused(err) {
				failed = len(ids)
				break
			}
			continue
		}
		inv.storeName(id, env, prop)
	}
	inv.namesLooked(len(ids), failed, firstErr)
	return due
}

// storeName records a looked-up environment, unless discovery has named
// it meanwhile or no longer serves it.
func (inv *Inventory) storeName(id string, env *platform.Environment, prop *platform.Property) {
	e := Environment{ID: id, Name: env.Name, PropertyID: env.PropertyID}
	if prop != nil {
		e.Property, e.OrganizationID = prop.Slug, prop.OrganizationID
	}
	inv.mu.Lock()
	n := &inv.names
	if _, ok := slices.BinarySearch(n.served, id); ok && !n.described[id] && e.Name != "" {
		n.byID[id] = e
	}
	inv.mu.Unlock()
	inv.publishEnvironments(inv.cfg.Clock.Now(), false)
}

// namesLooked records the outcome of a round of lookups and logs a
// failure: a refusal once until lookups work again, other failures once
// per round.
func (inv *Inventory) namesLooked(asked, failed int, err error) {
	inv.mu.Lock()
	n := &inv.names
	n.lookupFailed = failed > 0
	refused := platform.IsRefused(err)
	logRefusal := refused && !n.refusedLogged
	n.refusedLogged = refused
	inv.mu.Unlock()
	switch {
	case failed == 0:
	case logRefusal:
		inv.log.Warn("environment names unavailable: the platform refuses this API client the accounts service (it needs scope "+
			platform.ScopeAccounts+" to look up the environments given by ID); "+inv.cfg.Prefix+"_environment_info shows their IDs as names",
			"environments", asked, "err", err)
	case !refused:
		inv.log.Warn("could not look up the names of environments given by ID; they keep their last name, or their ID",
			"failed", failed, "environments", asked, "err", err)
	}
}

// namedServed returns the named environments served, by ID.
func (n *names) namedServed() []Environment {
	out := make([]Environment, 0, len(n.served))
	for _, id := range n.served {
		if e, ok := n.byID[id]; ok {
			out = append(out, e)
		}
	}
	return out
}

// publishEnvironments hands the named environments served to the
// Publisher when they changed since it last got them, or, when periodic,
// when that is at least half an Interval ago (so the tables' seen_at stays
// fresh).
func (inv *Inventory) publishEnvironments(at time.Time, periodic bool) {
	if inv.cfg.Publisher == nil {
		return
	}
	// Held across the call, so that the Publisher gets the lists in the
	// order they were made.
	inv.pubMu.Lock()
	defer inv.pubMu.Unlock()
	inv.mu.Lock()
	n := &inv.names
	envs := n.namedServed()
	fresh := slices.Equal(envs, n.published) && (!periodic || at.Sub(n.publishedAt) < inv.cfg.Interval/2)
	send := !fresh && len(envs) > 0
	if send {
		n.published, n.publishedAt = envs, at
	}
	inv.mu.Unlock()
	if send {
		inv.cfg.Publisher.PublishEnvironments(at, envs)
	}
}
