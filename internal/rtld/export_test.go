package rtld

import (
	"context"
	"fmt"
)

// ReconcileEnvironment checks one environment's profile once: one step of
// Reconcile, for the tests that race two registrars on one environment.
func (r *Registrar) ReconcileEnvironment(ctx context.Context, environmentID string) (RegistrationResult, error) {
	fields := r.cfg.Fields
	if len(fields) == 0 {
		var err error
		if fields, err = r.listFields(ctx); err != nil {
			r.observe(environmentID, RegistrationFailed)
			return RegistrationFailed, fmt.Errorf("rtld registrar: %w", err)
		}
	}
	res, err := r.reconcile(ctx, environmentID, fields)
	r.observe(environmentID, res)
	if err != nil {
		return res, fmt.Errorf("rtld registrar: environment %s: %w", environmentID, err)
	}
	return res, nil
}
