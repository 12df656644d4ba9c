package inventory

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/edgepipe/edgepipe/internal/platform"
)

// Certificate is a TLS certificate of an environment (spec 2.6, without the
// PEM bodies).
type Certificate struct {
	ID               string
	EnvironmentID    string
	CommonName       string
	AlternativeNames []string
	Serial           string
	Status           string
	// ActivationError is why the platform could not activate it ("" when
	// it could).
	ActivationError string
	Generated       bool
	// Expiration is when it expires; zero when the platform did not say.
	Expiration time.Time
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

func certificateOf(c platform.TLSCertificate) Certificate {
	return Certificate{
		ID:               c.ID,
		EnvironmentID:    c.EnvironmentID,
		CommonName:       c.CommonName,
		AlternativeNames: slices.Clone(c.AlternativeNames),
		Serial:           c.Serial,
		Status:           c.Status,
		ActivationError:  c.ActivationError,
		Generated:        c.Generated,
		Expiration:       c.Expiration.UTC(),
		CreatedAt:        c.CreatedAt.UTC(),
		UpdatedAt:        c.UpdatedAt.UTC(),
	}
}

// certificates is the cache of every environment's certificates: each
// environment's last successful listing.
type certificates struct {
	enabled bool
	byEnv   map[string][]Certificate
	// passes counts the passes over every environment that ended;
	// lastPassOK says whether the last one listed every environment.
	passes     int
	lastPassOK bool
	// lastSuccess is when the last pass that listed every environment
	// ended.
	lastSuccess time.Time
	// refused is set while the platform refuses the config service.
	refused bool
}

func newCertificates(enabled bool) certificates {
	return certificates{enabled: enabled, byEnv: map[string][]Certificate{}}
}

// retain forgets the certificates of environments not in served (sorted).
func (c *certificates) retain(served []string) {
	for env := range c.byEnv {
		if _, ok := slices.BinarySearch(served, env); !ok {
			delete(c.byEnv, env)
		}
	}
}

// refreshCertificates lists the certificates of every environment served,
// one environment at a time: the first request at due, then one every
// gap (an environment of several pages counts one gap per page). An
// environment that cannot be listed keeps its last certificates; a refusal
// (no app.config) ends the pass at once.
func (inv *Inventory) refreshCertificates(ctx context.Context, start, due time.Time, first bool) {
	envs := inv.servedIDs()
	gap := inv.gap(len(envs), first)
	listed, failed := 0, 0
	var firstErr error
	for _, env := range envs {
		if !inv.wait(ctx, due) {
			return
		}
		if !inv.serving(env) {
			continue // gone since the pass began
		}
		certs, err := inv.cfg.Certificates.TLSCertificates(ctx, env)
		pages := max(1, (len(certs)+platform.PageSize-1)/platform.PageSize)
		due = due.Add(time.Duration(pages) * gap)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if platform.IsRefused(err) {
				inv.certificatesRefused(err)
				return
			}
			failed++
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		inv.storeCertificates(env, certs)
		listed++
	}
	inv.certificatePassDone(start, listed, failed, firstErr)
}

// servedIDs returns the environments served.
func (inv *Inventory) servedIDs() []string {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return slices.Clone(inv.names.served)
}

// serving reports whether env is still served.
func (inv *Inventory) serving(env string) bool {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	_, ok := slices.BinarySearch(inv.names.served, env)
	return ok
}

// storeCertificates replaces env's certificates with a listing and hands
// them, and those no longer listed, to the Publisher.
func (inv *Inventory) storeCertificates(env string, listed []platform.TLSCertificate) {
	certs := make([]Certificate, 0, len(listed))
	for _, c := range listed {
		c.EnvironmentID = env
		certs = append(certs, certificateOf(c))
	}
	slices.SortFunc(certs, func(a, b Certificate) int { return strings.Compare(a.ID, b.ID) })
	at := inv.cfg.Clock.Now()
	inv.mu.Lock()
	c := &inv.certs
	if _, ok := slices.BinarySearch(inv.names.served, env); !ok {
		inv.mu.Unlock()
		return
	}
	var gone []Certificate
	for _, old := range c.byEnv[env] {
		if !slices.ContainsFunc(certs, func(n Certificate) bool { return n.ID == old.ID }) {
			gone = append(gone, old)
		}
	}
	c.byEnv[env] = certs
	wasRefused := c.refused
	c.refused = false
	inv.mu.Unlock()
	if wasRefused {
		inv.log.Info("the platform lists TLS certificates again: their metrics are exported")
	}
	if inv.cfg.Publisher != nil {
		inv.cfg.Publisher.PublishCertificates(at, env, certs, gone)
	}
}

// certificatesRefused records a refusal, logging it once until the
// certificates can be listed again.
func (inv *Inventory) certificatesRefused(err error) {
	inv.mu.Lock()
	c := &inv.certs
	wasRefused := c.refused
	c.refused, c.lastPassOK = true, false
	c.passes++
	inv.mu.Unlock()
	switch {
	case wasRefused:
	case platform.IsClientRefused(err):
		// The whole exporter fails then, and says so elsewhere.
		inv.log.Warn("TLS certificates are not exported: the platform refuses this API client's credentials", "err", err)
	default:
		inv.log.Warn("TLS certificates are not exported: the platform refuses this API client the config service (it needs scope "+
			platform.ScopeConfig+"). Grant the scope to the API client, or set --inventory.interval=0 to stop asking; everything else is exported as before. "+
			"edgepipe_inventory_up{kind=\"tls_certificates\"} is 0 meanwhile; the exporter asks again every --inventory.interval",
			"err", err)
	}
}

// certificatePassDone records the end of a pass that began at start.
func (inv *Inventory) certificatePassDone(start time.Time, listed, failed int, err error) {
	inv.mu.Lock()
	c := &inv.certs
	c.passes++
	c.lastPassOK = failed == 0
	if failed == 0 {
		c.lastSuccess = inv.cfg.Clock.Now()
	}
	inv.mu.Unlock()
	if failed > 0 {
		inv.log.Warn("could not list the TLS certificates of some environments; they keep their last listing",
			"failed", failed, "environments", listed+failed, "err", fmt.Errorf("first failure: %w", err))
		return
	}
	inv.log.Debug("TLS certificates listed", "environments", listed, "took", inv.cfg.Clock.Now().Sub(start))
}
